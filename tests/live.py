"""Start the real `gpuclass-hooks serve` (gunicorn) on a free port, for live tests: from the venv,
or from the image (`--image`), run as a hoster's cluster would run it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class LiveServer:
    url: str  # the hooks
    process: subprocess.Popen[bytes]
    log_path: Path
    health: str  # /healthz and /readyz, plain HTTP
    metrics: str  # /metrics, with the hooks' scheme
    admission: str  # the admission reviews, with the hooks' scheme
    container: str | None = None  # the name of the container, when run from the image

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def live_server(
    env: dict[str, str],
    tmp_path: Path,
    *,
    args: tuple[str, ...] = (),
    scheme: str = "http",
    image: str | None = None,
    cwd: Path | None = None,
    ready_within: float = 20,
) -> Iterator[LiveServer]:
    port, health_port, metrics_port = free_port(), free_port(), free_port()
    admission_port = free_port()
    log_path = tmp_path / f"serve-{port}.log"
    serve = [
        *("serve", "--bind", f"127.0.0.1:{port}"),
        *(f"--health-port={health_port}", f"--metrics-port={metrics_port}"),
        *(f"--admission-port={admission_port}", *args),
    ]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLASS_")} | env
    container = None
    if image is None:
        command = [sys.executable, "-m", "hooks.cli", *serve]
    else:
        container = f"gpuclass-hooks-test-{port}"
        command = [*docker_run(image, env, container), *serve]
    with log_path.open("wb") as log:
        # `-m` imports the package from the working directory first: another tree's, when given
        process = subprocess.Popen(
            command, env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd
        )
    url = f"{scheme}://127.0.0.1:{port}"
    health = f"http://127.0.0.1:{health_port}"
    metrics = f"{scheme}://127.0.0.1:{metrics_port}"
    admission = f"{scheme}://127.0.0.1:{admission_port}"
    try:
        deadline = time.monotonic() + ready_within
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited: {log_path.read_text()}")
            try:
                # the worker answers probes once its fork server is up and it serves the hooks
                requests.get(f"{health}/readyz", timeout=1).raise_for_status()
                break
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield LiveServer(url, process, log_path, health, metrics, admission, container)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def docker() -> str:
    """The Docker client `make image` builds with (image/docker.sh)."""
    return os.environ.get("DOCKER") or (
        "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"
    )


def docker_run(image: str, env: dict[str, str], name: str) -> list[str]:
    """`docker run` as the chart runs the pod: read-only root, a small /tmp, no capabilities, no
    new privileges, a memory limit; on the host's network (nothing else is reachable here), where
    the service listens on 127.0.0.1 only. Files the settings name are mounted read-only at the
    same paths, readable by the image's user as a Secret volume's files are."""
    named = [Path(value) for key, value in env.items() if key.endswith("_FILE")]
    for path in named:
        path.parent.chmod(path.parent.stat().st_mode | 0o055)
        path.chmod(path.stat().st_mode | 0o044)
    files = {path.parent for path in named}
    return [
        *(docker(), "run", "--rm", "--name", name, "--network", "host", "--read-only"),
        *("--tmpfs", "/tmp:rw,size=64m", "--cap-drop", "ALL"),
        *("--security-opt", "no-new-privileges", "--memory", "1g"),
        *(arg for folder in sorted(files) for arg in ("--volume", f"{folder}:{folder}:ro")),
        *(arg for key, value in env.items() for arg in ("--env", f"{key}={value}")),
        image,
    ]
