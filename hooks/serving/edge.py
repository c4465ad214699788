"""The edge of every port: a connection's TLS handshake, request line and headers, read by an
event loop under one deadline from accept, before anything else is spent on it.

gunicorn's threaded worker does both in a pool thread, on a blocking socket, without a deadline:
a client that trickles its headers, stalls its handshake, or connects and sends nothing holds a
thread for as long as it likes. Here such a client costs a socket and a few hundred bytes in a
selector until its deadline. Only a complete head goes further (to a hook thread, or to a
listener's answer); idle keep-alive connections wait here too, and every close that lingers for
the peer's unread input lingers here, not in a thread. Past the cap on open connections, or on
the bytes that connections outside a call hold (their heads and buffers, bounded as a whole), the
oldest that have not finished their head are dropped first, then the oldest idle ones; a call in
progress never is.

For callers that present no token (the API server's admission reviews), the loop reads the body
as well (`read_body`): under a deadline by its length, with memory taken for the bytes received,
not for the length declared, so that such a caller costs no thread until its request is whole.

One `Edge` serves one selector, driven by one thread: every method but `counts` runs on it.
"""

from __future__ import annotations

import enum
import math
import os
import re
import socket
import ssl
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from selectors import EVENT_READ, EVENT_WRITE, BaseSelector
from typing import Any
from urllib.parse import unquote

import msgspec

from hooks.wire import certificates

# The request line and headers together; larger is 431 (a hook call's head is a few hundred
# bytes; Go's and nginx's defaults sit on either side of this bound).
HEAD_LIMIT_BYTES = 64 * 1024
# How much one read of a head takes: a TLS record's payload at most, so a head rarely needs two.
HEAD_READ_BYTES = 16 * 1024
# A connection being closed: how long, and how much, of the peer's unread input is taken before
# the close (closing with input unread resets the connection and can cut the answer short).
CLOSE_LINGER_SECONDS = 2.0
CLOSE_DRAIN_BYTES = 64 * 1024
# The longest the loop sleeps: how late a deadline can be enforced.
TICK_SECONDS = 1.0
# What a connection outside a call holds besides the bytes of its head: its socket and records,
# and, once it sends on a TLS port, its TLS state and buffers (docs/scale.md has the measurement).
SOCKET_BYTES = 2 * 1024
TLS_BYTES = 16 * 1024
# How much one read of a body takes (a body read by the loop: `Edge.read_body`).
BODY_READ_BYTES = 256 * 1024


class State(enum.Enum):
    HANDSHAKING = "handshaking"
    READING_HEADERS = "reading_headers"
    READING_BODY = "reading_body"
    IDLE = "idle"
    IN_CALL = "in_call"
    CLOSING = "closing"


# Why a connection was closed before its request was served: its deadline, its size, the cap on
# connections or on the bytes they hold, a failed handshake, a socket that failed after it, the
# peer closing before its handshake, its head or its body was complete (a kept-alive connection
# closed between requests is not counted: that is how keep-alive ends), a peer that did not read
# its answer in time, or an error of the service's own while handling it (`internal`: logged,
# and the loop goes on).
DROP_REASONS = (
    "head_deadline",
    "head_too_large",
    "over_capacity",
    "over_memory",
    "handshake_failed",
    "malformed",
    "closed_in_handshake",
    "closed_in_head",
    "closed_in_body",
    "body_deadline",
    "answer_deadline",
    "internal",
)

# Why a TLS handshake failed, as far as it tells whom to look at: the peer refused the served
# certificate (an old CA in its trust), the peer's certificate was missing or refused, the peer
# spoke plain HTTP to the TLS port, or no version or cipher was shared.
_TLS_FAILURES = {
    "certificate_rejected": (
        "ALERT_UNKNOWN_CA",
        "ALERT_BAD_CERTIFICATE",
        "ALERT_CERTIFICATE_UNKNOWN",
        "ALERT_CERTIFICATE_EXPIRED",
        "ALERT_UNSUPPORTED_CERTIFICATE",
    ),
    "client_certificate": (
        "PEER_DID_NOT_RETURN_A_CERTIFICATE",
        "CERTIFICATE_VERIFY_FAILED",
        "NO_CERTIFICATE_RETURNED",
    ),
    "plain_http": ("HTTP_REQUEST", "HTTPS_PROXY_REQUEST"),
    "protocol": (
        "WRONG_VERSION_NUMBER",
        "UNSUPPORTED_PROTOCOL",
        "UNKNOWN_PROTOCOL",
        "NO_SHARED_CIPHER",
        "NO_PROTOCOLS_AVAILABLE",
        "VERSION_TOO_LOW",
        "ALERT_PROTOCOL_VERSION",
        "NO_APPLICATION_PROTOCOL",
    ),
}
TLS_FAILURE_REASONS = (*_TLS_FAILURES, "other")


def tls_failure_reason(error: ssl.SSLError) -> str:
    """One of TLS_FAILURE_REASONS for OpenSSL's reason code of a failed handshake."""
    code = (error.reason or "").upper()
    for reason, codes in _TLS_FAILURES.items():
        if any(part in code for part in codes):
            return reason
    return "other"


@dataclass(frozen=True)
class Head:
    """A request's line and headers, as far as the edge decides on them."""

    method: str
    path: str  # percent-decoded, without the query
    headers: Mapping[str, str]  # lower-case names; repeated ones joined by ", "

    def content_length(self) -> int | None:
        """The declared length: ASCII digits only (RFC 9110: `1*DIGIT`), bounded before they are
        converted; -1 when it is not a number (the caller refuses it); past any length a body
        could have, `TOO_LONG` (the caller refuses it as too large)."""
        text = self.headers.get("content-length")
        if text is None:
            return None
        if not (text.isascii() and text.isdigit()):
            return -1
        return int(text) if len(text) <= LENGTH_DIGITS else TOO_LONG

    @property
    def chunked(self) -> bool:
        return "transfer-encoding" in self.headers


# A declared length of more digits than this is past any body (and past int64).
LENGTH_DIGITS = 18
TOO_LONG = 10**LENGTH_DIGITS
_TOKEN_CHARACTERS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")
_METHOD_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
# RFC 9112 3.2: the absolute-form's scheme and authority (a host name, an IPv4 address or a
# bracketed IPv6 one, and a port), before its path.
_ABSOLUTE_FORM = re.compile(
    r"[A-Za-z][A-Za-z0-9+.-]*://(?:[A-Za-z0-9._~-]*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{0,5})?(?=[/?]|$)"
)


@dataclass(frozen=True)
class Refused:
    """A head that is refused as it is read: its status (400, or 414 for a target too long) and
    why, in a few words that never quote it."""

    code: int
    message: str


# The longest request target read (RFC 9112 3: 8,000 octets at least must be supported).
TARGET_LIMIT = 8192
NOT_HTTP = Refused(400, "not an HTTP/1.x request")


def _target_path(target: str) -> str | Refused:
    """The path of a request target in origin-form or absolute-form, or why not: the asterisk-
    and authority-forms name no route; no form allows control characters, a fragment, or an
    authority that is no host."""
    if len(target) > TARGET_LIMIT:
        return Refused(414, f"the request target is over {TARGET_LIMIT} bytes")
    if any(c <= " " or c == "\x7f" or c == "#" for c in target):
        return Refused(400, "the request target holds a character no target may")
    if target.startswith("/"):
        return target
    match = _ABSOLUTE_FORM.match(target)
    if match is None:
        return Refused(400, "the request target is neither a path nor an absolute URL")
    return target[match.end() :] or "/"


def parse_head(data: bytes) -> Head | Refused:
    """The head of one HTTP/1.x request (up to and with its blank line), or why it is refused:
    total, every byte sequence gives one of the two. gunicorn parses it again, strictly, in the
    thread; this reading only decides what the edge refuses, and the app checks the same again,
    so a difference can refuse, never admit. Refused as RFC 9112 says: a line folded onto the one
    before (obs-fold), a bare CR or LF, `Transfer-Encoding` beside `Content-Length`."""
    lines = data.decode("latin-1").split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        return Refused(400, "a bare CR or LF in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        return NOT_HTTP
    method, target, _ = parts
    if not method or not set(method) <= _METHOD_CHARACTERS:
        return NOT_HTTP
    path = _target_path(target)
    if isinstance(path, Refused):
        return path
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        name = name.lower()
        if not colon or not name or not set(name) <= _TOKEN_CHARACTERS:
            # a folded line starts with a space: no header name
            return Refused(400, "a header line that is no `name: value`")
        value = value.strip(" \t")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if "transfer-encoding" in headers and "content-length" in headers:
        return Refused(400, "Transfer-Encoding beside Content-Length")
    return Head(method, unquote(path.split("?", 1)[0]), headers)


def response_bytes(code: int, message: str, extra: Mapping[str, str] | None = None) -> bytes:
    """A whole JSON error answer that closes its connection."""
    body = msgspec.json.encode({"error": message})
    lines = [
        f"HTTP/1.1 {code} {HTTPStatus(code).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (extra or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class TlsSource:
    """The serving certificate as SSL contexts, loaded again when its files change: a process
    reads its pair here once for all its ports, so that every port serves the same pair.

    Files mounted from a Secret change by an atomic swap of the directory they sit in, which a
    reader can straddle (the certificate of one generation, the key of the other): a pair that
    fails to load, or whose files changed while they were read, is not taken; the contexts in use
    are kept and the load is tried again on the next connection. A pair is never served half from
    one generation and half from another, nor one generation on one port and another on the next.
    """

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self.files = self._files = (cert, key, *((client_ca,) if client_ca else ()))
        self._client_ca = client_ca
        self._stamp: tuple[tuple[int, int, int], ...] | None = None
        self.problem: str | None = None  # why the files, changed, do not load (None: they do)
        self._reloading = threading.Lock()
        # a pair that does not load at start is a boot failure
        self._contexts, self.not_after = self._load()
        self._stamp = self._stamps()

    def _stamps(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            infos = [os.stat(path) for path in self._files]
        except OSError:
            return None
        return tuple((info.st_ino, info.st_mtime_ns, info.st_size) for info in infos)

    def _load(self) -> tuple[dict[bool, ssl.SSLContext], float]:
        """The contexts (by whether they ask for a client certificate), and when the certificate
        ends (NaN if it cannot be read: a certificate OpenSSL serves is served, whether this module
        can read its end or not)."""
        pem = self._files[0].read_bytes()
        contexts = {}
        for verify_clients in (False, True):
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(str(self._files[0]), str(self._files[1]))
            if verify_clients and self._client_ca is not None:
                context.load_verify_locations(cafile=str(self._client_ca))
                context.verify_mode = ssl.CERT_REQUIRED
            context.set_alpn_protocols(["http/1.1"])
            contexts[verify_clients] = context
        try:
            ends = certificates.not_after(pem)
        except certificates.NotACertificate:
            ends = math.nan
        return contexts, ends

    def context(self, verify_clients: bool = True) -> ssl.SSLContext:
        """The current context: the files' if they changed and load as a pair, else the last.
        `verify_clients`: it asks for a certificate of the client CA, when there is one (the hook
        port; the metrics and admission ports never do). Safe from any thread."""
        before = self._stamps()
        if before is None or before == self._stamp:
            self.problem = "a file is missing" if before is None else None
            return self._contexts[verify_clients]
        with self._reloading:
            self._reload(before)
        return self._contexts[verify_clients]

    def _reload(self, before: tuple[tuple[int, int, int], ...]) -> None:
        try:
            contexts, ends = self._load()
        except (OSError, ssl.SSLError, ValueError) as error:
            # straddled a swap, a file missing for a moment, or a pair that will never load: the
            # last good one is served; `problem` says why (a watcher reports it if it lasts)
            self.problem = _load_problem(error)
            return
        self.problem = None
        if self._stamps() != before:
            return  # the files moved while they were read: the next connection loads them again
        self._contexts, self.not_after, self._stamp = contexts, ends, before


def _load_problem(error: BaseException) -> str:
    """Why a pair did not load, in words that name no content."""
    if isinstance(error, FileNotFoundError):
        return "a file is missing"
    if isinstance(error, ssl.SSLError):
        return f"does not load: {getattr(error, 'reason', None) or type(error).__name__}"
    if isinstance(error, OSError):
        return f"unreadable ({error.strerror})"
    return "does not load"


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    address: Any
    state: State
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    outgoing: bytes = b""
    drained: int = 0
    handshaken: bool = False
    # Bytes counted against the edge's bound while outside a call (its buffers, its head).
    held: int = 0
    # Requests taken from it so far: a close after one is keep-alive's end, not a drop.
    requests: int = 0
    body: BodyRead | None = None  # the body the loop is reading (`Edge.read_body`)
    # Read past the request being served: the start of the next one, for `Edge.answer`.
    pending: bytes = b""
    # The answer being sent counts in this allowance until it is sent or the connection goes.
    sending_from: Allowance | None = None
    sending_held: int = 0
    accepted_at: float = 0.0
    # When the request being read began: at accept, or when a kept-alive connection sent again.
    head_started: float = 0.0
    # What the owner of the loop keeps with a connection between its calls (gunicorn's TConn).
    owner_state: Any = None


# What the owner does with a complete head: (connection, head bytes, bytes read past the head).
OnHead = Callable[[Connection, bytes, bytes], None]
# What the owner does with a whole body: (connection, head bytes, body, its memory's release).
OnBody = Callable[[Connection, bytes, bytes, Callable[[], None]], None]


class Allowance:
    """Bytes a group of connections may hold at once: taken by the loop as they arrive, given
    back by whoever ends their use (the loop, or the thread that served them)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        return self._used

    def take(self, count: int) -> bool:
        with self._lock:
            if self._used + count > self.limit_bytes:
                return False
            self._used += count
            return True

    def hold(self, count: int) -> None:
        """Count bytes that are held already (an answer made): over the limit too, so that what
        arrives next waits for them to go."""
        with self._lock:
            self._used += count

    def give(self, count: int) -> None:
        with self._lock:
            self._used -= count


@dataclass(eq=False)
class BodyRead:
    """A body the loop reads: what it has of it, until when, and what it took of the allowance."""

    head: bytes
    length: int
    on_body: OnBody
    allowance: Allowance
    data: bytearray = field(default_factory=bytearray)
    taken: int = 0

    def take(self, count: int) -> bool:
        if not self.allowance.take(count):
            return False
        self.taken += count
        return True

    def give(self, count: int) -> None:
        self.taken -= count
        self.allowance.give(count)

    def release(self) -> None:
        """Give back all it took (once, however often it is called)."""
        self.give(self.taken)


class Edge:
    """Connections from accept to hand-off, and back for keep-alive, on one selector."""

    def __init__(
        self,
        selector: BaseSelector,
        on_head: OnHead,
        *,
        head_seconds: float,
        idle_seconds: float,
        max_connections: int,
        held_bytes_limit: int,
        tls: TlsSource | None = None,
        verify_clients: bool = True,
        on_drop: Callable[[str], None] = lambda reason: None,
        on_tls_failure: Callable[[str], None] = lambda reason: None,
        on_error: Callable[[str, list[str]], None] = lambda kind, frames: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._selector = selector
        self._on_head = on_head
        self._head_seconds = head_seconds
        self._idle_seconds = idle_seconds
        self._max_connections = max_connections
        self._held_bytes_limit = held_bytes_limit
        self._tls = tls
        self._verify_clients = verify_clients
        self._on_drop = on_drop
        self._on_tls_failure = on_tls_failure
        self._on_error = on_error
        self._clock = clock
        # Each in the order of its deadlines (every connection of a state has the same timeout,
        # counted from when it entered it): expiry and "oldest first" both read from the front.
        self._arriving: OrderedDict[Connection, None] = OrderedDict()
        self._idle: OrderedDict[Connection, None] = OrderedDict()
        self._closing: OrderedDict[Connection, None] = OrderedDict()
        # Kept-alive connections sending a call's answer.
        self._answering: OrderedDict[Connection, None] = OrderedDict()
        # In the order they began (their deadlines follow their lengths).
        self._bodies: OrderedDict[Connection, None] = OrderedDict()
        self._in_call: set[Connection] = set()
        self._handshaking = 0
        self._held = 0  # bytes held by the connections in `_arriving` and `_idle`
        # When the last client certificate presented ends (NaN until one is): Metacontroller keeps
        # presenting the one it read when it built its controllers, after cert-manager renewed it.
        self.client_not_after = math.nan
        self._logged_errors: set[str] = set()

    # -- what the owner calls ------------------------------------------------------------------

    @property
    def open(self) -> int:
        return (
            len(self._arriving)
            + len(self._idle)
            + len(self._closing)
            + len(self._bodies)
            + len(self._in_call)
        )

    @property
    def held_bytes(self) -> int:
        """What connections outside a call hold, as counted against `held_bytes_limit`."""
        return self._held

    def counts(self) -> dict[str, int]:
        """Open connections by state (read from any thread: a snapshot, not a transaction)."""
        handshaking = self._handshaking
        return {
            State.HANDSHAKING.value: handshaking,
            State.READING_HEADERS.value: max(len(self._arriving) - handshaking, 0),
            State.READING_BODY.value: len(self._bodies),
            State.IDLE.value: len(self._idle),
            State.IN_CALL.value: len(self._in_call),
            State.CLOSING.value: len(self._closing),
        }

    def accept(self, listener: socket.socket) -> None:
        """Take every connection waiting on the listener (a bounded number per wake-up)."""
        for _ in range(64):
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the peer gave up in the backlog, or no fd is left: try next time
                return
            sock.setblocking(False)
            if self.open >= self._max_connections and not self._make_room():
                self._on_drop("over_capacity")
                _close(sock)
                continue
            now = self._clock()
            connection = Connection(
                sock,
                address,
                State.HANDSHAKING,
                now + self._head_seconds,
                accepted_at=now,
                head_started=now,
            )
            if self._tls is None:
                connection.state = State.READING_HEADERS
            else:
                self._handshaking += 1
            self._arriving[connection] = None
            if not self._hold(connection, SOCKET_BYTES):
                continue
            # Wrapped for TLS only once it sends: a connection that never does costs no TLS state.
            self._watch(connection, EVENT_READ)

    def hand_off(self, connection: Connection) -> None:
        """The owner takes the connection (a call); it leaves the selector until `resume`."""
        self._leave(connection)
        connection.state = State.IN_CALL
        connection.requests += 1
        self._in_call.add(connection)

    def read_body(
        self,
        connection: Connection,
        head: bytes,
        length: int,
        rest: bytes,
        *,
        deadline: float,
        allowance: Allowance,
        on_body: OnBody,
    ) -> None:
        """Read the body of the request whose head this is, in the loop, by `deadline` (then 408),
        taking from `allowance` what the connection holds (its buffers, then each piece of the
        body as it arrives); when the allowance is used up, the oldest bodies still arriving are
        dropped to make room. `on_body` gets the whole body; the release it gets gives back what
        was taken, once the body is no longer held."""
        self._leave(connection)
        connection.requests += 1
        read = BodyRead(head, length, on_body, allowance)
        connection.body = read
        connection.state = State.READING_BODY
        connection.deadline = deadline
        self._bodies[connection] = None
        if not self._take_for_body(connection, _base_bytes(connection) + min(len(rest), length)):
            return
        read.data += rest[:length]
        connection.pending = rest[length:]
        self._read_body(connection)

    def answer(
        self,
        connection: Connection,
        data: bytes,
        *,
        keep_alive: bool,
        allowance: Allowance | None = None,
    ) -> None:
        """Send a call's whole answer from the loop; then the connection waits for its next
        request (`keep_alive`), or is closed. Until it is sent, the answer counts in `allowance`:
        a peer that reads slowly holds its answer in the memory of the port it called."""
        if not keep_alive:
            self.respond(connection, data, allowance=allowance)
            return
        self._set_outgoing(connection, data, allowance)
        # A peer has as long to read its answer as it had to send its head: one that does not
        # read loses the connection, and what it held.
        connection.deadline = self._clock() + self._head_seconds
        self._answering[connection] = None
        self._send_answer(connection)

    def resume(self, connection: Connection, buffered: bytes) -> None:
        """Back from a call that keeps the connection: idle until it sends, then a new head."""
        self._in_call.discard(connection)
        connection.head = bytearray(buffered)
        pending = isinstance(connection.sock, ssl.SSLSocket) and connection.sock.pending() > 0
        if buffered or pending:
            self._begin_head(connection)
            if self._hold(connection, _base_bytes(connection) + len(buffered)):
                self._advance(connection)
            return
        connection.state = State.IDLE
        connection.deadline = self._clock() + self._idle_seconds
        self._idle[connection] = None
        if self._hold(connection, _base_bytes(connection)):
            self._watch(connection, EVENT_READ)

    def respond(
        self, connection: Connection, data: bytes, *, allowance: Allowance | None = None
    ) -> None:
        """Send a whole answer, then close (its unread input lingered over, off any thread)."""
        self._leave(connection)
        connection.state = State.CLOSING
        self._set_outgoing(connection, data, allowance)
        connection.deadline = self._clock() + CLOSE_LINGER_SECONDS
        self._closing[connection] = None
        self._send(connection)

    def close(self, connection: Connection) -> None:
        """Close a connection whose exchange is over (nothing more to send)."""
        self.respond(connection, b"")

    def drop(self, connection: Connection, reason: str) -> None:
        self._on_drop(reason)
        self._forget(connection)

    def expire(self) -> None:
        """Close whatever is past its deadline."""
        now = self._clock()
        for group, reason in (
            (self._arriving, "head_deadline"),
            (self._idle, None),
            (self._closing, None),
            (self._answering, "answer_deadline"),
        ):
            while group:
                connection = next(iter(group))
                if connection.deadline > now:
                    break
                if reason is None:
                    self._forget(connection)
                else:
                    self.drop(connection, reason)
        for connection in [c for c in self._bodies if c.deadline <= now]:
            self._on_drop("body_deadline")
            message = "the request body did not arrive in time"
            self.respond(connection, response_bytes(408, message))

    def timeout(self) -> float:
        """How long the loop may sleep before a deadline is due."""
        groups = (self._arriving, self._idle, self._closing, self._answering)
        soonest = [next(iter(group)).deadline for group in groups if group]
        soonest += [connection.deadline for connection in self._bodies]
        if not soonest:
            return TICK_SECONDS
        return min(max(min(soonest) - self._clock(), 0.0), TICK_SECONDS)

    def linger_idle(self, seconds: float) -> None:
        """A stopping worker keeps idle connections at most this long more (a request already
        on its way is answered, with `Connection: close`)."""
        limit = self._clock() + seconds
        for connection in self._idle:
            connection.deadline = min(connection.deadline, limit)

    def close_all(self) -> None:
        for group in (self._arriving, self._idle, self._closing, self._bodies):
            for connection in list(group):
                self._forget(connection)
        for connection in list(self._in_call):
            self._forget(connection)

    # -- the states ----------------------------------------------------------------------------

    def _ready(self, connection: Connection, mask: int) -> None:
        if connection.state is State.CLOSING:
            if connection.outgoing:
                self._send(connection)
            else:
                self._drain(connection)
            return
        if connection.state is State.IN_CALL:
            self._send_answer(connection)
            return
        if connection.state is State.READING_BODY:
            self._read_body(connection)
            return
        if connection.state is State.IDLE:
            del self._idle[connection]
            self._begin_head(connection)
        self._advance(connection)

    def _begin_head(self, connection: Connection) -> None:
        connection.state = State.READING_HEADERS
        connection.head_started = self._clock()
        connection.deadline = connection.head_started + self._head_seconds
        self._arriving[connection] = None

    def _advance(self, connection: Connection) -> None:
        """Drive the handshake, then the head, as far as the socket allows."""
        try:
            if connection.state is State.HANDSHAKING:
                self._handshake(connection)
            head_end = connection.head.find(b"\r\n\r\n")
            while head_end < 0:
                if len(connection.head) > HEAD_LIMIT_BYTES:
                    self._on_drop("head_too_large")
                    self.respond(connection, response_bytes(431, "request head too large"))
                    return
                data = connection.sock.recv(HEAD_READ_BYTES)
                if not data:  # gone before its head was complete
                    self._peer_gone(connection)
                    return
                searched_from = max(len(connection.head) - 3, 0)
                connection.head += data
                if not self._hold(connection, len(data)):
                    return
                head_end = connection.head.find(b"\r\n\r\n", searched_from)
        except _Dropped:
            return
        except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
            self._watch(connection, EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(connection, EVENT_WRITE)
            return
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError, ConnectionError):
            self._peer_gone(connection)
            return
        except (ssl.SSLError, OSError) as error:
            if not connection.handshaken and isinstance(error, ssl.SSLError):
                self._on_tls_failure(tls_failure_reason(error))
            self.drop(connection, "handshake_failed" if not connection.handshaken else "malformed")
            return
        end = head_end + 4
        head, rest = bytes(connection.head[:end]), bytes(connection.head[end:])
        connection.head = bytearray()
        self._on_head(connection, head, rest)

    def _internal(self, connection: Connection, error: Exception) -> None:
        """What a connection's handling raised: the connection goes, counted; the first error of
        each kind is told (`on_error`: its type and frames; its message may quote the
        request)."""
        kind = type(error).__name__
        if kind not in self._logged_errors:
            self._logged_errors.add(kind)
            self._on_error(kind, traceback.format_tb(error.__traceback__)[-3:])
        with suppress(Exception):
            self.drop(connection, "internal")
            return
        self._forget(connection)

    def _peer_gone(self, connection: Connection) -> None:
        """The peer closed: the end of keep-alive between requests, else a request cut short."""
        if connection.requests and not connection.head:
            self._forget(connection)
        elif connection.state is State.HANDSHAKING:
            self.drop(connection, "closed_in_handshake")
        else:
            self.drop(connection, "closed_in_head")

    def _handshake(self, connection: Connection) -> None:
        if not isinstance(connection.sock, ssl.SSLSocket):
            assert self._tls is not None
            # A peer that connected and closed (connect-and-close churn) costs no TLS state.
            if connection.sock.recv(1, socket.MSG_PEEK) == b"":
                raise ConnectionResetError
            # Wrapping takes the descriptor over from the plain socket object: the selector is
            # told about the new object before it is watched again.
            with suppress(KeyError, ValueError, OSError):
                self._selector.unregister(connection.sock)
            if not self._hold(connection, TLS_BYTES):
                raise _Dropped
            connection.sock = self._tls.context(self._verify_clients).wrap_socket(
                connection.sock, server_side=True, do_handshake_on_connect=False
            )
        connection.sock.do_handshake()  # raises while it needs the peer
        connection.handshaken = True
        ends = (connection.sock.getpeercert() or {}).get("notAfter")
        if isinstance(ends, str):
            self.client_not_after = ssl.cert_time_to_seconds(ends)
        connection.state = State.READING_HEADERS
        self._handshaking -= 1

    def _read_body(self, connection: Connection) -> None:
        read = connection.body
        assert read is not None
        while len(read.data) < read.length:
            wanted = min(read.length - len(read.data), BODY_READ_BYTES)
            try:
                data = connection.sock.recv(wanted)
            except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                self._watch(connection, EVENT_READ)
                return
            except ssl.SSLWantWriteError:
                self._watch(connection, EVENT_WRITE)
                return
            except OSError:  # the TLS errors too: the peer went away, or broke the stream
                self.drop(connection, "closed_in_body")
                return
            if not data:
                self.drop(connection, "closed_in_body")
                return
            if not self._take_for_body(connection, len(data)):
                return
            read.data += data
        connection.body = None  # what the read took is the owner's to give back now
        self._leave(connection)
        connection.state = State.IN_CALL
        self._in_call.add(connection)
        read.on_body(connection, read.head, bytes(read.data), read.release)

    def _take_for_body(self, connection: Connection, count: int) -> bool:
        """Take `count` bytes of the allowance for this connection's body, dropping the oldest
        other bodies still arriving while it does not fit; if it fits only with the calls being
        served gone, the connection is answered 429 (its caller retries)."""
        read = connection.body
        assert read is not None
        while not read.take(count):
            oldest = next((other for other in self._bodies if other is not connection), None)
            if oldest is None:
                self._on_drop("over_memory")
                message = "the service holds as many admission bodies as it may: retry later"
                self.respond(connection, response_bytes(429, message, {"Retry-After": "1"}))
                return False
            self.drop(oldest, "over_memory")
        return True

    def _send_answer(self, connection: Connection) -> None:
        """Send an answer on a connection kept alive; then back to waiting for a request."""
        if self._flush(connection):
            self._answering.pop(connection, None)
            pending, connection.pending = connection.pending, b""
            self.resume(connection, pending)

    def _send(self, connection: Connection) -> None:
        if not self._flush(connection):
            return
        with suppress(OSError):
            # The plain socket's half-close: TLS's would want a close_notify exchange first.
            socket.socket.shutdown(connection.sock, socket.SHUT_WR)
        self._drain(connection)

    def _flush(self, connection: Connection) -> bool:
        """Send what is outgoing, as far as the socket takes it: True once all of it is sent;
        else the connection waits for the socket, or is gone."""
        try:
            while connection.outgoing:
                sent = connection.sock.send(connection.outgoing)
                connection.outgoing = connection.outgoing[sent:]
        except (ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
            self._watch(connection, EVENT_WRITE)
            return False
        except ssl.SSLWantReadError:
            self._watch(connection, EVENT_READ)
            return False
        except OSError:
            self._forget(connection)
            return False
        self._sent(connection)
        return True

    @staticmethod
    def _set_outgoing(connection: Connection, data: bytes, allowance: Allowance | None) -> None:
        connection.outgoing = data
        if allowance is not None:
            allowance.hold(len(data))
            connection.sending_from, connection.sending_held = allowance, len(data)

    @staticmethod
    def _sent(connection: Connection) -> None:
        """The answer is sent, or never will be: what it counted is given back."""
        if connection.sending_from is not None:
            connection.sending_from.give(connection.sending_held)
            connection.sending_from, connection.sending_held = None, 0

    def _drain(self, connection: Connection) -> None:
        """Take (and discard, undecrypted) the peer's input until it closes, the cap or the
        deadline."""
        try:
            while connection.drained < CLOSE_DRAIN_BYTES:
                data = socket.socket.recv(connection.sock, CLOSE_DRAIN_BYTES)
                if not data:
                    break
                connection.drained += len(data)
        except (BlockingIOError, InterruptedError):
            self._watch(connection, EVENT_READ)
            return
        except OSError:
            pass
        self._forget(connection)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _hold(self, connection: Connection, count: int) -> bool:
        """Count `count` more bytes held by a connection outside a call; past the bound, drop the
        oldest connections that have not finished their head (this one too, when it is the
        oldest), those holding more than a bare socket first (dropping one that sent nothing
        frees next to nothing, and only makes its client connect again), then the oldest idle
        ones. False when `connection` itself was dropped."""
        connection.held += count
        self._held += count
        while self._held > self._held_bytes_limit:
            holding = (c for c in self._arriving if c.held > SOCKET_BYTES)
            oldest = next(holding, None) or next(iter(self._arriving), None)
            if oldest is not None:
                self.drop(oldest, "over_memory")
            elif self._idle:
                oldest = next(iter(self._idle))
                self._forget(oldest)
            else:
                break
            if oldest is connection:
                return False
        return True

    def _make_room(self) -> bool:
        """Drop the oldest connection that has not finished its head, else the oldest idle one."""
        for group, reason in ((self._arriving, "over_capacity"), (self._idle, None)):
            if group:
                oldest = next(iter(group))
                if reason is None:
                    self._forget(oldest)
                else:
                    self.drop(oldest, reason)
                return True
        return False

    def _watch(self, connection: Connection, events: int) -> None:
        def ready(mask: int) -> None:
            try:
                self._ready(connection, mask)
            except Exception as error:
                # One connection never ends the loop that serves every other one.
                self._internal(connection, error)

        try:
            self._selector.modify(connection.sock, events, ready)
        except KeyError:
            self._selector.register(connection.sock, events, ready)
        except (ValueError, OSError):  # closed under us
            self._forget(connection)

    def _leave(self, connection: Connection) -> None:
        """Out of the selector and out of its state's group; what it held is given back."""
        with suppress(KeyError, ValueError, OSError):
            self._selector.unregister(connection.sock)
        if connection.state is State.HANDSHAKING and connection in self._arriving:
            self._handshaking -= 1
        for group in (self._arriving, self._idle, self._closing, self._bodies, self._answering):
            group.pop(connection, None)
        self._in_call.discard(connection)
        self._held -= connection.held
        connection.held = 0
        self._sent(connection)
        if connection.body is not None:
            connection.body.release()

    def _forget(self, connection: Connection) -> None:
        self._leave(connection)
        connection.body = None
        _close(connection.sock)


class _Dropped(Exception):
    """The connection being advanced was dropped (past the bound on held bytes)."""


def _base_bytes(connection: Connection) -> int:
    """What a connection holds besides the bytes it received."""
    return SOCKET_BYTES + (TLS_BYTES if isinstance(connection.sock, ssl.SSLSocket) else 0)


def _close(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.close()
