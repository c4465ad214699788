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
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def live_server(
    env: dict[str, str],
    tmp_path: Path,
    *,
    args: tuple[str, ...] = (),
    scheme: str = "http",
    verify: bool | str = True,
    cert: tuple[str, str] | None = None,
) -> Iterator[LiveServer]:
    port = free_port()
    log_path = tmp_path / f"serve-{port}.log"
    command = [sys.executable, "-m", "hooks.cli", "serve", "--bind", f"127.0.0.1:{port}", *args]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLASS_")} | env
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    url = f"{scheme}://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited: {log_path.read_text()}")
            try:
                requests.get(f"{url}/healthz", timeout=1, verify=verify, cert=cert)
                break
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield LiveServer(url, process, log_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
