#!/usr/bin/env bash
# Build the image $2 from the repository on the base image $1, with no network inside the build.
# Its OCI labels say what it was built from: the project's version, the commit (with `-dirty`
# when the tree differs from it), the source repository, and the commit's time.
set -euo pipefail
base=$1 tag=$2
cd "$(dirname "$0")/.."
. image/docker.sh
wheelhouse=$(bash image/wheelhouse.sh "$base")
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || revision=$revision-dirty
read -r version source < <(python3 -c '
import tomllib, hooks
print(hooks.__version__, tomllib.load(open("pyproject.toml", "rb"))["project"]["urls"]["Source"])')
"$DOCKER" build --network none --build-arg PYTHON_IMAGE="$base" \
  --build-arg WHEELS="$(basename "$wheelhouse")" --build-arg SOURCE_DATE_EPOCH="$epoch" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" --build-arg SOURCE="$source" \
  --build-arg CREATED="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)" --tag "$tag" .
