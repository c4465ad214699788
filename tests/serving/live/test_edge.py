"""The edge against the real server (gunicorn with `hooks.serving.worker`), TLS and the token on,
with two hook threads: a client without the token never holds one, whatever it does before its
head is complete, and each such connection is closed at its deadline."""

from __future__ import annotations

import signal
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import pytest
import requests

from tests import EXAMPLES
from tests.live import LiveServer, live_server
from tests.pki import write_pki

CUSTOMIZE = (EXAMPLES / "status-customize.json").read_bytes()
TOKEN = "edge-token"
HEAD_SECONDS = 1.0


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    return write_pki(tmp_path)


def env_of(pki: dict[str, Path], tmp_path: Path, **extra: str) -> dict[str, str]:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    return {
        "GPUCLASS_TLS_CERT_FILE": str(pki["cert"]),
        "GPUCLASS_TLS_KEY_FILE": str(pki["key"]),
        "GPUCLASS_AUTH_TOKEN_FILE": str(tokens),
        "GPUCLASS_KUBE_API": "http://127.0.0.1:9",
        "GPUCLASS_KUBE_TIMEOUT_SECONDS": "0.2",
        "GPUCLASS_HEADER_TIMEOUT_SECONDS": str(HEAD_SECONDS),
        **extra,
    }


@contextmanager
def served(pki: dict[str, Path], tmp_path: Path, **extra: str) -> Iterator[LiveServer]:
    with live_server(
        env_of(pki, tmp_path, **extra), tmp_path, scheme="https", args=("--threads", "2")
    ) as server:
        yield server


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def client_context(pki: dict[str, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki["ca"]))


def tls_to(server: LiveServer, pki: dict[str, Path], *, admission: bool = False) -> ssl.SSLSocket:
    """A TLS connection to the hook port (or the admission port), handshake done, every read
    bounded."""
    port = port_of(server.admission if admission else server.url)
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1")


def customize(server: LiveServer, pki: dict[str, Path]) -> requests.Response:
    return requests.post(
        f"{server.url}/status/customize",
        data=CUSTOMIZE,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        verify=str(pki["ca"]),
        timeout=3,
    )


def closed_within(sock: socket.socket, seconds: float) -> float:
    """How long until the server closed the connection (fails past `seconds`)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    with suppress(ConnectionResetError, ssl.SSLError):
        while sock.recv(4096):
            pass
    return time.monotonic() - started


def client_hello() -> bytes:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_trickling_head_holds_no_thread_and_is_closed_at_its_deadline(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    with served(pki, tmp_path) as server, ExitStack() as stack:
        trickling = []
        for _ in range(10):  # five times the threads
            tls = stack.enter_context(tls_to(server, pki))
            tls.sendall(b"POST /status/customize HTTP/1.1\r\nHo")
            trickling.append(tls)
        started = time.monotonic()
        assert customize(server, pki).status_code == 200
        assert time.monotonic() - started < 1.0
        with suppress(OSError):
            trickling[0].sendall(b"s")  # another byte restarts nothing
        assert closed_within(trickling[0], HEAD_SECONDS + 2) <= HEAD_SECONDS + 1


def test_a_stalled_handshake_holds_no_thread_and_is_closed_at_its_deadline(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    hello = client_hello()
    with served(pki, tmp_path) as server, ExitStack() as stack:
        stalled = []
        for _ in range(10):
            sock = stack.enter_context(
                socket.create_connection(("127.0.0.1", port_of(server.url)), timeout=5)
            )
            sock.sendall(hello[: len(hello) // 2])
            stalled.append(sock)
        opened = time.monotonic()
        assert customize(server, pki).status_code == 200
        closed_within(stalled[0], HEAD_SECONDS + 2)
        assert time.monotonic() - opened <= HEAD_SECONDS + 1


def test_idle_connections_hold_no_thread_and_close_at_their_deadline(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    with served(pki, tmp_path) as server, ExitStack() as stack:
        port = port_of(server.url)
        idle = [
            stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            for _ in range(200)
        ]
        opened = time.monotonic()
        assert customize(server, pki).status_code == 200
        closed_within(idle[-1], HEAD_SECONDS + 2)
        assert time.monotonic() - opened <= HEAD_SECONDS + 1
        scrape = requests.get(f"{server.metrics}/metrics", verify=str(pki["ca"]), timeout=3).text
        dropped = (
            'cozystack_gpu_hook_connections_dropped_total{listener="hooks",reason="head_deadline"}'
        )
        [line] = [line for line in scrape.splitlines() if line.startswith(dropped)]
        assert float(line.split()[1]) >= 1


def head_answer(tls: ssl.SSLSocket) -> bytes:
    tls.settimeout(3)
    received = b""
    with suppress(ConnectionResetError, ssl.SSLError):
        while chunk := tls.recv(4096):
            received += chunk
    return received


def test_an_admission_review_that_declares_a_gigabyte_is_413_at_once_and_closed(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    with served(pki, tmp_path) as server:
        with tls_to(server, pki, admission=True) as tls:
            started = time.monotonic()
            tls.sendall(
                b"POST /admit/gpu-budget HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: 1073741824\r\n\r\n"
            )
            answer = head_answer(tls)  # read to the close: the connection does not stay open
        assert answer.startswith(b"HTTP/1.1 413 ")
        assert b"Connection: close" in answer
        assert time.monotonic() - started < 1.0
        assert customize(server, pki).status_code == 200


HEADS_THAT_STOPPED_A_PORT = [
    b"POST /admit/gpu-budget HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"1" * 4301 + b"\r\n\r\n",
    b"POST /admit/gpu-budget HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n",
    b"POST http://[/admit/gpu-budget HTTP/1.1\r\nHost: x\r\n\r\n",
]


@pytest.mark.parametrize("admission", [True, False], ids=["admission-port", "hook-port"])
def test_no_head_a_caller_sends_stops_a_port_or_a_worker(
    pki: dict[str, Path], tmp_path: Path, admission: bool
) -> None:
    """Each head that once killed the admission port's listener (or the hook port's worker),
    sent with no token, several times: the port still answers, the worker is the same one, and
    the log holds JSON lines only."""
    with served(pki, tmp_path) as server:
        assert customize(server, pki).status_code == 200
        booted = server.log_path.read_text().count("Booting worker")
        for _ in range(3):
            for head in HEADS_THAT_STOPPED_A_PORT:
                with tls_to(server, pki, admission=admission) as tls:
                    tls.sendall(head)
                    answer = head_answer(tls)
                assert answer == b"" or answer.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4"))
        assert customize(server, pki).status_code == 200
        review = requests.post(
            f"{server.admission}/admit/gpu-budget",
            data=(EXAMPLES / "admit-gpu-budget.json").read_bytes(),
            verify=str(pki["ca"]),
            timeout=10,
        )
        assert review.status_code == 200
        log = server.log_path.read_text()
        assert "Traceback" not in log and "Exception in thread" not in log
        assert "unexpected error" not in log  # read as a head or refused, never an error
        assert log.count("Booting worker") == booted  # no worker died and was replaced


def test_without_the_token_a_call_that_expects_100_continue_gets_401_and_never_100(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    with served(pki, tmp_path) as server:
        with tls_to(server, pki) as tls:
            tls.sendall(
                b"POST /status/sync HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                b"Content-Length: 50000000\r\n\r\n"
            )
            answer = head_answer(tls)
        assert answer.startswith(b"HTTP/1.1 401 ") and b"100 Continue" not in answer


def test_with_the_token_100_continue_is_sent_after_the_check(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    with served(pki, tmp_path) as server, tls_to(server, pki) as tls:
        head = (
            f"POST /status/customize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(CUSTOMIZE)}\r\n\r\n"
        )
        tls.sendall(head.encode())
        tls.settimeout(3)
        assert tls.recv(4096).startswith(b"HTTP/1.1 100 Continue")
        tls.sendall(CUSTOMIZE)
        assert tls.recv(4096).startswith(b"HTTP/1.1 200 ")


def test_a_refusal_in_a_hook_thread_closes_its_connection_unread(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    """A call the memory budget can never hold gets 413 from the app, which gunicorn would keep
    alive and drain: it is closed instead."""
    with served(pki, tmp_path, GPUCLASS_MEMORY_BUDGET_BYTES=str(64 * 1024 * 1024)) as server:
        with tls_to(server, pki) as tls:
            tls.sendall(
                f"POST /status/sync HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                "Content-Length: 500000000\r\n\r\n".encode()
            )
            started = time.monotonic()
            answer = head_answer(tls)
        assert answer.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in answer
        assert time.monotonic() - started < 2.5  # closed, not drained for gunicorn's 5 s


def test_past_the_cap_unfinished_heads_are_dropped_and_a_call_in_progress_is_answered(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    with served(pki, tmp_path, GPUCLASS_MAX_CONNECTIONS="16") as server, ExitStack() as stack:
        port = port_of(server.url)
        in_call = stack.enter_context(tls_to(server, pki))
        in_call.sendall(
            f"POST /status/customize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {len(CUSTOMIZE)}\r\n\r\n".encode()
            + CUSTOMIZE[:10]  # the rest after the flood: the call is in progress meanwhile
        )
        time.sleep(0.3)
        flood = [
            stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            for _ in range(40)
        ]
        in_call.sendall(CUSTOMIZE[10:])
        in_call.settimeout(3)
        assert in_call.recv(4096).startswith(b"HTTP/1.1 200 ")
        assert closed_within(flood[0], 0.5) < 0.5  # the oldest silent one went first
        assert customize(server, pki).status_code == 200


def test_a_call_accepted_during_the_drain_delay_is_answered_and_then_new_ones_are_refused(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    with served(pki, tmp_path, GPUCLASS_SHUTDOWN_DELAY_SECONDS="1.5") as server:
        port = port_of(server.url)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # inside the drain delay: still accepting, readiness 503
        assert requests.get(f"{server.health}/readyz", timeout=2).status_code == 503
        with tls_to(server, pki) as tls:
            tls.sendall(
                f"POST /status/customize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Length: {len(CUSTOMIZE)}\r\n\r\n".encode()
                + CUSTOMIZE[:10]
            )
            time.sleep(1.0)  # the worker stopped accepting meanwhile; this call is finished
            tls.sendall(CUSTOMIZE[10:])
            tls.settimeout(5)
            assert tls.recv(4096).startswith(b"HTTP/1.1 200 ")
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2)
        server.process.wait(timeout=10)


def test_probes_answer_while_the_health_port_is_flooded(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    with served(pki, tmp_path) as server, ExitStack() as stack:
        port = port_of(server.health)
        for _ in range(600):  # past the listener's cap: the oldest silent ones go first
            stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
        started = time.monotonic()
        for _ in range(20):
            assert requests.get(f"{server.health}/readyz", timeout=2).status_code == 200
        assert time.monotonic() - started < 2.0


def test_a_kept_alive_tls_connection_serves_call_after_call_and_pipelined_heads(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    """Metacontroller reuses its connections: between calls a connection waits in the event loop,
    and a head sent before the previous answer (already decrypted, held by the TLS layer) is read
    from what the call left behind."""
    call = (
        f"POST /status/customize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Length: {len(CUSTOMIZE)}\r\n\r\n"
    ).encode() + CUSTOMIZE
    with served(pki, tmp_path) as server, tls_to(server, pki) as tls:
        for _ in range(5):
            tls.sendall(call)
            assert answers(tls, 1) == [200]
            time.sleep(0.1)  # idle in the loop between calls
        tls.sendall(call * 3)
        assert answers(tls, 3) == [200, 200, 200]
        with requests.Session() as session:
            for _ in range(10):
                response = session.post(
                    f"{server.url}/status/customize",
                    data=CUSTOMIZE,
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    verify=str(pki["ca"]),
                    timeout=3,
                )
                assert response.status_code == 200


def answers(tls: ssl.SSLSocket, count: int) -> list[int]:
    """The codes of the next `count` answers on the connection (each with a Content-Length)."""
    tls.settimeout(3)
    received, codes = b"", []
    while len(codes) < count:
        received += tls.recv(65536)
        while b"\r\n\r\n" in received:
            head, _, rest = received.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next(
                int(line.split(":", 1)[1])
                for line in lines
                if line.lower().startswith("content-length:")
            )
            if len(rest) < length:
                break
            codes.append(int(lines[0].split()[1]))
            received = rest[length:]
    return codes
