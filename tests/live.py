"""Start the real `gpuclass-hooks serve` (gunicorn) on a free port, for live tests."""

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

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def live_server(
    env: dict[str, str],
    tmp_path: Path,
    *,
    args: tuple[str, ...] = (),
    scheme: str = "http",
) -> Iterator[LiveServer]:
    port, health_port, metrics_port = free_port(), free_port(), free_port()
    log_path = tmp_path / f"serve-{port}.log"
    command = [
        *(sys.executable, "-m", "hooks.cli", "serve", "--bind", f"127.0.0.1:{port}"),
        *(f"--health-port={health_port}", f"--metrics-port={metrics_port}", *args),
    ]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLASS_")} | env
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    url = f"{scheme}://127.0.0.1:{port}"
    health = f"http://127.0.0.1:{health_port}"
    metrics = f"{scheme}://127.0.0.1:{metrics_port}"
    try:
        deadline = time.monotonic() + 20
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
        yield LiveServer(url, process, log_path, health, metrics)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
