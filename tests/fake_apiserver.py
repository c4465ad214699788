"""A real local HTTP server standing in for the Kubernetes API (no mock of requests)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.builders import GPU

KUBEVIRT_PATH = "/apis/kubevirt.io/v1/namespaces/cozy-kubevirt/kubevirts/kubevirt"


def kubevirt_cr(*resources: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "cozy-kubevirt"},
        "spec": {
            "configuration": {
                "permittedHostDevices": {
                    "pciHostDevices": [
                        {"pciVendorSelector": "10DE:26B9", "resourceName": r} for r in resources
                    ],
                    "mediatedDevices": [],
                }
            }
        },
    }


# A namespaced list path without a route of its own is answered by the route of the cluster-wide
# path, as the API server does, with the namespace passed to a list body under this key.
NAMESPACE_PARAM = "__namespace"
NAMESPACED = re.compile(r"^(/apis/[^/]+/[^/]+|/api/v1)/namespaces/([^/]+)/([^/]+)$")


@dataclass
class Route:
    code: int = 200
    # A JSON-able body, raw bytes, or a function of the query parameters returning either.
    body: Any = field(default_factory=lambda: kubevirt_cr(GPU))
    delay: float = 0.0
    # Seconds between the body's bytes, sent one at a time: each gap within any per-read
    # timeout, the whole far past it.
    trickle: float = 0.0
    # The same for the status line and headers: the head itself trickled.
    head_trickle: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


def list_of(
    items: list[dict[str, Any]], page_size: int = 2
) -> Callable[[dict[str, str]], dict[str, Any]]:
    """A list endpoint: filters by an equality or set-based `labelSelector` the way the API server
    does for the selectors the service sends, and pages with `limit`/`continue`."""
    from hooks.rules.selectors import parse_selector, selector_matches

    def answer(query: dict[str, str]) -> dict[str, Any]:
        selector = parse_selector(query.get("labelSelector", ""))
        namespace = query.get(NAMESPACE_PARAM)
        matching = [
            i
            for i in items
            if selector_matches(selector, i["metadata"].get("labels", {}))
            and (namespace is None or i["metadata"].get("namespace") == namespace)
        ]
        start = int(query.get("continue", "0"))
        page = matching[start : start + page_size]
        metadata = {"continue": str(start + page_size)} if start + page_size < len(matching) else {}
        return {"kind": "List", "apiVersion": "v1", "metadata": metadata, "items": page}

    return answer


@dataclass
class FakeApiServer:
    url: str
    routes: dict[str, Route]
    requests: list[tuple[str, str | None]]  # (path, Authorization header)

    def serve(self, path: str, code: int = 200, body: Any = None, delay: float = 0.0) -> None:
        self.routes[path] = Route(code, body if body is not None else kubevirt_cr(GPU), delay)


@contextmanager
def fake_apiserver() -> Iterator[FakeApiServer]:
    routes: dict[str, Route] = {KUBEVIRT_PATH: Route()}
    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            parts = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            route = routes.get(parts.path)
            namespaced = NAMESPACED.match(parts.path)
            if route is None and namespaced is not None:
                route = routes.get(f"{namespaced[1]}/{namespaced[3]}")
                query[NAMESPACE_PARAM] = namespaced[2]
            if route is None:
                route = Route(404, {"kind": "Status", "code": 404})
            if route.delay:
                time.sleep(route.delay)
            body = route.body
            if callable(body):
                body = body(query)
            payload = body if isinstance(body, bytes) else json.dumps(body).encode()
            try:
                if route.head_trickle:
                    head = (
                        f"HTTP/1.1 {route.code} OK\r\nContent-Type: application/json\r\n"
                        f"X-Padding: {'x' * 1000}\r\nContent-Length: {len(payload)}\r\n\r\n"
                    ).encode()
                    for byte in head:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(route.head_trickle)
                    self.wfile.write(payload)
                    return
                self.send_response(route.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in route.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if not route.trickle:
                    self.wfile.write(payload)
                for byte in payload if route.trickle else b"":
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(route.trickle)
            except OSError:
                pass  # the client gave up (timeout tests)

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        # As a real API server's: the default backlog of 5 drops the connections of a burst,
        # which the client then retries a second later.
        request_queue_size = 128

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield FakeApiServer(f"http://127.0.0.1:{server.server_port}", routes, seen)
    finally:
        server.shutdown()
        server.server_close()
