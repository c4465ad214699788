"""No byte a caller sends stops a port: raw heads and bodies, built from RFC 9112's grammar and
from the inputs that once did, sent to each port's running listener in this process (the
admission port: its event loop, head parser, checks and threads; the health and metrics ports).
After every input the listener is alive, the probes say so, and the port still answers. The hook
port, served by gunicorn's worker, is fuzzed live (`tests/serving/live/test_hook_port_fuzz.py`).
`make fuzz` runs both on GPUCLASS_FUZZ_HEADS inputs per port (100,000); the unit and live tiers
on a few hundred."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass

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
# `make fuzz` runs for as long as its inputs take: no tier's time limit then.
FUZZ_LIMIT = [pytest.mark.timeout(0)] if os.environ.get(FUZZ_VARIABLE) else []
pytestmark = FUZZ_LIMIT

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


@dataclass
class Port:
    """A running listener, and the request it must still answer after any input."""

    listener: listeners.Listener
    probe: bytes
    answered: bytes  # how the answer to `probe` begins


@pytest.fixture(scope="module")
def ports() -> Iterator[tuple[dict[str, Port], listeners.ServiceState, Metrics]]:
    """The admission, health and metrics listeners of one process, plain HTTP (the admission
    routes answer 403 over it, after the head is read and checked like any other)."""
    # The head deadline is the default's: an input cut short ends when the client half-closes,
    # and a shorter one dropped a probe whose head a busy machine had not read in time.
    settings = Settings(admission_memory_bytes=4 * 1024 * 1024)
    state = listeners.ServiceState()
    metrics = Metrics(180.0)
    admission = webhook.Webhook(
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
    health, scrape = listeners.start(settings, "127.0.0.1", 0, 0, state, metrics, None)
    state.listeners += [admission, scrape]
    served = {
        "admission": Port(admission, REVIEW_HEAD, b"HTTP/1.1 403 "),
        "health": Port(health, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 "),
        "metrics": Port(scrape, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 "),
    }
    yield served, state, metrics
    for port in served.values():
        port.listener.stop()


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


# Answered 403 over plain HTTP: refused only for not coming over TLS, once read and checked.
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
@pytest.mark.parametrize("name", ["admission", "health", "metrics"])
def test_no_input_stops_a_port(
    ports: tuple[dict[str, Port], listeners.ServiceState, Metrics], name: str, data: bytes
) -> None:
    served, state, metrics = ports
    port = served[name]
    answer = exchange(port.listener.port, data)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 ")
    assert not port.listener.stopped and state.stopped() == []
    # read as a head or refused: never an error of the service's own
    internal = metrics.connections_dropped.labels(listener=port.listener.name, reason="internal")
    assert internal._value.get() == 0
    assert exchange(port.listener.port, port.probe).startswith(port.answered)
