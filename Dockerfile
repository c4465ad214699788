# The hook service's image, built from the repository with no network: `make image` fills a
# wheelhouse on the host from the hashed locks (for this base's interpreter) and builds with
# `--network none`. No syntax line: it would make BuildKit fetch a frontend image.
#
# PYTHON_IMAGE: any Debian-like image with python3 (3.11 or newer) and its venv module, such as
# python:3.11-slim, or the base `make image-base` builds from Debian's packages.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
# The folder of .wheelhouse/ that holds the wheels for this base's interpreter.
ARG WHEELS
ARG SOURCE_DATE_EPOCH
WORKDIR /src
COPY requirements.lock requirements-build.lock pyproject.toml README.md ./
COPY hooks ./hooks
# Every wheel is checked against its hash in the locks, the build backend's too; the project is
# built without build isolation, which would fetch an unhashed setuptools. The service gets a venv
# of its own without pip, and byte code whose validity rests on the sources' hashes, not on file
# times, so that two builds of one commit hold the same files.
RUN --mount=type=bind,source=.wheelhouse,target=/wheelhouse \
    test -n "$WHEELS" \
 && python3 -m venv /opt/build \
 && /opt/build/bin/pip install --quiet --no-cache-dir --no-index --find-links="/wheelhouse/$WHEELS" \
        --require-hashes -r requirements-build.lock \
 && /opt/build/bin/pip wheel --quiet --no-cache-dir --no-index --no-deps --no-build-isolation \
        --wheel-dir /dist . \
 && python3 -m venv --without-pip /opt/hooks \
 && /opt/build/bin/pip --python /opt/hooks/bin/python install --quiet --no-cache-dir --no-index \
        --find-links="/wheelhouse/$WHEELS" --require-hashes --no-compile -r requirements.lock \
 && /opt/build/bin/pip --python /opt/hooks/bin/python install --quiet --no-cache-dir --no-index \
        --no-deps --no-compile /dist/*.whl \
 && /opt/hooks/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/hooks/lib

# The service: the base's interpreter and the venv; no pip, no build backend, no sources.
FROM ${PYTHON_IMAGE}
COPY --from=build /opt/hooks /opt/hooks
# What it was built from (image/build.sh passes them): the project's version, the commit, and the
# commit's time as the creation time, so that two builds of one commit carry the same labels.
ARG VERSION REVISION SOURCE CREATED
LABEL org.opencontainers.image.title="gpuclass-hooks" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.created="${CREATED}"
ENV PATH=/opt/hooks/bin:/usr/local/bin:/usr/bin:/bin PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 HOME=/tmp
USER 10001:10001
EXPOSE 8080 8081 9090
ENTRYPOINT ["gpuclass-hooks"]
CMD ["serve"]
