#!/usr/bin/env bash
# Fill a wheelhouse with every wheel of requirements.lock and requirements-build.lock for the
# interpreter of the base image $1, each checked against its hash; print the wheelhouse's path.
# The host's pip downloads (the build itself runs without network); the interpreter's version and
# platform are read from the base image, so that a base of another Python gets its own wheels.
set -euo pipefail
base=$1
pip=${PIP:-pip}
cd "$(dirname "$0")/.."
. image/docker.sh
probe='
import os, platform, sys
libc, _, version = os.confstr("CS_GNU_LIBC_VERSION").partition(" ")
assert libc == "glibc", "a glibc base is needed"
major, minor = (int(part) for part in version.split(".")[:2])
arch = platform.machine()
platforms = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
print(f"{sys.version_info[0]}.{sys.version_info[1]}", " ".join(platforms))
'
read -r version platforms < <("$DOCKER" run --rm --network none --entrypoint python3 "$base" -c "$probe")
key=cp${version/./}-${platforms%% *}
dest=.wheelhouse/$key
mkdir -p "$dest"
args=()
for p in $platforms; do args+=(--platform "$p"); done
fetch() {  # fetch LOCK [PIP_OPTION...]
  "$pip" download --quiet --disable-pip-version-check --require-hashes --no-deps \
    --only-binary=:all: --python-version "$version" --implementation cp \
    "${args[@]}" --dest "$dest" -r "$1" "${@:2}"
}
# A wheelhouse that already holds every locked wheel is used as it is, without the index.
for lock in requirements.lock requirements-build.lock; do
  fetch "$lock" --no-index --find-links "$dest" >/dev/null 2>&1 || fetch "$lock" >&2
done
echo "$dest"
