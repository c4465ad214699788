"""Never-ending heads on the admission port, beside the API server's kept-alive reviews.

    python -m bench.load --slow-heads   # make bench-load ARGS=--slow-heads

The service runs as the chart runs it (TLS and the bearer token on, 64 threads, the head deadline
10 s). One caller sends budget reviews back to back on one kept-alive connection, as the API
server does: first alone, then while 1,000 TLS connections without a token each send a head that
never ends, one byte a second, each opened again as the service closes it. Reported: the reviews'
p99 in both phases, measured in the same run; loaded, it must stay within the unloaded p99 plus
100 ms.
"""

from __future__ import annotations

import json
import resource
import socket
import ssl
import threading
import time
from contextlib import suppress

import requests

from bench.deadlines import GPU, stub_api, tls_settings
from bench.run import serve
from tests.builders import admission_review, gpus

HEADS = 1000
HEAD_SECONDS = 10.0
PHASE_SECONDS = 20.0
WITHIN_MS = 100.0


class NeverEndingHeads:
    """HEADS TLS connections to `port`, each sending one more byte of its head every second, and
    opened again when the service closes it."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        self.port, self.context = port, context
        self.stopping = threading.Event()
        self.reopened = 0
        self.open: list[ssl.SSLSocket] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        tls = self.context.wrap_socket(raw, server_hostname="127.0.0.1")
        tls.sendall(b"POST /admit/gpu-budget HTTP/1.1\r\nX-Never: ")
        tls.setblocking(False)
        return tls

    def _run(self) -> None:
        while not self.stopping.is_set():
            second = time.monotonic() + 1.0
            kept = []
            for tls in self.open:
                try:
                    tls.send(b"a")
                    kept.append(tls)
                except (OSError, ssl.SSLError):
                    tls.close()
            while len(kept) < HEADS and not self.stopping.is_set():
                with suppress(OSError):
                    kept.append(self._connect())
                    self.reopened += 1
            self.open = kept
            self.stopping.wait(max(0.0, second - time.monotonic()))

    def __enter__(self) -> NeverEndingHeads:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(30)
        for tls in self.open:
            tls.close()


def reviews_for(url: str, verify: str, seconds: float) -> list[float]:
    """Reviews back to back on one kept-alive connection for `seconds`: each one's milliseconds."""
    body = json.dumps(admission_review("VMInstance", "tenant-a", "v", {"gpus": gpus(GPU)}))
    taken: list[float] = []
    with requests.Session() as session:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            answer = session.post(
                f"{url}/admit/gpu-budget",
                data=body,
                headers={"Content-Type": "application/json"},
                verify=verify,
                timeout=30,
            )
            answer.raise_for_status()
            taken.append(1000 * (time.perf_counter() - started))
    return taken


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def slow_heads() -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    limits = {"GPUCLASS_HEADER_TIMEOUT_SECONDS": str(HEAD_SECONDS)}
    with (
        stub_api() as (api, _),
        tls_settings(**limits) as (settings, verify),
        serve(api, threads=64, settings=settings) as server,
    ):
        reviews_for(server.admission, verify, 2)  # warm: classes cached, connection open
        unloaded = reviews_for(server.admission, verify, PHASE_SECONDS)
        context = ssl.create_default_context(cafile=verify)
        with NeverEndingHeads(int(server.admission.rsplit(":", 1)[1]), context) as heads:
            time.sleep(HEAD_SECONDS + 2)  # every connection open, the first ones reopened
            loaded = reviews_for(server.admission, verify, PHASE_SECONDS)
            open_heads, reopened = len(heads.open), heads.reopened
    print(
        f"[slow heads] {HEADS} TLS connections without a token on the admission port, each "
        f"sending a head that never ends at 1 byte/s (head deadline {HEAD_SECONDS:g} s; "
        f"{reopened} opened in all, {open_heads} open at the end); reviews back to back on "
        "one kept-alive connection; TLS, token, 64 threads"
    )
    print(f"  unloaded: p99 {p99(unloaded):.1f} ms, {len(unloaded)} reviews")
    print(f"  loaded:   p99 {p99(loaded):.1f} ms, {len(loaded)} reviews")
    ok = p99(loaded) <= p99(unloaded) + WITHIN_MS
    print(
        f"{'PASS' if ok else 'FAIL'}  loaded p99 within the unloaded p99 + {WITHIN_MS:g} ms: "
        f"{p99(loaded) - p99(unloaded):+.1f} ms"
    )
    return 0 if ok else 1
