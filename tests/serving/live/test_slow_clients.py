"""A stalled or slow client can never take the service down (the real server, gunicorn, on
loopback): a body that does not arrive in time is answered 408 and gives back what it held, probes
and metrics answer while every hook thread is held, and a fork server that does not answer fails a
large call within the hook timeout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from bench.run import process_tree
from hooks.serving.memory import LARGE_BODY_BYTES
from tests.builders import example_of
from tests.fake_apiserver import FakeApiServer
from tests.live import LiveServer, live_server

MIB = 1024 * 1024


def settings_env(apiserver: FakeApiServer, token_file: Path, **extra: str) -> dict[str, str]:
    return {
        "GPUCLASS_KUBE_API": apiserver.url,
        "GPUCLASS_KUBE_TOKEN_FILE": str(token_file),
        "GPUCLASS_MEMORY_BUDGET_BYTES": str(512 * MIB),
        "GPUCLASS_BODY_TIMEOUT_SECONDS": "1",
        **extra,
    }


@contextmanager
def stalled(server: LiveServer, declared: int, sent: bytes = b"") -> Iterator[socket.socket]:
    """A client that declares `declared` bytes of body, sends `sent`, and then nothing."""
    port = int(server.url.rsplit(":", 1)[1])
    connection = socket.create_connection(("127.0.0.1", port))
    head = (
        f"POST /status/sync HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    )
    connection.sendall(head.encode() + sent)
    try:
        yield connection
    finally:
        connection.close()


def answer_of(connection: socket.socket, within: float) -> tuple[int, dict[str, str]]:
    connection.settimeout(within)
    received = b""
    while b"\r\n\r\n" not in received or not received.endswith(b"}"):
        chunk = connection.recv(65536)
        if not chunk:
            break
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def metric(server: LiveServer, name: str) -> float:
    for line in requests.get(f"{server.metrics}/metrics", timeout=5).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def fork_server(server: LiveServer) -> int:
    """The worker's fork server: the process below the worker that runs multiprocessing's."""
    for pid in process_tree(server.process.pid):
        if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
            parent = parent_of(pid)
            if b"forkserver" not in Path(f"/proc/{parent}/cmdline").read_bytes():
                return pid
    raise AssertionError("no fork server")


def hook_children(server: LiveServer) -> list[int]:
    """Processes computing a call (children of the fork server), once exiting ones are gone."""
    deadline = time.monotonic() + 10
    while True:
        parent = fork_server(server)
        children = [p for p in process_tree(parent) if p != parent]
        if not children or time.monotonic() > deadline:
            return children
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("declared", "sent"),
    [(4000, b'{"con'), (LARGE_BODY_BYTES + MIB, b" " * MIB)],
    ids=["small, in its thread", "large, computed apart"],
)
def test_a_stalled_body_gets_408_and_gives_back_its_reservation_and_its_child(
    apiserver: FakeApiServer, token_file: Path, tmp_path: Path, declared: int, sent: bytes
) -> None:
    env = settings_env(apiserver, token_file)
    with live_server(env, tmp_path) as server, stalled(server, declared, sent) as client:
        started = time.monotonic()
        code, body = answer_of(client, within=20)
        took = time.monotonic() - started
        assert code == 408
        assert body["error"].startswith("the request body did not arrive within ")
        assert took < 15
        assert metric(server, "cozystack_gpu_hook_memory_reserved_bytes") == 0
        assert hook_children(server) == []
        assert metric(server, "cozystack_gpu_hook_calls_in_progress") == 0
    logged = [json.loads(line) for line in server.logs().splitlines() if '"hook call"' in line]
    assert [(c["code"], c["route"]) for c in logged] == [(408, "/status/sync")]


@pytest.mark.parametrize(
    "size", [16_000, LARGE_BODY_BYTES + 256 * 1024], ids=["small, in its thread", "large, apart"]
)
def test_a_body_sent_at_the_minimum_rate_is_read_whole_past_the_body_timeout(
    apiserver: FakeApiServer, token_file: Path, tmp_path: Path, size: int
) -> None:
    """A body's deadline is the body timeout plus what its size needs at the minimum rate, on
    both paths: one that arrives steadily above that rate, yet takes longer than the body
    timeout alone, is answered."""
    deadline_seconds = 5.0  # the body timeout's one second and four at the minimum rate
    rate = size // 4
    env = settings_env(apiserver, token_file, GPUCLASS_BODY_MIN_BYTES_PER_SECOND=str(rate))
    example = example_of("/status/sync")
    body = b" " * (size - len(example)) + example
    with live_server(env, tmp_path) as server, stalled(server, size) as client:
        started = time.monotonic()
        pieces = 20
        for number in range(pieces):  # evenly over half the deadline: twice the body timeout
            client.sendall(body[number * size // pieces : (number + 1) * size // pieces])
            time.sleep(deadline_seconds / 2 / pieces)
        code, answer = answer_of(client, within=20)
        took = time.monotonic() - started
    assert code == 200, answer
    assert "status" in answer
    assert 2 < took < deadline_seconds, took


def test_a_trickling_body_is_cut_off_a_moment_after_its_deadline(
    apiserver: FakeApiServer, token_file: Path, tmp_path: Path
) -> None:
    """A client that sends a byte now and then never lets a read time out; the deadline cuts
    the connection's read side all the same, and the 408 goes out."""
    env = settings_env(apiserver, token_file)
    with live_server(env, tmp_path) as server, stalled(server, 4000) as client:
        started = time.monotonic()
        received = b""
        client.settimeout(0.3)
        while time.monotonic() - started < 20 and not received.endswith(b"}"):
            with contextlib.suppress(OSError):
                client.sendall(b" ")
            try:
                chunk = client.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            received += chunk
        took = time.monotonic() - started
        assert received.split(b"\r\n", 1)[0].split()[1] == b"408"
        assert took < 10
        assert metric(server, "cozystack_gpu_hook_calls_in_progress") == 0


def test_probes_and_metrics_answer_while_every_hook_thread_is_held(
    apiserver: FakeApiServer, token_file: Path, tmp_path: Path
) -> None:
    env = settings_env(apiserver, token_file, GPUCLASS_BODY_TIMEOUT_SECONDS="30")
    with live_server(env, tmp_path, args=("--threads", "2")) as server:
        holders = [stalled(server, 4000) for _ in range(4)]
        connections = [holder.__enter__() for holder in holders]
        try:
            deadline = time.monotonic() + 10
            while metric(server, "cozystack_gpu_hook_calls_queued") < 2:
                assert time.monotonic() < deadline, "the stalled calls never filled the threads"
                time.sleep(0.1)
            assert metric(server, "cozystack_gpu_hook_calls_in_progress") == 2
            assert metric(server, "cozystack_gpu_hook_threads") == 2
            started = time.monotonic()
            for _ in range(10):
                assert requests.get(f"{server.health}/healthz", timeout=2).status_code == 200
                assert requests.get(f"{server.health}/readyz", timeout=2).status_code == 200
            assert time.monotonic() - started < 2
            # the hooks' own port is full: a small call waits behind the stalled ones
            with pytest.raises(requests.Timeout):
                requests.post(
                    f"{server.url}/status/customize",
                    data=example_of("/status/customize"),
                    timeout=1,
                )
        finally:
            for connection in connections:
                connection.close()


def test_a_stopped_fork_server_fails_a_large_call_within_the_hook_timeout(
    apiserver: FakeApiServer, token_file: Path, tmp_path: Path
) -> None:
    env = settings_env(apiserver, token_file, GPUCLASS_HOOK_TIMEOUT="2s")
    with live_server(env, tmp_path) as server:
        stopped = fork_server(server)
        os.kill(stopped, signal.SIGSTOP)
        try:
            large = example_of("/status/sync") + b" " * LARGE_BODY_BYTES
            started = time.monotonic()
            response = requests.post(f"{server.url}/status/sync", data=large, timeout=30)
            took = time.monotonic() - started
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert response.status_code == 500
        assert took < 6
        assert metric(server, "cozystack_gpu_hook_memory_reserved_bytes") == 0
        scrape = requests.get(f"{server.metrics}/metrics", timeout=5).text
        assert 'cozystack_gpu_hook_apart_calls_total{outcome="StartTimedOut"} 1.0' in scrape
        # the fork server, back, serves the next large call
        again = requests.post(f"{server.url}/status/sync", data=large, timeout=30)
        assert again.status_code == 200
        assert 'outcome="answered"} 1.0' in requests.get(f"{server.metrics}/metrics").text
