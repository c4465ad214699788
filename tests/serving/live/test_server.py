"""The real server: gunicorn with gthread workers, called over loopback with requests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from bench.run import process_tree
from hooks.serving.memory import LARGE_BODY_BYTES
from tests import EXAMPLES
from tests.fake_apiserver import FakeApiServer
from tests.live import free_port, live_server

# Starts the real server (gunicorn) in a process of its own.


def test_serve_answers_status_sync(
    apiserver: FakeApiServer, token_file: Path, tmp_path: Path
) -> None:
    env = {"GPUCLASS_KUBE_API": apiserver.url, "GPUCLASS_KUBE_TOKEN_FILE": str(token_file)}
    body = (EXAMPLES / "status-sync.json").read_bytes()
    with live_server(env, tmp_path, args=("--threads", "4")) as server:
        response = requests.post(
            f"{server.url}/status/sync",
            data=body,
            timeout=10,
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 200
        assert set(response.json()) == {"status", "children"}
        assert response.json()["status"]["free"] == 1
        assert response.json()["status"]["conditions"][-1]["reason"] == "Ready"

        # The status fed back as the parent's, as Metacontroller does: conditions keep their
        # transition times, so the answers cannot differ by a second that ticked in between.
        synced = json.loads(body)
        synced["parent"]["status"] = response.json()["status"]
        resync = json.dumps(synced).encode()
        with ThreadPoolExecutor(5) as pool:
            answers = list(
                pool.map(
                    lambda _: requests.post(
                        f"{server.url}/status/sync", data=resync, timeout=10
                    ).json(),
                    range(10),
                )
            )
        assert all(a == response.json() for a in answers)

        # A large call is computed in a child of the worker's fork server, which the worker
        # started before any large call came; the answer is the same.
        assert len(process_tree(server.process.pid)) >= 3  # gunicorn, its worker, its fork server
        large = resync + b" " * LARGE_BODY_BYTES
        answer = requests.post(f"{server.url}/status/sync", data=large, timeout=30)
        assert (answer.status_code, answer.json()) == (200, response.json())
        assert requests.get(f"{server.health}/readyz", timeout=5).status_code == 200
    assert server.process.returncode == 0
    calls = [json.loads(line) for line in server.logs().splitlines() if '"hook call"' in line]
    assert [c.get("computed_apart", False) for c in calls] == [False] * 11 + [True]


def test_serve_refuses_invalid_settings_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hooks.cli", "serve"],
        env={"GPUCLASS_POD_SELECTOR": "a in (", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "invalid setting GPUCLASS_POD_SELECTOR: cannot parse selector at 'a in ('"
    ]


def test_metrics_of_the_live_server_hold_one_value_per_series(
    apiserver: FakeApiServer, token_file: Path, tmp_path: Path
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    env = {"GPUCLASS_KUBE_API": apiserver.url, "GPUCLASS_KUBE_TOKEN_FILE": str(token_file)}
    body = (EXAMPLES / "status-sync.json").read_bytes()
    with live_server(env, tmp_path, args=("--threads", "4")) as server:
        with ThreadPoolExecutor(4) as pool:
            list(
                pool.map(
                    lambda _: requests.post(f"{server.url}/status/sync", data=body, timeout=10),
                    range(12),
                )
            )
        text = requests.get(f"{server.metrics}/metrics", timeout=5).text
    samples = [
        (s.name, tuple(sorted(s.labels.items())))
        for f in text_string_to_metric_families(text)
        for s in f.samples
    ]
    assert len(samples) == len(set(samples))
    free = [s for s in samples if s[0] == "cozystack_gpu_class_free_units"]
    assert free == [("cozystack_gpu_class_free_units", (("class", "l40s-24q"),))]
    assert (
        "cozystack_gpu_hook_requests_total",
        (("code", "200"), ("route", "/status/sync")),
    ) in samples


@pytest.mark.parametrize("level", ["info", "warning"])
def test_every_line_the_server_writes_is_json_from_the_set_level(
    apiserver: FakeApiServer, token_file: Path, tmp_path: Path, level: str
) -> None:
    """gunicorn's own lines (boot, signals, shutdown) in the service's format, so that one log
    pipeline parses every line; GPUCLASS_LOG_LEVEL holds back both kinds below it."""
    env = {
        "GPUCLASS_KUBE_API": apiserver.url,
        "GPUCLASS_KUBE_TOKEN_FILE": str(token_file),
        "GPUCLASS_LOG_LEVEL": level,
    }
    body = (EXAMPLES / "status-sync.json").read_bytes()
    with live_server(env, tmp_path, args=("--threads", "4")) as server:
        assert requests.post(f"{server.url}/status/sync", data=body, timeout=10).ok
    lines = [json.loads(line) for line in server.logs().splitlines()]
    levels = {line["level"] for line in lines}
    gunicorn = [line for line in lines if line.get("logger") == "gunicorn.error"]
    if level == "info":
        assert "info" in levels and gunicorn, lines
        assert any(line["event"].startswith("Booting worker") for line in gunicorn)
    else:
        assert levels <= {"warning", "error", "critical"}, lines


def boot(
    env: dict[str, str], tmp_path: Path, health_port: int | None = None
) -> tuple[int | None, str, bool]:
    """`serve` started as the pod starts it: its exit code (None if still running after 30 s),
    its output, and whether /readyz ever answered 200 meanwhile."""
    port, metrics_port = free_port(), free_port()
    health_port = health_port or free_port()
    command = [sys.executable, "-m", "hooks.cli", "serve", "--bind", f"127.0.0.1:{port}"]
    command += [f"--health-port={health_port}", f"--metrics-port={metrics_port}"]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLASS_")} | env
    log = tmp_path / "boot.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    ready = False
    deadline = time.monotonic() + 30
    try:
        while process.poll() is None and time.monotonic() < deadline:
            try:
                answer = requests.get(f"http://127.0.0.1:{health_port}/readyz", timeout=1)
                ready = ready or answer.status_code == 200
            except requests.RequestException:
                pass
            time.sleep(0.1)
        code = process.poll()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return code, log.read_text(), ready


def test_a_worker_whose_fork_server_cannot_start_fails_the_boot_and_is_never_ready(
    tmp_path: Path,
) -> None:
    """A worker that reported ready without a fork server would fail every large call: the
    boot fails instead, saying so, and the kubelet restarts the container."""
    broken = tmp_path / "site"
    broken.mkdir()
    # The fault a real fork server will not make on demand: it dies as it starts.
    (broken / "sitecustomize.py").write_text(
        "import os\nif b'forkserver' in open('/proc/self/cmdline', 'rb').read():\n    os._exit(1)\n"
    )
    code, output, ready = boot({"PYTHONPATH": str(broken)}, tmp_path)
    assert not ready, output
    assert code not in (None, 0), output
    assert "the fork server for large calls did not start" in output


def test_a_probe_port_already_taken_fails_the_boot(tmp_path: Path) -> None:
    """The probes are what the kubelet judges the pod by: a worker that cannot serve them must
    not serve the hooks."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output, ready = boot({}, tmp_path, health_port=port)
    assert not ready, output
    assert code not in (None, 0), output


def test_a_worker_whose_boot_never_finishes_is_replaced_after_the_timeout(
    tmp_path: Path,
) -> None:
    """gunicorn replaces a worker whose heartbeat is older than its timeout, but read the
    heartbeat of a worker that had not beaten yet on the wrong clock, so a boot stuck on a lock
    kept its pod unready until the kubelet restarted it: the first worker's boot hangs here, and
    the arbiter replaces it within its timeout (twice the hook timeout: 4 s) and the next one
    serves."""
    hanging = tmp_path / "site"
    hanging.mkdir()
    # The fault a real boot does not make on demand: the first worker's waits on a lock no one
    # releases; the workers after it boot.
    (hanging / "sitecustomize.py").write_text(
        "import os, sys, threading\n"
        "sys.path.insert(0, os.getcwd())  # the tree under test, as `-m` would put it\n"
        "from hooks.serving import server\n"
        "boot = server.HookServer.start_worker\n"
        "def start_worker(self, worker):\n"
        f"    flag = {str(tmp_path / 'hung-once')!r}\n"
        "    try:\n"
        "        os.close(os.open(flag, os.O_CREAT | os.O_EXCL))\n"
        "    except FileExistsError:\n"
        "        return boot(self, worker)\n"
        "    held = threading.Lock()\n"
        "    held.acquire()\n"
        "    held.acquire()\n"
        "server.HookServer.start_worker = start_worker\n"
    )
    env = {"PYTHONPATH": str(hanging), "GPUCLASS_HOOK_TIMEOUT": "2s"}
    with live_server(env, tmp_path, ready_within=60) as server:
        assert (tmp_path / "hung-once").exists()
        assert requests.get(f"{server.health}/readyz", timeout=5).status_code == 200
    timeouts = [line for line in server.logs().splitlines() if "WORKER TIMEOUT" in line]
    assert len(timeouts) == 1, server.logs()


def test_the_server_opens_no_control_socket(tmp_path: Path) -> None:
    """gunicorn's control socket (from 25.1) would let anyone sharing the pod's user stop or
    rescale the workers."""
    home = tmp_path / "home"
    home.mkdir()
    with live_server({"HOME": str(home), "XDG_RUNTIME_DIR": str(home)}, tmp_path) as server:
        assert requests.get(f"{server.health}/readyz", timeout=5).status_code == 200
    assert list(home.iterdir()) == []
    assert "Control socket" not in server.logs()


def test_a_worker_killed_again_and_again_is_replaced_by_one_that_boots_every_time(
    tmp_path: Path,
) -> None:
    """Workers started many times in a row: each replacement of a killed worker boots and
    serves (a boot that waited on a lock held at the fork hung about one start in fifty)."""
    with live_server({}, tmp_path) as server:
        master = server.process.pid

        def workers() -> list[int]:
            return [
                int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split()
            ]

        for _ in range(8):
            [worker] = workers()
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, server.logs()[-3000:]
                replaced = [pid for pid in workers() if pid != worker]
                try:
                    ready = requests.get(f"{server.health}/readyz", timeout=2).status_code
                except requests.RequestException:
                    ready = 0
                if replaced and ready == 200:
                    break
                time.sleep(0.1)
    assert server.logs().count("Booting worker") == 9
