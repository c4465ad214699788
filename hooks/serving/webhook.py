"""The admission webhook's own port, served apart from the hooks, the way controller-runtime keeps
its webhook server apart from its controllers: its own listener and event loop, its own threads,
and its own share of the memory budget.

Admission reviews carry no token (the API server sends none), so anyone the network lets reach
the port can send one. Nothing sent here can delay a Metacontroller hook: the hook port refuses
admission routes at the head (404), and a review costs this port's resources alone. Its event
loop (`hooks.serving.edge`) reads the head under the head deadline, then the body, under a
deadline by its length and within the review's own time, taking memory from this port's share for
the bytes received, never for the length declared; when the share is used up, the oldest bodies
still arriving are dropped. Only a whole review reaches a thread, where the hooks' app judges it,
as it judges every call (`hooks.serving.app`); the answer is written by the loop.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hooks.serving import edge, http, listeners
from hooks.serving.edge import TlsSource
from hooks.serving.guard import Backlog, Guard, HeadChecks
from hooks.serving.metrics import Metrics
from hooks.settings import Settings

LISTENER = "admission"
# What the port's connections may hold outside a call besides the bodies being read.
HELD_BYTES = 8 * 1024 * 1024
LISTEN_BACKLOG = 1024
# The API server keeps its connections to a webhook open between reviews.
IDLE_SECONDS = 30.0

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Webhook(listeners.Listener):
    """The admission port of one worker process."""

    def __init__(
        self,
        settings: Settings,
        host: str,
        port: int,
        *,
        app: WsgiApp,
        guard: Guard,
        metrics: Metrics,
        tls: TlsSource | None,
        threads: int,
        state: listeners.ServiceState,
    ) -> None:
        self._settings, self._app, self._state = settings, app, state
        self._scheme = "https" if tls is not None else "http"
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="admission")
        self._checks = HeadChecks(
            guard,
            settings,
            metrics,
            callers=frozenset({"apiserver"}),
            secure=tls is not None,
            backlog=Backlog(threads),
            elsewhere="the hooks are served on the hook port",
        )
        self.allowance = edge.Allowance(settings.admission_memory_bytes)
        metrics.watch_admission_memory(self.allowance)
        super().__init__(
            host,
            port,
            {},
            tls,
            name=LISTENER,
            head_seconds=settings.header_timeout_seconds,
            metrics=metrics,
            idle_seconds=IDLE_SECONDS,
            max_connections=settings.max_connections,
            held_bytes_limit=HELD_BYTES,
            backlog=LISTEN_BACKLOG,
        )

    def stop(self) -> None:
        super().stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def answer_head(self, connection: edge.Connection, head_bytes: bytes, rest: bytes) -> None:
        head = self._checks.passed(self._edge, connection, head_bytes)
        if head is None:
            return
        length = head.content_length() or 0
        # The review's time runs from its head's first byte: the body is read within what is
        # left of it, and within what its length needs at the slowest rate allowed.
        within = self._settings.answer_within_seconds("apiserver")
        deadline = min(
            time.monotonic() + self._settings.body_deadline_seconds(length),
            connection.head_started + within,
        )

        def received(
            connection: edge.Connection, head_bytes: bytes, body: bytes, release: Callable[[], None]
        ) -> None:
            self._checks.backlog.handed()
            handed = time.monotonic()
            future = self._pool.submit(self._judge, connection, head, body, handed)
            future.add_done_callback(
                lambda done: self.call_soon(lambda: self._answered(connection, done, release))
            )

        self._edge.read_body(
            connection,
            head_bytes,
            length,
            rest,
            deadline=deadline,
            allowance=self.allowance,
            on_body=received,
        )

    def _judge(
        self,
        connection: edge.Connection,
        head: edge.Head,
        body: bytes,
        handed: float,
    ) -> tuple[bytes, bool, float]:
        """In a thread: the app's answer to the review, whether the connection stays open, and
        how long the thread took."""
        started = time.monotonic()
        environ = wsgi_environ(head, body, connection, self._scheme)
        environ[http.ACCEPTED_AT] = connection.head_started
        environ[http.HANDED_AT] = handed  # its body whole: the wait for a thread starts
        environ[http.BODY_HELD] = True
        status, headers, payload = call_wsgi(self._app, environ)
        keep_alive = head.headers.get("connection", "").lower() != "close" and not any(
            name.lower() == "connection" and value.lower() == "close" for name, value in headers
        )
        if keep_alive and self._state.draining:
            # The API server keeps its connections to a Service's address open, and would send
            # its next review to this pod, stopping, on the same one: closed after this answer,
            # its next connection goes to a pod that is ready.
            keep_alive = False
            headers = [*headers, ("Connection", "close")]
        return response_bytes(status, headers, payload), keep_alive, time.monotonic() - started

    def _answered(
        self,
        connection: edge.Connection,
        done: Future[tuple[bytes, bool, float]],
        release: Callable[[], None],
    ) -> None:
        """In the loop: the answer is sent, counted in the port's share until it is (a peer
        that does not read it holds it at most until the answer's deadline), and the body it
        answers is given back."""
        try:
            answer, keep_alive, seconds = done.result()
        except Exception:  # the app answers its own errors; a close is all that is left
            release()
            self._checks.backlog.answered(0.0)
            self._edge.close(connection)
            return
        self._checks.backlog.answered(seconds)
        self._edge.answer(connection, answer, keep_alive=keep_alive, allowance=self.allowance)
        release()


def wsgi_environ(
    head: edge.Head, body: bytes, connection: edge.Connection, scheme: str
) -> dict[str, Any]:
    """The WSGI environment of a request whose head and body the loop read."""
    address = connection.address if isinstance(connection.address, tuple) else ("", 0)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": head.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": head.path,
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "0",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": str(address[0]),
        "CONTENT_LENGTH": str(len(body)),
        "CONTENT_TYPE": head.headers.get("content-type", ""),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scheme,
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in head.headers.items():
        if name not in ("content-length", "content-type"):
            environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ


def call_wsgi(app: WsgiApp, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """The app's status line, headers and whole body."""
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started[:] = [status, headers]
        return lambda data: None

    result = app(environ, start_response)
    try:
        payload = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if callable(close):
            close()
    status, headers = started
    return status, headers, payload


def response_bytes(status: str, headers: list[tuple[str, str]], payload: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status}"]
    lines += [f"{name}: {value}" for name, value in headers if name.lower() != "content-length"]
    lines.append(f"Content-Length: {len(payload)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload
