"""A real local HTTP server standing in for the Kubernetes API (no mock of requests)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


@dataclass
class Route:
    code: int = 200
    body: Any = field(default_factory=lambda: kubevirt_cr(GPU))
    delay: float = 0.0


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
            route = routes.get(self.path.split("?")[0], Route(404, {"kind": "Status", "code": 404}))
            if route.delay:
                time.sleep(route.delay)
            payload = (
                route.body if isinstance(route.body, bytes) else json.dumps(route.body).encode()
            )
            try:
                self.send_response(route.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass  # the client gave up (timeout tests)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
