"""The gunicorn worker the service runs: gthread's pool of threads for calls, with
`hooks.serving.edge` in front of it.

A connection reaches a thread only once its TLS handshake, request line and headers are complete,
within `GPUCLASS_HEADER_TIMEOUT_SECONDS` of accept, and only when the head passes
`hooks.serving.guard` (a hook route, POST, the token, HTTPS for admission, a declared length within
the route's limit); anything else is answered or dropped by the event loop, which never blocks. A
kept-alive connection goes back to the loop between calls, and a connection that closes lingers
there.

The thread side is gthread's own (`ThreadWorker.handle`: gunicorn's parser, the WSGI call), given a
connection already set up: the TLS socket, and a parser holding the head the loop read.

Stopping (SIGTERM, after the drain delay): the listeners close at once, so new connections are
refused instead of waiting in the backlog; calls accepted before that are answered; idle
connections linger briefly for a request already on its way."""

from __future__ import annotations

import resource
import selectors
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from hooks.serving import edge, gthread, http
from hooks.serving.guard import Backlog, Guard, HeadChecks
from hooks.serving.listeners import Listener
from hooks.serving.logs import log_unexpected
from hooks.serving.metrics import Metrics
from hooks.settings import Settings

# How long a stopping worker keeps an idle connection for a request already on its way.
STOP_IDLE_LINGER_SECONDS = 2.0
LISTENER = "hooks"
# What the hook port's connections may hold outside a call, together (`edge.Edge`): part of what
# the memory budget leaves aside for the process (docs/scale.md).
HELD_BYTES = 32 * 1024 * 1024
# Connections the kernel may hold complete but not yet accepted (capped by net.core.somaxconn).
LISTEN_BACKLOG = 1024


def honour_connection_close(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """gunicorn drops an application's `Connection: close` (a hop-by-hop header) and keeps the
    connection, draining the unread body of a refused call in a hook thread first; an answer that
    says close makes gunicorn close."""

    def closing(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            if any(
                name.lower() == "connection" and value.strip().lower() == "close"
                for name, value in headers
            ):
                gunicorn_response = getattr(start_response, "__self__", None)
                force_close = getattr(gunicorn_response, "force_close", None)
                if callable(force_close):
                    force_close()
            return start_response(status, headers, exc_info)

        return app(environ, start)

    return closing


class HookWorker(ThreadWorker):
    """gthread's threads behind `hooks.serving.edge`. `serve_edge` (from gunicorn's
    post_worker_init) gives it what the edge checks and counts with; without it the worker
    refuses to run."""

    _edge: edge.Edge | None = None
    _checks: HeadChecks | None = None
    # By id of the connection's socket: when the edge took its call and handed it to the pool
    # (`_taken`), when a thread began it (`_started`).
    _taken: dict[int, tuple[float, float]]
    _started: dict[int, float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._taken, self._started = {}, {}
        self._drained_with: list[Listener] = []

    def drain_with(self, listener: Listener) -> None:
        """A port served apart whose calls a stopping worker answers too (the admission port)."""
        self._drained_with.append(listener)

    def load_wsgi(self) -> None:
        super().load_wsgi()
        loaded: Callable[..., Iterable[bytes]] = getattr(self, "wsgi")  # noqa: B009 (untyped)
        self.wsgi = self._timed(honour_connection_close(loaded))

    def _timed(self, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        """The call's environment carries when the edge took it; its thread's start is noted for
        the backlog's average."""
        taken = self._taken
        started = self._started

        def timed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            key = id(environ.get("gunicorn.socket"))
            times = taken.pop(key, None)
            if times is not None:
                environ[http.ACCEPTED_AT], environ[http.HANDED_AT] = times
            started[key] = http.now()
            return app(environ, start_response)

        return timed

    def serve_edge(
        self, settings: Settings, guard: Guard, metrics: Metrics, tls: edge.TlsSource | None
    ) -> None:
        self.tls = tls
        self._checks = HeadChecks(
            guard,
            settings,
            metrics,
            callers=frozenset({"metacontroller"}),
            secure=tls is not None,
            backlog=Backlog(self.cfg.threads),
            elsewhere="admission reviews are served on the admission port",
        )
        self._edge = edge.Edge(
            self.poller,
            self._on_head,
            head_seconds=settings.header_timeout_seconds,
            idle_seconds=float(self.cfg.keepalive),
            max_connections=settings.max_connections,
            held_bytes_limit=HELD_BYTES,
            tls=tls,
            on_drop=lambda reason: metrics.connections_dropped.labels(LISTENER, reason).inc(),
            on_tls_failure=lambda reason: metrics.tls_handshake_failures.labels(
                LISTENER, reason
            ).inc(),
            on_error=lambda kind, frames: log_unexpected(f"{LISTENER} listener", kind, frames),
        )
        metrics.watch_connections(LISTENER, self._edge)
        if tls is not None:
            metrics.watch_tls(LISTENER, lambda: tls.not_after)
        if settings.tls_client_ca_file is not None:
            the_edge = self._edge
            metrics.watch_client_certificates(lambda: the_edge.client_not_after)
        _raise_open_files_limit(2 * settings.max_connections + 256)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        if self._edge is None:
            raise RuntimeError("HookWorker.serve_edge was not called before the worker ran")
        the_edge = self._edge
        self.poller.register(
            self.method_queue.fileno(),
            selectors.EVENT_READ,
            lambda mask: self.method_queue.run_callbacks(None),
        )
        for listener in self.sockets:
            listener.setblocking(False)
            self.poller.register(
                listener, selectors.EVENT_READ, lambda mask, s=listener: the_edge.accept(s)
            )
        while self.alive:
            self.notify()
            self._dispatch(the_edge.timeout())
            the_edge.expire()
            if not self.is_parent_alive():
                break
        for listener in self.sockets:
            self.poller.unregister(listener)
            listener.close()  # the arbiter closed its copy already: new connections are refused
        the_edge.linger_idle(STOP_IDLE_LINGER_SECONDS)
        for apart in self._drained_with:
            apart.stop_accepting(STOP_IDLE_LINGER_SECONDS)
        # The arbiter's graceful timeout bounds this from SIGTERM on (`hooks.cli`).
        stop_by = time.monotonic() + self.cfg.graceful_timeout
        while time.monotonic() < stop_by and (
            the_edge.open or any(apart.open for apart in self._drained_with)
        ):
            self.notify()
            self._dispatch(the_edge.timeout())
            the_edge.expire()
        the_edge.close_all()
        self.tpool.shutdown(wait=False)
        self.poller.close()
        self.method_queue.close()

    def _dispatch(self, timeout: float) -> None:
        try:
            events = self.poller.select(timeout)
        except InterruptedError:
            return
        for key, mask in events:
            key.data(mask)

    # -- from a head to a thread, and back -----------------------------------------------------

    def _on_head(self, connection: edge.Connection, head_bytes: bytes, rest: bytes) -> None:
        assert self._edge is not None and self._checks is not None
        if self._checks.passed(self._edge, connection, head_bytes) is None:
            return
        tconn = connection.owner_state
        if tconn is None:
            tconn = gthread.connection(self.cfg, connection.sock, connection.address)
            connection.owner_state = tconn
        gthread.give_back(tconn, head_bytes + rest)
        self._edge.hand_off(connection)
        # The call's clock starts with its request: at accept, or when a kept-alive connection
        # sent again (the edge's clock is the call's, `http.now`).
        self._taken[id(connection.sock)] = (connection.head_started or http.now(), http.now())
        self._checks.backlog.handed()
        future = self.tpool.submit(self.handle, tconn)
        future.add_done_callback(
            lambda done: self.method_queue.defer(self._finished, connection, done)
        )

    def _finished(self, connection: edge.Connection, done: Future[Any]) -> None:
        assert self._edge is not None and self._checks is not None
        started = self._started.pop(id(connection.sock), None)
        self._checks.backlog.answered(0.0 if started is None else http.now() - started)
        keep = False
        try:
            keep = bool(done.result())
        except Exception:  # gthread's handle answers its own errors; a close is all that is left
            keep = False
        tconn = connection.owner_state
        if keep and tconn is not None and tconn.sock.fileno() >= 0:
            tconn.sock.setblocking(False)
            self._edge.resume(connection, gthread.read_ahead(tconn))
        else:
            self._edge.close(connection)


def _raise_open_files_limit(wanted: int) -> None:
    """Every open connection is a descriptor: let the soft limit reach what the cap needs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
