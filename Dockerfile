# syntax=docker/dockerfile:1
# Build stage: the locked dependencies as wheels (each checked against its hash in
# requirements.lock), and the package itself as a wheel.
FROM python:3.11-slim AS build
WORKDIR /src
COPY requirements.lock ./
RUN pip wheel --no-cache-dir --require-hashes --wheel-dir /wheels -r requirements.lock
COPY pyproject.toml README.md ./
COPY hooks ./hooks
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# Final stage: only the installed wheels; no compilers, no pip caches, no sources.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,from=build,source=/dist,target=/dist \
    --mount=type=bind,from=build,source=/src/requirements.lock,target=/requirements.lock \
    pip install --no-cache-dir --no-index --find-links=/wheels --require-hashes \
        -r /requirements.lock \
 && pip install --no-cache-dir --no-index --no-deps /dist/*.whl \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin hooks
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["gpuclass-hooks"]
CMD ["serve"]
