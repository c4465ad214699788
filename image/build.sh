#!/usr/bin/env bash
# Build the image $2 from the repository on the base image $1, with no network inside the build.
set -euo pipefail
base=$1 tag=$2
cd "$(dirname "$0")/.."
. image/docker.sh
wheelhouse=$(bash image/wheelhouse.sh "$base")
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
"$DOCKER" build --network none --build-arg PYTHON_IMAGE="$base" \
  --build-arg WHEELS="$(basename "$wheelhouse")" --build-arg SOURCE_DATE_EPOCH="$epoch" --tag "$tag" .
