#!/usr/bin/env bash
# A minimal Debian base for the image, for hosts that reach Debian's archive but no container
# registry: python3, python3-venv and ca-certificates, from the host's own apt sources (the same
# mirror, proxy settings aside), imported as the image $1. Kept when it exists already.
set -euo pipefail
tag=$1
. "$(dirname "$0")/docker.sh"
if "$DOCKER" image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag exists"
  exit 0
fi
. /etc/os-release
sources=()
for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -s "$file" ] && sources+=("$file")
done
[ "${#sources[@]}" -gt 0 ] || { echo "no apt sources on this host" >&2; exit 1; }
tarball=$(mktemp --suffix=.tar)
trap 'rm -f "$tarball"' EXIT
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  "$VERSION_CODENAME" "$tarball" "${sources[@]}"
"$DOCKER" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tarball" "$tag"
