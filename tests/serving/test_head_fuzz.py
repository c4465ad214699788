"""No byte a caller sends stops a port: raw heads and bodies, built from RFC 9112's grammar and
from the inputs that once did, sent to a running admission listener (its event loop, its head
parser, its checks and its threads, in this process). After every input the listener is alive,
the probes say so, and a review is still answered. `make fuzz` runs it on
GPUCLASS_FUZZ_HEADS inputs (100,000); the unit tier on a few hundred."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import suppress

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hooks.serving import listeners, webhook
from hooks.serving.app import create_app
from hooks.serving.guard import Guard
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from tests.profiles import examples

FUZZ_VARIABLE = "GPUCLASS_FUZZ_HEADS"
HEADS = int(os.environ.get(FUZZ_VARIABLE, "0")) or examples(300)

methods = st.sampled_from(["POST", "GET", "PUT", "OPTIONS", "CONNECT", "post", "P\xc9ST", ""])
targets = st.one_of(
    st.sampled_from(
        [
            "/admit/gpu-budget",
            "/admit/tenant-gpu-keys",
            "/status/sync",
            "*",
            "h:443",
            "http://[/admit/gpu-budget",
            "http://[::1]:9443/admit/gpu-budget?x",
            "https://host/admit/gpu-budget#f",
            "/admit/%00",
            "/" + "a" * 9000,
        ]
    ),
    st.text(alphabet=st.characters(max_codepoint=255), max_size=40),
)
versions = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "HTTP/1.1 x", "http/1.1", ""])
lengths = st.one_of(
    st.integers(0, 10**6).map(str),
    st.sampled_from(["\xb2", "\xb9\xb2", "1" * 4301, "-1", "1e3", " 5", "5, 5", "0x10", ""]),
)
header_lines = st.one_of(
    lengths.map(lambda n: f"Content-Length: {n}"),
    st.sampled_from(
        [
            "Transfer-Encoding: chunked",
            "Host: x",
            " folded",
            "\tfolded",
            "No-Colon",
            ": empty name",
            "Bad Name: v",
            "Connection: close",
            "Expect: 100-continue",
            "A: 1\rB: 2",
            "A: 1\nB: 2",
        ]
    ),
    st.text(alphabet=st.characters(max_codepoint=255), max_size=30),
)


@st.composite
def requests_(draw: st.DrawFn) -> bytes:
    """A request line and headers from the grammar's parts (well-formed or not), a body of
    some bytes, cut anywhere, or bytes at random."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=400))
    line = f"{draw(methods)} {draw(targets)} {draw(versions)}"
    head = "\r\n".join([line, *draw(st.lists(header_lines, max_size=5))]) + "\r\n\r\n"
    data = head.encode("latin-1", errors="replace") + draw(st.binary(max_size=64))
    cut = draw(st.integers(1, len(data)))
    return data if draw(st.booleans()) else data[:cut]


@pytest.fixture(scope="module")
def admission() -> Iterator[tuple[webhook.Webhook, listeners.ServiceState, Metrics]]:
    """A plain admission listener (its routes answer 403 over plain HTTP, after the head is
    read and checked like any other), with short deadlines."""
    settings = Settings(header_timeout_seconds=0.3, admission_memory_bytes=4 * 1024 * 1024)
    state = listeners.ServiceState()
    metrics = Metrics(180.0)
    listener = webhook.Webhook(
        settings,
        "127.0.0.1",
        0,
        app=create_app(settings, metrics=metrics),
        guard=Guard(settings, None),
        metrics=metrics,
        tls=None,
        threads=2,
        state=state,
    )
    state.listeners.append(listener)
    yield listener, state, metrics
    listener.stop()


def exchange(port: int, data: bytes) -> bytes:
    """Send, close the sending side, read what comes back until the server closes (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as client:
        with suppress(OSError):
            client.sendall(data)
            client.shutdown(socket.SHUT_WR)
        received = b""
        with suppress(OSError):
            while chunk := client.recv(65536):
                received += chunk
        return received


REVIEW_HEAD = b"POST /admit/gpu-budget HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


@settings(
    max_examples=HEADS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=requests_())
@example(data=b"POST /admit/gpu-budget HTTP/1.1\r\nContent-Length: " + b"1" * 4301 + b"\r\n\r\n")
@example(data=b"POST /admit/gpu-budget HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n")
@example(data=b"POST http://[/admit/gpu-budget HTTP/1.1\r\n\r\n")
def test_no_input_stops_the_admission_port(
    admission: tuple[webhook.Webhook, listeners.ServiceState, Metrics], data: bytes
) -> None:
    listener, state, metrics = admission
    answer = exchange(listener.port, data)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 ")
    assert not listener.stopped and state.stopped() == []
    # read as a head or refused: never an error of the service's own
    internal = metrics.connections_dropped.labels(listener="admission", reason="internal")
    assert internal._value.get() == 0
    # the port answers a review, refused here only for coming over plain HTTP
    assert exchange(listener.port, REVIEW_HEAD).startswith(b"HTTP/1.1 403 ")
