# syntax=docker/dockerfile:1
# Build stage: turn the package into a wheel (and its dependencies into wheels).
FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip build
COPY pyproject.toml README.md ./
COPY hooks ./hooks
RUN python -m build --wheel --outdir /wheels . \
 && pip wheel --no-cache-dir --wheel-dir /wheels /wheels/*.whl

# Final stage: only the installed wheels; no compilers, no pip caches, no sources.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels cozystack-gpuclass-hooks \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin hooks
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["gpuclass-hooks"]
CMD ["serve"]
