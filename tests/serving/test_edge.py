"""The edge's parts on their own: reading a head, the checks made on it, the answers it writes,
the serving certificate's reload, and the event loop's deadlines, states and cap over real
sockets on loopback."""

from __future__ import annotations

import selectors
import socket
import ssl
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from hooks.routes import HOOKS
from hooks.serving import edge
from hooks.serving.auth import TokenFile
from hooks.serving.guard import Guard
from hooks.serving.worker import honour_connection_close
from hooks.settings import Settings
from tests.profiles import examples
from tests.volumes import MountedVolume, tls_files

ADMISSION = next(hook for hook in HOOKS if hook.https_only)
SYNC = next(hook for hook in HOOKS if hook.path == "/status/sync")


def test_a_head_gives_its_method_decoded_path_and_headers() -> None:
    head = edge.parse_head(
        b"POST /status/%73ync?cfg=ab HTTP/1.1\r\nHost: x\r\nAUTHORIZATION:  Bearer t \r\n"
        b"X-A: 1\r\nx-a: 2\r\nContent-Length: 12\r\n\r\n"
    )
    assert head is not None
    assert (head.method, head.path) == ("POST", "/status/sync")
    assert head.headers["authorization"] == "Bearer t"
    assert head.headers["x-a"] == "1, 2"
    assert head.content_length() == 12 and not head.chunked


def test_an_absolute_target_is_read_by_its_path() -> None:
    head = edge.parse_head(b"POST http://h:1/license/sync HTTP/1.1\r\n\r\n")
    assert head is not None and head.path == "/license/sync"


@pytest.mark.parametrize(
    "data",
    [
        b"POST /x\r\n\r\n",
        b"POST /x HTTP/2\r\n\r\n",
        b"post /x HTTP/1.1\r\n\r\n",
        b"POST /x HTTP/1.1\r\nno colon\r\n\r\n",
        b"POST /x HTTP/1.1\r\nbad name: v\r\n\r\n",
    ],
)
def test_what_is_not_a_request_head_is_refused_400(data: bytes) -> None:
    refused = edge.parse_head(data)
    assert isinstance(refused, edge.Refused) and refused.code == 400


@pytest.mark.parametrize(
    ("text", "length"),
    [(b"0", 0), (b"1x", -1), (b"-1", -1), (b"", -1), (b"\xb2", -1), (b"\xb9\xb2", -1)],
)
def test_a_declared_length_that_is_not_a_number_reads_as_negative(text: bytes, length: int) -> None:
    """ASCII digits only (RFC 9110: `Content-Length = 1*DIGIT`): a superscript digit (a head's
    byte 0xB2 is `²` in Latin-1) is a digit to Python, not to HTTP."""
    head = edge.parse_head(b"POST / HTTP/1.1\r\nContent-Length: " + text + b"\r\n\r\n")
    assert head is not None and head.content_length() == length


@pytest.mark.parametrize("digits", [19, 4301, 60_000])
def test_a_declared_length_of_more_digits_than_a_body_can_have_reads_as_too_long(
    digits: int,
) -> None:
    """Bounded before it is converted: Python refuses to convert more than 4,300 digits."""
    head = edge.parse_head(f"POST / HTTP/1.1\r\nContent-Length: {'9' * digits}\r\n\r\n".encode())
    assert head is not None and head.content_length() == edge.TOO_LONG


@pytest.mark.parametrize(
    "head",
    [
        # the three requests that stopped a port or a worker (issue: a total request parser)
        b"POST /admit/gpu-budget HTTP/1.1\r\nContent-Length: " + b"1" * 4301 + b"\r\n\r\n",
        b"POST /admit/gpu-budget HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n",
        b"POST http://[/admit/gpu-budget HTTP/1.1\r\n\r\n",
    ],
    ids=["4301-digits", "superscript-digit", "bracket-in-target"],
)
def test_the_heads_that_stopped_a_port_are_read_or_refused_never_raised(head: bytes) -> None:
    parsed = edge.parse_head(head)
    if isinstance(parsed, edge.Head):
        assert parsed.content_length() in (edge.TOO_LONG, -1, None)


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/a?b", "/a"),
        ("http://h/a", "/a"),
        ("https://h:8443", "/"),
        ("http://[::1]:80/a?q", "/a"),
        ("http://[/a", None),
        ("http://h]/a", None),
        ("*", None),
        ("h:443", None),
        ("/a#frag", None),
        ("/a\x00", None),
        ("a/b", None),
    ],
)
def test_a_request_target_is_read_in_the_forms_rfc_9112_allows(
    target: str, path: str | None
) -> None:
    head = edge.parse_head(f"POST {target} HTTP/1.1\r\n\r\n".encode("latin-1"))
    assert (head.path if isinstance(head, edge.Head) else None) == path


def test_a_request_target_too_long_is_414() -> None:
    head = edge.parse_head(b"GET /" + b"a" * edge.TARGET_LIMIT + b" HTTP/1.1\r\n\r\n")
    assert head == edge.Refused(414, f"the request target is over {edge.TARGET_LIMIT} bytes")


@pytest.mark.parametrize(
    "data",
    [
        b"POST /x HTTP/1.1\r\nA: 1\r\n folded\r\n\r\n",  # obs-fold
        b"POST /x HTTP/1.1\r\nA: 1\rB: 2\r\n\r\n",  # a bare CR
        b"POST /x HTTP/1.1\nA: 1\r\n\r\n",  # a bare LF
        b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"P\xc9ST /x HTTP/1.1\r\n\r\n",  # a method of letters HTTP has not
    ],
    ids=["obs-fold", "bare-cr", "bare-lf", "length-beside-chunked", "latin-1-method"],
)
def test_what_rfc_9112_refuses_is_not_a_head(data: bytes) -> None:
    refused = edge.parse_head(data)
    assert isinstance(refused, edge.Refused) and refused.code == 400


@given(data=st.binary(max_size=300))
@hypothesis_settings(max_examples=examples(2000), deadline=None)
def test_every_byte_sequence_is_a_head_or_none_and_its_length_reads(data: bytes) -> None:
    """Total: nothing a caller sends makes the reading of a head raise."""
    for head in (data, b"POST /admit/gpu-budget HTTP/1.1\r\n" + data + b"\r\n\r\n"):
        parsed = edge.parse_head(head)
        if isinstance(parsed, edge.Head):
            length = parsed.content_length()
            assert length is None or length >= -1
        else:
            assert parsed.code in (400, 414) and len(parsed.message) < 100


def test_an_edge_answer_is_whole_json_and_closes() -> None:
    data = edge.response_bytes(405, "no", {"Allow": "POST"})
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.split(b"\r\n") == [
        b"HTTP/1.1 405 Method Not Allowed",
        b"Content-Type: application/json",
        b"Content-Length: 14",
        b"Connection: close",
        b"Allow: POST",
    ]
    assert body == b'{"error":"no"}'


@pytest.fixture
def guard(tmp_path: Path) -> Guard:
    tokens = tmp_path / "tokens"
    tokens.write_text("t\n")
    return Guard(Settings(auth_token_file=tokens), TokenFile(tokens))


def check(guard: Guard, hook: Any, **overrides: Any) -> int | None:
    arguments = {
        "authorization": "Bearer t",
        "secure": True,
        "content_length": 10,
        "chunked": False,
        **overrides,
    }
    refusal = guard.check(hook, **arguments)
    return None if refusal is None else refusal.code


def test_the_checks_on_a_head_refuse_cheapest_first(guard: Guard) -> None:
    assert check(guard, SYNC) is None
    assert check(guard, SYNC, authorization=None, content_length=None, chunked=True) == 401
    assert check(guard, ADMISSION, authorization=None, secure=False) == 403
    assert check(guard, SYNC, content_length=None, chunked=True) == 411
    assert check(guard, SYNC, content_length=-1) == 400
    assert check(guard, SYNC, content_length=2**31) == 413
    assert check(guard, SYNC, content_length=None) is None  # no body


def test_an_admission_review_over_its_own_limit_is_413_whatever_the_hook_limit(
    guard: Guard,
) -> None:
    limit = Settings().admission_max_body_bytes
    assert check(guard, ADMISSION, authorization=None, content_length=limit) is None
    assert check(guard, ADMISSION, authorization=None, content_length=limit + 1) == 413
    assert check(guard, SYNC, content_length=limit + 1) is None


def test_an_answer_that_says_close_makes_gunicorn_close() -> None:
    class GunicornResponse:
        closed = False

        def force_close(self) -> None:
            self.closed = True

        def start_response(self, status: str, headers: Any, exc_info: Any = None) -> None:
            pass

    def app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("401 UNAUTHORIZED", [("Connection", " Close")])
        return [b""]

    def keeping(environ: Any, start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b""]

    refused, served = GunicornResponse(), GunicornResponse()
    honour_connection_close(app)({}, refused.start_response)
    honour_connection_close(keeping)({}, served.start_response)
    assert (refused.closed, served.closed) == (True, False)


# -- the serving certificate, as a Secret volume lays it out ---------------------------------


@pytest.fixture
def volume(tmp_path: Path) -> tuple[MountedVolume, trustme.CA]:
    ca = trustme.CA()
    return MountedVolume(tmp_path, tls_files(ca.issue_cert("127.0.0.1", "first.test"))), ca


def tls_source(volume: MountedVolume) -> edge.TlsSource:
    return edge.TlsSource(volume.path("tls.crt"), volume.path("tls.key"))


def served_names(context: ssl.SSLContext, ca: trustme.CA) -> list[str]:
    """The DNS names of the certificate a handshake with this context presents."""
    client = ssl.create_default_context()
    ca.configure_trust(client)
    server_side, client_side = socket.socketpair()
    with server_side, client_side:
        server = context.wrap_socket(server_side, server_side=True, do_handshake_on_connect=False)
        wrapped = client.wrap_socket(
            client_side, server_hostname="127.0.0.1", do_handshake_on_connect=False
        )
        server.setblocking(False)
        wrapped.setblocking(False)
        for _ in range(100):
            done = 0
            for side in (wrapped, server):
                try:
                    side.do_handshake()
                    done += 1
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
            if done == 2:
                break
        peer = wrapped.getpeercert()
    return sorted(value for kind, value in peer["subjectAltName"] if kind == "DNS")


def test_a_renewed_certificate_is_served_from_the_next_connection(
    volume: tuple[MountedVolume, trustme.CA],
) -> None:
    mounted, ca = volume
    source = tls_source(mounted)
    assert served_names(source.context(), ca) == ["first.test"]
    mounted.update(tls_files(ca.issue_cert("127.0.0.1", "second.test")))
    assert served_names(source.context(), ca) == ["second.test"]


def test_a_rotated_client_ca_is_the_one_trusted_from_the_next_connection(tmp_path: Path) -> None:
    """`GPUCLASS_TLS_CLIENT_CA_FILE` sits in the same kind of volume, and is re-read with the
    pair: after a CA rotation the context trusts the new CA only."""
    old_ca, new_ca = trustme.CA(), trustme.CA()
    leaf = old_ca.issue_cert("127.0.0.1")
    volume = MountedVolume(tmp_path, {**tls_files(leaf), "ca.crt": old_ca.cert_pem.bytes()})
    source = edge.TlsSource(volume.path("tls.crt"), volume.path("tls.key"), volume.path("ca.crt"))

    def trusted() -> list[int]:
        return [int(c["serialNumber"], 16) for c in source.context().get_ca_certs()]

    def serial(ca: trustme.CA) -> int:
        return x509.load_pem_x509_certificate(ca.cert_pem.bytes()).serial_number

    assert trusted() == [serial(old_ca)]
    volume.update({**tls_files(new_ca.issue_cert("127.0.0.1")), "ca.crt": new_ca.cert_pem.bytes()})
    assert trusted() == [serial(new_ca)]


def test_a_certificate_and_key_of_different_generations_are_never_served_together(
    volume: tuple[MountedVolume, trustme.CA],
) -> None:
    """Read halfway through a swap: the pair does not load, the last good one is served, and the
    load is tried again until the files agree."""
    mounted, ca = volume
    source = tls_source(mounted)
    first = (mounted.root / "..data").resolve()
    second = mounted.write_generation(tls_files(ca.issue_cert("127.0.0.1", "second.test")))
    mounted.path("tls.key").unlink()
    mounted.path("tls.key").symlink_to(f"{first.name}/tls.key")  # the old key, the new certificate
    mounted.swap(second)
    assert served_names(source.context(), ca) == ["first.test"]
    mounted.path("tls.key").unlink()
    mounted.path("tls.key").symlink_to("..data/tls.key")
    assert served_names(source.context(), ca) == ["second.test"]


def test_a_load_that_straddled_a_swap_is_tried_again_though_the_files_no_longer_change(
    volume: tuple[MountedVolume, trustme.CA], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that met the old certificate and the new key (a race no file system makes on
    demand, so the load is made to fail once): the files are stable afterwards, and the next
    connection must still get the new pair."""
    mounted, ca = volume
    source = tls_source(mounted)
    mounted.update(tls_files(ca.issue_cert("127.0.0.1", "second.test")))
    load = edge.TlsSource._load
    failed: list[bool] = []

    def straddled(self: edge.TlsSource) -> tuple[dict[bool, ssl.SSLContext], float]:
        if not failed:
            failed.append(True)
            raise ssl.SSLError("[X509: KEY_VALUES_MISMATCH] key values mismatch")
        return load(self)

    monkeypatch.setattr(edge.TlsSource, "_load", straddled)
    assert served_names(source.context(), ca) == ["first.test"]
    assert served_names(source.context(), ca) == ["second.test"]


def test_the_end_of_the_served_certificate_follows_a_renewal(
    volume: tuple[MountedVolume, trustme.CA],
) -> None:
    """The expiry gauge reads `not_after`: the certificate being served, not the files'."""
    mounted, ca = volume
    source = tls_source(mounted)
    first = cryptography_not_after(mounted.path("tls.crt").read_bytes())
    assert source.not_after == first
    later = datetime.fromtimestamp(first, UTC) + timedelta(days=300)
    renewed = ca.issue_cert("127.0.0.1", "second.test", not_after=later)
    mounted.update(tls_files(renewed))
    assert source.not_after == first  # nothing served it yet
    source.context()
    assert source.not_after == later.replace(microsecond=0).timestamp()


def cryptography_not_after(pem: bytes) -> float:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()


def test_a_certificate_that_does_not_load_at_start_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises((OSError, ssl.SSLError)):
        edge.TlsSource(tmp_path / "missing.crt", tmp_path / "missing.key")


# -- the loop over real sockets ---------------------------------------------------------------


class Loop:
    """An Edge on a selector, driven step by step from the test, with a clock the test sets."""

    def __init__(
        self,
        *,
        max_connections: int = 8,
        head_seconds: float = 5.0,
        held_bytes_limit: int = 64 * 1024 * 1024,
        tls: edge.TlsSource | None = None,
    ) -> None:
        self.now = 100.0
        self.selector = selectors.DefaultSelector()
        self.heads: list[tuple[edge.Connection, bytes, bytes]] = []
        self.drops: list[str] = []
        self.tls_failures: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.edge = edge.Edge(
            self.selector,
            lambda connection, head, rest: self.heads.append((connection, head, rest)),
            head_seconds=head_seconds,
            idle_seconds=3.0,
            max_connections=max_connections,
            held_bytes_limit=held_bytes_limit,
            tls=tls,
            on_drop=self.drops.append,
            on_tls_failure=self.tls_failures.append,
            clock=lambda: self.now,
        )

    def connect(self) -> socket.socket:
        client = socket.create_connection(self.listener.getsockname(), timeout=2)
        self.turn()
        return client

    def called(self, client: socket.socket) -> edge.Connection:
        """The client sends a head, the owner takes the call, and gives the connection back
        idle."""
        client.sendall(b"POST / HTTP/1.1\r\n\r\n")
        self.turn()
        connection = self.heads[-1][0]
        self.edge.hand_off(connection)
        self.edge.resume(connection, b"")
        return connection

    def turn(self, rounds: int = 3) -> None:
        for _ in range(rounds):
            self.edge.accept(self.listener)
            for key, mask in self.selector.select(0.05):
                key.data(mask)
            self.edge.expire()

    def close(self) -> None:
        self.edge.close_all()
        self.listener.close()
        self.selector.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


def test_an_error_in_one_connections_handling_drops_it_and_the_loop_goes_on(loop: Loop) -> None:
    """Whatever a connection's handling raises closes that connection, counted as `internal`,
    and is told once per kind; the loop serves the next connection as before."""
    errors: list[tuple[str, list[str]]] = []
    failing = {"on": True}

    def on_head(connection: edge.Connection, head: bytes, rest: bytes) -> None:
        if failing["on"]:
            raise ValueError(head.decode())  # a message that quotes the request
        loop.heads.append((connection, head, rest))

    loop.edge = edge.Edge(
        loop.selector,
        on_head,
        head_seconds=5.0,
        idle_seconds=3.0,
        max_connections=8,
        held_bytes_limit=1 << 20,
        on_drop=loop.drops.append,
        on_error=lambda kind, frames: errors.append((kind, frames)),
        clock=lambda: loop.now,
    )
    for _ in range(2):
        client = loop.connect()
        client.sendall(b"POST / HTTP/1.1\r\nAuthorization: Bearer tok-123\r\n\r\n")
        loop.turn()
        assert client.recv(16) == b""  # closed
    assert loop.drops == ["internal", "internal"]
    assert [kind for kind, _ in errors] == ["ValueError"]  # once per kind
    assert not any("tok-123" in line for _, frames in errors for line in frames)
    failing["on"] = False
    client = loop.connect()
    client.sendall(b"POST / HTTP/1.1\r\n\r\n")
    loop.turn()
    assert len(loop.heads) == 1


def test_a_head_in_pieces_is_handed_over_whole_with_what_followed_it(loop: Loop) -> None:
    client = loop.connect()
    client.sendall(b"POST /status/sync HTTP/1.1\r\nHost: x\r")
    loop.turn()
    assert loop.heads == []
    assert loop.edge.counts()["reading_headers"] == 1
    client.sendall(b"\n\r\n{body")
    loop.turn()
    [(_, head, rest)] = loop.heads
    assert head == b"POST /status/sync HTTP/1.1\r\nHost: x\r\n\r\n" and rest == b"{body"


def test_a_head_that_never_completes_is_dropped_at_its_deadline_from_accept(loop: Loop) -> None:
    client = loop.connect()
    loop.now += 4.9
    client.sendall(b"POST / HTTP/1.1\r\n")  # a byte now and then restarts nothing
    loop.turn()
    assert loop.drops == []
    loop.now += 0.2
    loop.turn()
    assert loop.drops == ["head_deadline"] and loop.edge.open == 0
    assert client.recv(1) == b""


def test_a_head_over_its_bound_is_431_and_closed(loop: Loop) -> None:
    client = loop.connect()
    client.sendall(b"POST / HTTP/1.1\r\nX: " + b"a" * (edge.HEAD_LIMIT_BYTES + 1))
    loop.turn(6)
    assert loop.drops == ["head_too_large"]
    assert client.recv(64).startswith(b"HTTP/1.1 431 ")


def test_past_the_cap_the_oldest_unfinished_head_goes_then_the_oldest_idle_one(loop: Loop) -> None:
    in_call = loop.connect()
    in_call.sendall(b"POST / HTTP/1.1\r\n\r\n")
    loop.turn()
    [(call, _, _)] = loop.heads
    loop.edge.hand_off(call)
    idle = loop.connect()
    loop.called(idle)  # back from its call, idle
    silent = [loop.connect() for _ in range(6)]  # 8 open: the cap
    assert loop.edge.counts() == {
        "handshaking": 0,
        "reading_headers": 6,
        "reading_body": 0,
        "idle": 1,
        "in_call": 1,
        "closing": 0,
    }
    newcomer = loop.connect()
    assert loop.drops == ["over_capacity"]
    assert silent[0].recv(1) == b""  # the oldest that had not finished its head
    for _ in range(5):
        loop.connect()
    assert loop.edge.counts()["in_call"] == 1  # never a call in progress
    assert loop.edge.counts()["idle"] == 1  # heads went first
    del newcomer, idle


def test_an_idle_connection_closes_after_its_idle_timeout_and_a_new_head_restarts_the_clock(
    loop: Loop,
) -> None:
    client = loop.connect()
    connection = loop.called(client)
    loop.now += 2.0
    assert loop.called(client) is connection  # the next call on the same connection
    assert len(loop.heads) == 2
    loop.now += 3.1
    loop.turn()
    assert client.recv(1) == b"" and loop.drops == []  # an idle close is not a drop


def test_a_pipelined_head_is_read_from_what_the_call_left_buffered(loop: Loop) -> None:
    client = loop.connect()
    client.sendall(b"POST / HTTP/1.1\r\n\r\n")
    loop.turn()
    connection = loop.heads[0][0]
    loop.edge.hand_off(connection)
    loop.edge.resume(connection, b"POST /next HTTP/1.1\r\n\r\n")
    assert loop.heads[1][1] == b"POST /next HTTP/1.1\r\n\r\n"


def test_an_answer_is_sent_whole_then_the_connection_closes_after_reading_what_is_left(
    loop: Loop,
) -> None:
    client = loop.connect()
    client.sendall(b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
    loop.turn()
    loop.edge.respond(loop.heads[0][0], edge.response_bytes(401, "no"))
    loop.turn()
    received = b""
    while chunk := client.recv(4096):
        received += chunk
    assert received.startswith(b"HTTP/1.1 401 ") and received.endswith(b'{"error":"no"}')
    assert loop.edge.counts()["closing"] == 1  # lingering for the peer's close
    client.close()
    loop.turn()
    assert loop.edge.open == 0


def test_a_client_gone_before_its_head_is_counted_by_where_it_stopped(loop: Loop) -> None:
    """Connect-and-close churn is visible: a peer gone with its head unfinished is a drop."""
    silent = loop.connect()
    silent.close()
    halfway = loop.connect()
    halfway.sendall(b"POST / HTTP/1.1\r\n")
    loop.turn()
    halfway.close()
    loop.turn()
    assert loop.edge.open == 0
    assert loop.drops == ["closed_in_head", "closed_in_head"]


def test_a_peer_that_does_not_read_its_answer_loses_the_connection_at_its_deadline(
    loop: Loop,
) -> None:
    """An answer on a kept-alive connection is written under a deadline like a head is read
    under one: a peer that never reads it holds neither the connection nor the answer past it."""
    client = loop.connect()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.sendall(b"POST / HTTP/1.1\r\n\r\n")
    loop.turn()
    connection = loop.heads[-1][0]
    loop.edge.hand_off(connection)
    loop.edge.answer(connection, b"x" * (32 * 1024 * 1024), keep_alive=True)
    loop.turn()
    assert connection.outgoing  # the peer reads nothing: most of it is still to send
    loop.now += 4.9  # within the head deadline (5 s)
    loop.turn()
    assert loop.drops == [] and loop.edge.open == 1
    loop.now += 0.2
    loop.turn()
    assert loop.drops == ["answer_deadline"] and loop.edge.open == 0
    assert connection.sock.fileno() == -1  # closed, and what it held let go


def test_an_answer_counts_in_the_ports_share_until_it_is_sent_or_its_peer_is_gone(
    loop: Loop,
) -> None:
    """Anonymous reviews whose answers are never read held their answers outside any bound: the
    answer's bytes count in the share the port's bodies take from until the last is sent, and
    while they do, a body that does not fit beside them waits its turn (429)."""
    share = edge.Allowance(1024 * 1024)
    unread, reader = loop.connect(), loop.connect()
    unread.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    for client in (unread, reader):
        client.sendall(b"POST / HTTP/1.1\r\n\r\n")
        loop.turn()
    (held, _, _), (read, _, _) = loop.heads
    for connection in (held, read):
        loop.edge.hand_off(connection)
    loop.edge.answer(held, b"x" * (32 * 1024 * 1024), keep_alive=True, allowance=share)
    loop.edge.answer(read, b"y" * 1000, keep_alive=False, allowance=share)
    loop.turn()
    assert reader.recv(4096).endswith(b"y" * 1000)
    assert share.used_bytes == 32 * 1024 * 1024  # the answer read is given back, not the other
    assert not share.take(edge.SOCKET_BYTES)  # no room for a body beside it
    loop.now += 5.1  # the answer's deadline: the head deadline
    loop.turn()
    assert loop.drops == ["answer_deadline"] and share.used_bytes == 0


def test_a_kept_alive_connection_closed_between_requests_is_not_a_drop(loop: Loop) -> None:
    client = loop.connect()
    loop.called(client)
    client.close()
    loop.turn()
    assert loop.edge.open == 0 and loop.drops == []


def test_a_tls_client_gone_in_its_handshake_is_counted_so(tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    running = Loop(tls=edge.TlsSource(tmp_path / "tls.crt", tmp_path / "tls.key"))
    try:
        running.connect().close()
        running.turn()
        assert running.drops == ["closed_in_handshake"] and running.edge.open == 0
    finally:
        running.close()


def test_past_the_bound_on_held_bytes_the_oldest_unfinished_head_goes_never_a_call() -> None:
    """Heads and idle connections are bounded as a whole: each counts its buffers and the bytes
    of its head; past the bound the oldest unfinished head goes first, then the oldest idle one,
    never a call in progress."""
    running = Loop(max_connections=100, held_bytes_limit=3 * edge.SOCKET_BYTES + 1000)
    try:
        in_call = running.connect()
        in_call.sendall(b"POST / HTTP/1.1\r\n\r\n")
        running.turn()
        running.edge.hand_off(running.heads[0][0])
        idle = running.connect()
        running.called(idle)
        first, second = running.connect(), running.connect()
        assert running.edge.held_bytes == 3 * edge.SOCKET_BYTES  # the call holds none
        second.sendall(b"POST / HTTP/1.1\r\nX: " + b"a" * 900)
        running.turn()
        assert running.drops == []
        first.sendall(b"POST / HTTP/1.1\r\nX: " + b"b" * 900)  # over: the oldest head goes
        running.turn()
        assert running.drops == ["over_memory"] and first.recv(1) == b""
        newest = running.connect()
        newest.sendall(b"POST / HTTP/1.1\r\nX: " + b"d" * 200)  # over again: `second` now
        running.turn()
        assert running.drops == ["over_memory", "over_memory"] and second.recv(1) == b""
        assert running.edge.counts()["idle"] == 1  # heads went first
        running.edge.close_all()
        running.heads.clear()
        later = running.connect()
        later.sendall(b"POST / HTTP/1.1\r\n\r\n")
        running.turn()
        connection = running.heads[-1][0]
        running.edge.hand_off(connection)
        idle = [running.connect() for _ in range(3)]
        for client in idle:
            running.called(client)
        assert running.edge.counts()["idle"] == 3
        running.connect()  # the newest head is the oldest unfinished one: it goes, idle stay
        assert running.drops[-1] == "over_memory" and running.edge.counts()["idle"] == 3
        running.edge.resume(connection, b"")  # back idle, over the bound: the oldest idle goes
        assert idle[0].recv(1) == b"" and running.edge.counts()["idle"] == 3
        assert running.edge.held_bytes <= 3 * edge.SOCKET_BYTES + 1000
    finally:
        running.close()


def test_the_loop_sleeps_no_longer_than_the_next_deadline(loop: Loop) -> None:
    assert loop.edge.timeout() == edge.TICK_SECONDS
    loop.connect()
    loop.now += 4.5
    assert loop.edge.timeout() == pytest.approx(0.5)
    loop.now += 1
    assert loop.edge.timeout() == 0.0


def test_a_stopping_worker_keeps_idle_connections_only_briefly(loop: Loop) -> None:
    client = loop.connect()
    loop.called(client)
    loop.edge.linger_idle(1.0)
    loop.now += 1.1
    loop.turn()
    assert client.recv(1) == b""


def handshaken(running: Loop, tls: ssl.SSLSocket) -> None:
    """The client's side of a TLS handshake with the edge, the loop turned as it needs."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            tls.do_handshake()
            break
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            running.turn(1)
    running.turn()


def test_a_tls_edge_counts_a_connection_as_handshaking_until_its_handshake_is_done(
    tmp_path: Path,
) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    running = Loop(tls=edge.TlsSource(tmp_path / "tls.crt", tmp_path / "tls.key"))
    try:
        raw = running.connect()
        assert running.edge.counts()["handshaking"] == 1
        assert running.edge.held_bytes == edge.SOCKET_BYTES  # no TLS state until it sends
        # one state at a time: the states add up to what is open
        assert running.edge.counts()["reading_headers"] == 0
        client = ssl.create_default_context()
        ca.configure_trust(client)
        raw.setblocking(False)
        tls = client.wrap_socket(raw, server_hostname="127.0.0.1", do_handshake_on_connect=False)
        handshaken(running, tls)
        assert running.edge.counts()["handshaking"] == 0
        assert running.edge.counts()["reading_headers"] == 1
        assert running.edge.held_bytes == edge.SOCKET_BYTES + edge.TLS_BYTES
        tls.setblocking(True)
        tls.sendall(b"POST / HTTP/1.1\r\n\r\n")
        running.turn()
        assert len(running.heads) == 1
    finally:
        running.close()


@pytest.fixture
def pki_files(tmp_path: Path) -> tuple[Path, trustme.CA]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    return tmp_path, ca


def handshake(running: Loop, client: ssl.SSLContext | None) -> None:
    """A client's handshake with the loop's edge (plain HTTP when `client` is None), driven
    until one side gives up."""
    raw = running.connect()
    if client is None:
        raw.sendall(b"POST /status/sync HTTP/1.1\r\nHost: x\r\n\r\n")
        running.turn()
        return
    raw.setblocking(False)
    tls = client.wrap_socket(raw, server_hostname="127.0.0.1", do_handshake_on_connect=False)
    deadline = time.monotonic() + 2
    with tls:
        while time.monotonic() < deadline and not running.tls_failures:
            try:
                tls.do_handshake()
                tls.setblocking(True)
                tls.sendall(b"x")  # TLS 1.3: the server judges the client's certificate late
                running.turn()
                tls.setblocking(False)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                running.turn(1)
            except (ssl.SSLError, OSError):
                running.turn()
                break


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("a client trusting another CA", "certificate_rejected"),
        ("plain HTTP on the TLS port", "plain_http"),
        ("no client certificate where one is required", "client_certificate"),
    ],
)
def test_a_failed_handshake_is_counted_by_whom_it_points_at(
    pki_files: tuple[Path, trustme.CA], case: str, reason: str
) -> None:
    folder, ca = pki_files
    client_ca = folder / "ca.crt" if reason == "client_certificate" else None
    running = Loop(tls=edge.TlsSource(folder / "tls.crt", folder / "tls.key", client_ca))
    client: ssl.SSLContext | None = ssl.create_default_context()
    (trustme.CA() if reason == "certificate_rejected" else ca).configure_trust(client)
    if reason == "plain_http":
        client = None
    try:
        handshake(running, client)
        assert running.tls_failures == [reason], case
        assert running.drops == ["handshake_failed"]
    finally:
        running.close()


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("TLSV1_ALERT_UNKNOWN_CA", "certificate_rejected"),
        ("SSLV3_ALERT_CERTIFICATE_EXPIRED", "certificate_rejected"),
        ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "client_certificate"),
        ("CERTIFICATE_VERIFY_FAILED", "client_certificate"),
        ("HTTP_REQUEST", "plain_http"),
        ("WRONG_VERSION_NUMBER", "protocol"),
        ("NO_SHARED_CIPHER", "protocol"),
        ("UNSUPPORTED_PROTOCOL", "protocol"),
        ("SOMETHING_NEW", "other"),
        (None, "other"),
    ],
)
def test_each_openssl_reason_of_a_failed_handshake_maps_to_one_bounded_reason(
    code: str | None, reason: str
) -> None:
    error = ssl.SSLError(1, "failed")
    error.reason = code  # type: ignore[misc]
    assert edge.tls_failure_reason(error) == reason
    assert reason in edge.TLS_FAILURE_REASONS


def test_the_client_certificate_expiry_follows_the_certificate_last_presented(
    tmp_path: Path,
) -> None:
    """After a documented renewal, Metacontroller presents the new certificate: the gauge (and
    GPUClassHookClientCertificateExpiresSoon) follow it, not the first one a worker saw."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    leaf.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "client-ca.crt"))
    running = Loop(
        tls=edge.TlsSource(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "client-ca.crt")
    )
    seen = []
    try:
        for days in (10, 90):
            client_cert = ca.issue_cert(
                "metacontroller", not_after=datetime.now(UTC) + timedelta(days=days)
            )
            client = ssl.create_default_context()
            ca.configure_trust(client)
            client_cert.configure_cert(client)
            raw = running.connect()
            raw.setblocking(False)
            tls = client.wrap_socket(
                raw, server_hostname="127.0.0.1", do_handshake_on_connect=False
            )
            handshaken(running, tls)
            seen.append(running.edge.client_not_after)
            tls.close()
        assert seen[1] - seen[0] == pytest.approx(80 * 86400, abs=60)
    finally:
        running.close()


# -- bodies read by the loop (the admission port) -----------------------------------------------


class Bodies:
    """What `read_body` handed over, and the allowance it took from."""

    def __init__(self, limit_bytes: int) -> None:
        self.allowance = edge.Allowance(limit_bytes)
        self.received: list[tuple[edge.Connection, bytes, Any]] = []

    def read(self, loop: Loop, length: int, deadline: float = 110.0) -> edge.Connection:
        connection, head, rest = loop.heads[-1]
        loop.edge.read_body(
            connection,
            head,
            length,
            rest,
            deadline=deadline,
            allowance=self.allowance,
            on_body=lambda c, h, body, release: self.received.append((c, body, release)),
        )
        return connection


def test_a_body_is_read_by_the_loop_and_handed_over_whole_with_its_memory(loop: Loop) -> None:
    bodies = Bodies(1024 * 1024)
    client = loop.connect()
    client.sendall(b"POST /admit HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123")
    loop.turn()
    bodies.read(loop, 10)
    assert loop.edge.counts()["reading_body"] == 1
    assert bodies.allowance.used_bytes == edge.SOCKET_BYTES + 4
    client.sendall(b"456789")
    loop.turn()
    [(_, body, release)] = bodies.received
    assert body == b"0123456789" and loop.edge.counts()["in_call"] == 1
    assert bodies.allowance.used_bytes == edge.SOCKET_BYTES + 10  # held until released
    release()
    release()  # once, however often
    assert bodies.allowance.used_bytes == 0


def test_a_declared_length_takes_nothing_until_its_bytes_arrive(loop: Loop) -> None:
    bodies = Bodies(1024 * 1024)
    client = loop.connect()
    client.sendall(b"POST /admit HTTP/1.1\r\nContent-Length: 7340032\r\n\r\n")
    loop.turn()
    bodies.read(loop, 7 * 1024 * 1024)
    loop.turn()
    assert bodies.allowance.used_bytes == edge.SOCKET_BYTES
    client.sendall(b"x" * 1000)
    loop.turn()
    assert bodies.allowance.used_bytes == edge.SOCKET_BYTES + 1000


def test_a_body_not_whole_by_its_deadline_is_408_and_gives_its_memory_back(loop: Loop) -> None:
    bodies = Bodies(1024 * 1024)
    client = loop.connect()
    client.sendall(b"POST /admit HTTP/1.1\r\nContent-Length: 10\r\n\r\n01")
    loop.turn()
    bodies.read(loop, 10, deadline=loop.now + 3)
    assert loop.edge.timeout() <= 3
    loop.now += 3.1
    loop.turn()
    assert loop.drops == ["body_deadline"] and bodies.received == []
    assert client.recv(64).startswith(b"HTTP/1.1 408 ")
    assert bodies.allowance.used_bytes == 0


def test_a_peer_gone_mid_body_is_counted_and_gives_its_memory_back(loop: Loop) -> None:
    bodies = Bodies(1024 * 1024)
    client = loop.connect()
    client.sendall(b"POST /admit HTTP/1.1\r\nContent-Length: 10\r\n\r\n01")
    loop.turn()
    bodies.read(loop, 10)
    client.close()
    loop.turn()
    assert loop.drops == ["closed_in_body"] and bodies.allowance.used_bytes == 0
    assert loop.edge.open == 0


def test_when_the_allowance_is_used_up_the_oldest_body_still_arriving_goes(loop: Loop) -> None:
    bodies = Bodies(3 * edge.SOCKET_BYTES)
    clients = []
    for _ in range(2):
        client = loop.connect()
        client.sendall(b"POST /admit HTTP/1.1\r\nContent-Length: 100000\r\n\r\n")
        loop.turn()
        bodies.read(loop, 100000)
        clients.append(client)
    clients[1].sendall(b"y" * (edge.SOCKET_BYTES + 1))  # past the allowance: the oldest goes
    loop.turn()
    assert loop.drops == ["over_memory"] and clients[0].recv(1) == b""
    assert bodies.allowance.used_bytes == 2 * edge.SOCKET_BYTES + 1


def test_a_body_that_fits_only_without_the_calls_being_judged_is_429(loop: Loop) -> None:
    bodies = Bodies(2 * edge.SOCKET_BYTES + 100)
    judged = loop.connect()
    judged.sendall(b"POST /admit HTTP/1.1\r\nContent-Length: 100\r\n\r\n" + b"j" * 100)
    loop.turn()
    bodies.read(loop, 100)
    assert len(bodies.received) == 1  # being judged: its memory stays taken
    late = loop.connect()
    late.sendall(b"POST /admit HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + b"k" * 5000)
    loop.turn()
    bodies.read(loop, 5000)
    loop.turn()
    answer = late.recv(256)
    assert answer.startswith(b"HTTP/1.1 429 ") and b"Retry-After: 1" in answer
    assert bodies.allowance.used_bytes == edge.SOCKET_BYTES + 100


def test_an_answer_sent_by_the_loop_keeps_the_connection_for_its_next_request(loop: Loop) -> None:
    bodies = Bodies(1024 * 1024)
    client = loop.connect()
    client.sendall(b"POST /admit HTTP/1.1\r\nContent-Length: 2\r\n\r\nok")
    loop.turn()
    bodies.read(loop, 2)
    connection = bodies.received[0][0]
    loop.edge.answer(connection, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", keep_alive=True)
    assert client.recv(64) == b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    assert loop.edge.counts()["idle"] == 1
    client.sendall(b"POST /admit HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    loop.turn()
    assert loop.heads[-1][0] is connection and len(loop.heads) == 2
    loop.edge.answer(connection, b"HTTP/1.1 200 OK\r\n\r\n", keep_alive=False)
    loop.turn()
    assert client.recv(64) == b"HTTP/1.1 200 OK\r\n\r\n" and client.recv(1) == b""


def test_past_the_bound_heads_holding_bytes_go_before_connections_that_sent_nothing() -> None:
    """Dropping a connection that sent nothing frees a bare socket's worth and makes its client
    connect again: the oldest head holding bytes goes first."""
    running = Loop(max_connections=100, held_bytes_limit=3 * edge.SOCKET_BYTES + 1500)
    try:
        silent = running.connect()
        talking = running.connect()
        talking.sendall(b"POST / HTTP/1.1\r\nX: " + b"a" * 900)
        running.turn()
        newer = running.connect()
        newer.sendall(b"POST / HTTP/1.1\r\nX: " + b"b" * 900)  # over: `talking` goes
        running.turn()
        assert running.drops == ["over_memory"] and talking.recv(1) == b""
        assert running.edge.counts()["reading_headers"] == 2  # `silent`, older, stays
        del silent
    finally:
        running.close()
