"""The probe and metrics listeners: `/healthz` and `/readyz` on the health port, `/metrics` on the
metrics port (controller-runtime's convention), each served apart from the hooks.

The hooks run in gunicorn's pool of threads, which a burst of large or stalled calls can fill;
kubelet and Prometheus must get their answer all the same, or the pod is restarted for being busy
and its metrics go dark exactly when they matter. So each listener is a small server of its own: one
thread, whose event loop (`hooks.serving.edge`) reads nothing but the request line and headers,
under the head deadline from accept, for a bounded number of connections, and answers there.

- The health port speaks plain HTTP: kubelet probes present no client certificate or token, and
  the answers say nothing but up or draining.
- The metrics port speaks HTTPS when the hooks do (the same certificate, never a client
  certificate: Prometheus has none of Metacontroller's), and asks for the hooks' bearer token when
  `GPUCLASS_METRICS_REQUIRE_AUTH` is set.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
import traceback
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from http import HTTPStatus

from hooks.serving import edge
from hooks.serving.auth import TokenFile
from hooks.serving.edge import TlsSource
from hooks.serving.logs import log, log_unexpected
from hooks.serving.metrics import Metrics
from hooks.settings import Settings

# Open connections per listener; past it, those that have not sent their head go first.
MAX_CONNECTIONS = 512
# What a listener's connections may hold outside an answer, together (`edge.Edge`).
HELD_BYTES = 4 * 1024 * 1024
BACKLOG = 128
JSON = "application/json"


class ServiceState:
    """Process-wide state the listeners and hooks share: whether the process still accepts hook
    calls."""

    def __init__(self) -> None:
        self._draining = threading.Event()
        # Why the process may not report ready yet (a credential never valid), if anything.
        self.unready: Callable[[], list[str]] = list
        # The ports served apart from the probes, each by a thread of its own.
        self.listeners: list[Listener] = []

    def stopped(self) -> list[str]:
        """The listeners whose thread ended while nobody stopped them: their port refuses every
        connection, so the process is neither ready nor live (the kubelet restarts it)."""
        names = [(listener.name, listener.port) for listener in self.listeners if listener.stopped]
        return [f"the {name} port's listener ({port}) stopped" for name, port in names]

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def drain(self) -> None:
        self._draining.set()


@dataclass(frozen=True)
class Reply:
    code: int
    body: bytes
    content_type: str = JSON


Route = Callable[[dict[str, str]], Reply]


def health_routes(state: ServiceState) -> dict[str, Route]:
    def healthz(headers: dict[str, str]) -> Reply:
        stopped = state.stopped()
        if stopped:
            return Reply(503, json.dumps({"error": "not live", "why": stopped}).encode())
        return Reply(200, b'{"status":"ok"}')

    def readyz(headers: dict[str, str]) -> Reply:
        if state.draining:
            return Reply(503, b'{"error":"shutting down"}')
        reasons = [*state.stopped(), *state.unready()]
        if reasons:
            return Reply(503, json.dumps({"error": "not ready", "why": reasons}).encode())
        return Reply(200, b'{"status":"ready"}')

    return {"/healthz": healthz, "/readyz": readyz}


def metrics_routes(metrics: Metrics, tokens: TokenFile | None) -> dict[str, Route]:
    def scrape(headers: dict[str, str]) -> Reply:
        if tokens is not None and not tokens.accepts(headers.get("authorization")):
            return Reply(401, b'{"error":"missing or invalid bearer token"}')
        payload, content_type = metrics.exposition()
        return Reply(200, payload, content_type)

    return {"/metrics": scrape}


class Listener:
    """One port served by one thread: its event loop reads each request's head under the
    deadline (`hooks.serving.edge`) and answers it there (`answer_head`, which a subclass may
    serve otherwise); every answer closes its connection."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: dict[str, Route],
        tls: TlsSource | None,
        *,
        name: str,
        head_seconds: float,
        metrics: Metrics | None,
        idle_seconds: float | None = None,
        max_connections: int = MAX_CONNECTIONS,
        held_bytes_limit: int = HELD_BYTES,
        backlog: int = BACKLOG,
    ) -> None:
        self.name = name
        self._routes = routes
        self._soon: deque[Callable[[], None]] = deque()
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Each worker process of `serve` listens on the same ports (SO_REUSEPORT): the kernel
        # spreads probes and scrapes over them, as it spreads hook calls.
        if hasattr(socket, "SO_REUSEPORT"):
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._socket.bind((host, port))
        self._socket.listen(backlog)
        self.port = int(self._socket.getsockname()[1])  # the one bound (when asked for port 0)
        self._socket.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)  # a full wake-up pipe already wakes the loop
        self._stopping = False

        def dropped(reason: str) -> None:
            if metrics is not None:
                metrics.connections_dropped.labels(listener=name, reason=reason).inc()

        def tls_failed(reason: str) -> None:
            if metrics is not None:
                metrics.tls_handshake_failures.labels(listener=name, reason=reason).inc()

        self._edge = edge.Edge(
            self._selector,
            self.answer_head,
            head_seconds=head_seconds,
            idle_seconds=head_seconds if idle_seconds is None else idle_seconds,
            max_connections=max_connections,
            held_bytes_limit=held_bytes_limit,
            tls=tls,
            verify_clients=False,
            on_drop=dropped,
            on_tls_failure=tls_failed,
            on_error=lambda kind, frames: log_unexpected(f"{name} listener", kind, frames),
        )
        if metrics is not None:
            metrics.watch_connections(name, self._edge)
            if tls is not None:
                metrics.watch_tls(name, lambda: tls.not_after)
        self._selector.register(self._socket, selectors.EVENT_READ, self._accept)
        self._selector.register(self._wake_read, selectors.EVENT_READ, self._woken)
        self.thread = threading.Thread(target=self._run, name=f"listener :{port}", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        self.thread.join(5)

    @property
    def stopped(self) -> bool:
        """Its thread ended while nobody stopped it."""
        return not self.thread.is_alive() and not self._stopping

    @property
    def open(self) -> int:
        """Open connections (read from any thread: a snapshot)."""
        return self._edge.open

    def stop_accepting(self, idle_linger_seconds: float) -> None:
        """From now on new connections are refused; those open are served to their end, and idle
        ones kept at most `idle_linger_seconds` more."""

        def close_listener() -> None:
            with suppress(KeyError, ValueError):
                self._selector.unregister(self._socket)
            self._socket.close()
            self._edge.linger_idle(idle_linger_seconds)

        self.call_soon(close_listener)

    def call_soon(self, action: Callable[[], None]) -> None:
        """Run `action` on the listener's thread (from any thread)."""
        self._soon.append(action)
        self._wake()

    def _wake(self) -> None:
        with suppress(OSError):
            self._wake_write.send(b"x")

    def _accept(self, mask: int) -> None:
        self._edge.accept(self._socket)

    def _woken(self, mask: int) -> None:
        with suppress(OSError):
            self._wake_read.recv(4096)
        while self._soon:
            self._soon.popleft()()

    def _run(self) -> None:
        try:
            while not self._stopping:
                for key, mask in self._selector.select(self._edge.timeout()):
                    key.data(mask)
                self._edge.expire()
        except Exception as error:
            # A connection's error never reaches here (the edge keeps it to that connection):
            # this is the loop's own. Logged as a JSON line; the probes then report the port
            # stopped (`ServiceState.stopped`).
            frames = traceback.format_tb(error.__traceback__)[-3:]
            log_unexpected(f"{self.name} listener", type(error).__name__, frames)
        finally:
            self._edge.close_all()
            self._selector.close()
            for sock in (self._socket, self._wake_read, self._wake_write):
                sock.close()

    def answer_head(self, connection: edge.Connection, head_bytes: bytes, rest: bytes) -> None:
        head = edge.parse_head(head_bytes)
        if isinstance(head, edge.Refused):
            self._edge.respond(connection, edge.response_bytes(head.code, head.message))
            return
        route = self._routes.get(head.path)
        try:
            reply = route(dict(head.headers)) if route is not None else NOT_FOUND
        except Exception as error:
            # One log line, by type and frames as for the hooks; the message may quote input.
            frames = traceback.format_tb(error.__traceback__)[-3:]
            log_unexpected("listener", type(error).__name__, frames)
            self._edge.close(connection)
            return
        self._edge.respond(connection, _reply_bytes(reply))


NOT_FOUND = Reply(404, b'{"error":"not found"}')


def _reply_bytes(reply: Reply) -> bytes:
    head = (
        f"HTTP/1.1 {reply.code} {HTTPStatus(reply.code).phrase}\r\n"
        f"Content-Type: {reply.content_type}\r\nContent-Length: {len(reply.body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + reply.body


def listen(
    host: str,
    port: int,
    routes: dict[str, Route],
    tls: TlsSource | None,
    *,
    head_seconds: float,
    name: str = "health",
    metrics: Metrics | None = None,
) -> Listener:
    """A probe or a scrape that has not sent its request line and headers within `head_seconds`
    of accept is dropped."""
    return Listener(host, port, routes, tls, name=name, head_seconds=head_seconds, metrics=metrics)


def server_tls(settings: Settings) -> TlsSource | None:
    """The process's serving pair (reloaded when its files change) for every port that speaks
    TLS, or None when the hooks speak plain HTTP."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    return TlsSource(settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file)


def start(
    settings: Settings,
    host: str,
    health_port: int,
    metrics_port: int,
    state: ServiceState,
    metrics: Metrics,
    tls: TlsSource | None,
) -> tuple[Listener, Listener]:
    """The health and metrics listeners of one worker process; the metrics port serves the
    hooks' pair (`tls`), never asking for a client certificate: Prometheus has none."""
    tokens = TokenFile(settings.auth_token_file) if settings.auth_token_file else None
    guard = tokens if settings.metrics_require_auth else None
    deadline = settings.header_timeout_seconds
    health = listen(
        host, health_port, health_routes(state), None, head_seconds=deadline, metrics=metrics
    )
    scrape = listen(
        host,
        metrics_port,
        metrics_routes(metrics, guard),
        tls,
        name="metrics",
        head_seconds=deadline,
        metrics=metrics,
    )
    log(logging.INFO, "listening", health_port=health.port, metrics_port=scrape.port)
    return health, scrape
