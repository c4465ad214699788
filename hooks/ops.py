"""The probe and metrics listeners: `/healthz` and `/readyz` on the health port, `/metrics` on the
metrics port (controller-runtime's convention), each served apart from the hooks.

The hooks run in gunicorn's pool of threads, which a burst of large or stalled calls can fill;
kubelet and Prometheus must get their answer all the same, or the pod is restarted for being busy
and its metrics go dark exactly when they matter. So each listener is a small server of its own,
one short-lived thread per connection, reading nothing but the request line and headers, under a
socket timeout.

- The health port speaks plain HTTP: kubelet probes present no client certificate or token, and
  the answers say nothing but up or draining.
- The metrics port speaks HTTPS when the hooks do (the same certificate, never a client
  certificate: Prometheus has none of Metacontroller's), and asks for the hooks' bearer token when
  `GPUCLASS_METRICS_REQUIRE_AUTH` is set.
"""

from __future__ import annotations

import logging
import socket
import ssl
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hooks.auth import TokenFile
from hooks.logs import log
from hooks.metrics import Metrics
from hooks.settings import Settings

# A probe or a scrape that has not sent its request line and headers by then is dropped.
REQUEST_TIMEOUT_SECONDS = 5.0
JSON = "application/json"


class ServiceState:
    """Process-wide state the listeners and hooks share: whether the process still accepts hook
    calls."""

    def __init__(self) -> None:
        self._draining = threading.Event()

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
        return Reply(200, b'{"status":"ok"}')

    def readyz(headers: dict[str, str]) -> Reply:
        if state.draining:
            return Reply(503, b'{"error":"shutting down"}')
        return Reply(200, b'{"status":"ready"}')

    return {"/healthz": healthz, "/readyz": readyz}


def metrics_routes(metrics: Metrics, tokens: TokenFile | None) -> dict[str, Route]:
    def scrape(headers: dict[str, str]) -> Reply:
        if tokens is not None and not tokens.accepts(headers.get("authorization")):
            return Reply(401, b'{"error":"missing or invalid bearer token"}')
        payload, content_type = metrics.exposition()
        return Reply(200, payload, content_type)

    return {"/metrics": scrape}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def server_bind(self) -> None:
        # Each worker process of `serve` listens on the same ports (SO_REUSEPORT): the kernel
        # spreads probes and scrapes over them, as it spreads hook calls.
        if hasattr(socket, "SO_REUSEPORT"):
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed: a client gone or a handshake that failed (plain HTTP to
        the TLS port, a port scan) is nothing to answer or report; anything else is one log
        line, by type and frames as for the hooks, instead of socketserver's traceback on
        stderr."""
        error = sys.exc_info()[1]
        if error is None or isinstance(error, OSError):
            return
        frames = traceback.format_tb(error.__traceback__)[-3:]
        log(
            logging.ERROR,
            "unexpected error",
            route="listener",
            error=type(error).__name__,
            frames=frames,
        )


def _handler(routes: dict[str, Route], tls: ssl.SSLContext | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_SECONDS
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            if tls is not None:
                self.request.settimeout(REQUEST_TIMEOUT_SECONDS)
                self.request = tls.wrap_socket(self.request, server_side=True)
            super().setup()

        def do_GET(self) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            headers = {k.lower(): v for k, v in self.headers.items()}
            reply = route(headers) if route is not None else Reply(404, b'{"error":"not found"}')
            self.send_response(reply.code)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes and scrapes are counted, not logged

    return Handler


@dataclass
class Listener:
    """A started listener; `port` is the one bound (useful when asked for port 0)."""

    server: _Server
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def listen(host: str, port: int, routes: dict[str, Route], tls: ssl.SSLContext | None) -> Listener:
    server = _Server((host, port), _handler(routes, tls))
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.1},  # how soon `stop` returns
        name=f"listener :{port}",
        daemon=True,
    )
    thread.start()
    return Listener(server, thread)


def server_tls(settings: Settings) -> ssl.SSLContext | None:
    """The hooks' certificate for the metrics port, or None when the hooks speak plain HTTP."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(settings.tls_cert_file), str(settings.tls_key_file))
    return context


def start(
    settings: Settings,
    host: str,
    health_port: int,
    metrics_port: int,
    state: ServiceState,
    metrics: Metrics,
) -> tuple[Listener, Listener]:
    """The health and metrics listeners of one worker process."""
    tokens = TokenFile(settings.auth_token_file) if settings.auth_token_file else None
    guard = tokens if settings.metrics_require_auth else None
    health = listen(host, health_port, health_routes(state), None)
    scrape = listen(host, metrics_port, metrics_routes(metrics, guard), server_tls(settings))
    log(logging.INFO, "listening", health_port=health.port, metrics_port=scrape.port)
    return health, scrape
