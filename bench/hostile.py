"""Hostile clients without the token, all at once, beside authenticated calls: the edge's bound.

    python -m bench.load --hostile-clients   # make bench-load ARGS=--hostile-clients

The service runs as the chart runs it (TLS and the bearer token on, 64 threads). In one run this
reports, first unloaded, then while these connect to the hook port, none with the token:
- trickling heads: TLS done, then the request line one byte every 3 s;
- stalled handshakes: half a TLS ClientHello, then nothing;
- an idle flood: TCP connections that send nothing, reopened as the service closes them;
- bodiless admission reviews that declare 1 GB;
the p99 of authenticated customize and license calls (the bodies in examples/, each on a new
connection), of /healthz and /readyz, every failed call, how long each connection that never
finished its head stayed open (against the head deadline plus 1 s), the 1 GB declarations'
answers, and the service's memory against its idle memory.
"""

from __future__ import annotations

import resource
import selectors
import socket
import ssl
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench.deadlines import TOKEN, tls_settings
from bench.run import serve

HEAD_SECONDS = 10.0
TRICKLING, STALLED, IDLE = 100, 200, 2000
ATTACK_SECONDS = 30.0
ROOT = Path(__file__).resolve().parent.parent
BODIES = {
    "/status/customize": (ROOT / "examples" / "status-customize.json").read_bytes(),
    "/license/sync": (ROOT / "examples" / "license-sync.json").read_bytes(),
}


@dataclass
class Lifetimes:
    """How long each hostile connection stayed open, by shape (seconds, from connect)."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, shape: str, seconds: float) -> None:
        with self.lock:
            self.seconds.setdefault(shape, []).append(seconds)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] if ordered else 0.0


def client_hello(host: str) -> bytes:
    """The bytes a TLS client sends first, made without a connection."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=host)
    with suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


class Attack:
    """Every hostile shape, kept at its count until `stop`, on a selector of its own that notes
    when the service closes each connection."""

    def __init__(self, port: int, client: ssl.SSLContext, lifetimes: Lifetimes) -> None:
        self.port = port
        self.client = client
        self.lifetimes = lifetimes
        self.stopping = threading.Event()
        self.selector = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.hello = client_hello("127.0.0.1")
        self.admission_codes: list[int] = []
        self.admission_ms: list[float] = []
        self.threads = [
            threading.Thread(target=self._watch, daemon=True),
            threading.Thread(target=self._keep_open, daemon=True),
            threading.Thread(target=self._trickle, daemon=True),
            threading.Thread(target=self._declare_huge_bodies, daemon=True),
        ]
        self.counts = {"stalled handshake": 0, "idle": 0}

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(10)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]

    def _open(self, shape: str) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if shape == "stalled handshake":
            sock.sendall(self.hello[: len(self.hello) // 2])
        sock.setblocking(False)
        with self.lock:
            self.counts[shape] += 1
            self.selector.register(sock, selectors.EVENT_READ, (shape, time.monotonic()))

    def _keep_open(self) -> None:
        while not self.stopping.is_set():
            opened = False
            for shape, target in (("stalled handshake", STALLED), ("idle", IDLE)):
                while self.counts[shape] < target and not self.stopping.is_set():
                    try:
                        self._open(shape)
                    except OSError:
                        break
                    opened = True
            if not opened:
                time.sleep(0.05)

    def _watch(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                ready = self.selector.select(0) if self.selector.get_map() else []
            for key, _ in ready:
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    continue
                shape, opened_at = key.data
                self.lifetimes.add(shape, time.monotonic() - opened_at)
                with self.lock:
                    self.selector.unregister(sock)
                    self.counts[shape] -= 1
                sock.close()
            time.sleep(0.01)

    def _trickle(self) -> None:
        """TRICKLING TLS connections, each sending its request line a byte every 3 s, opened
        again as they are closed; each is checked for its close every few milliseconds."""
        line = b"POST /status/customize HTTP/1.1\r\nHost: x\r\n"
        watching = selectors.DefaultSelector()
        sent: dict[ssl.SSLSocket, int] = {}
        next_byte = time.monotonic()
        while not self.stopping.is_set():
            while len(sent) < TRICKLING:
                raw = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                tls = self.client.wrap_socket(raw, server_hostname="127.0.0.1")
                tls.setblocking(False)
                watching.register(tls, selectors.EVENT_READ, time.monotonic())
                sent[tls] = 0
            closed = []
            for key, _ in watching.select(0.01):
                tls = key.fileobj  # type: ignore[assignment]
                try:
                    if tls.recv(1) == b"":
                        closed.append(tls)
                except ssl.SSLWantReadError:
                    pass
                except OSError:
                    closed.append(tls)
            if time.monotonic() >= next_byte:
                for tls, count in list(sent.items()):
                    try:
                        tls.send(line[count % len(line) : count % len(line) + 1])
                        sent[tls] = count + 1
                    except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                        pass
                    except OSError:
                        closed.append(tls)
                next_byte = time.monotonic() + 3.0
            for tls in set(closed):
                opened_at = watching.get_key(tls).data
                self.lifetimes.add("trickling head", time.monotonic() - opened_at)
                watching.unregister(tls)
                del sent[tls]
                tls.close()
        for tls in sent:
            tls.close()

    def _declare_huge_bodies(self) -> None:
        head = (
            "POST /admit/gpu-budget HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {1024**3}\r\n\r\n"
        ).encode()
        while not self.stopping.wait(0.2):
            started = time.perf_counter()
            try:
                raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                with self.client.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    tls.sendall(head)
                    answer = tls.recv(64)
                code = int(answer.split()[1]) if answer.startswith(b"HTTP/1.1 ") else 0
            except (OSError, ValueError, IndexError):
                code = 0
            self.admission_codes.append(code)
            self.admission_ms.append(1000 * (time.perf_counter() - started))


def timed_calls(
    url: str, health: str, ca: str, until: float, failures: list[str]
) -> tuple[dict[str, list[float]], list[float]]:
    """Authenticated calls on new connections, and probes, back to back until `until`."""
    calls: dict[str, list[float]] = {route: [] for route in BODIES}
    probes: list[float] = []
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    while time.monotonic() < until:
        for route, body in BODIES.items():
            started = time.perf_counter()
            try:
                code = requests.post(
                    f"{url}{route}", data=body, headers=headers, verify=ca, timeout=5
                ).status_code
            except requests.RequestException as error:
                code = 0
                failures.append(f"{route}: {type(error).__name__}")
            if code and code != 200:
                failures.append(f"{route}: {code}")
            calls[route].append(1000 * (time.perf_counter() - started))
        for probe in ("/healthz", "/readyz"):
            started = time.perf_counter()
            try:
                requests.get(f"{health}{probe}", timeout=5).raise_for_status()
            except requests.RequestException as error:
                failures.append(f"{probe}: {type(error).__name__}")
            probes.append(1000 * (time.perf_counter() - started))
        time.sleep(0.02)
    return calls, probes


def hostile_clients(api: str) -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    with tls_settings(GPUCLASS_HEADER_TIMEOUT_SECONDS=str(HEAD_SECONDS)) as (settings, verify):
        client = ssl.create_default_context(cafile=verify)
        with serve(api, threads=64, settings=settings) as server:
            baseline_failures: list[str] = []
            time.sleep(1)
            idle_mb = server.memory_mb()
            calls_unloaded, probes_unloaded = timed_calls(
                server.url, server.health, verify, time.monotonic() + 10, baseline_failures
            )
            lifetimes = Lifetimes()
            attack = Attack(int(server.url.rsplit(":", 1)[1]), client, lifetimes)
            attack.start()
            failures: list[str] = []
            with server.peak_memory(every_seconds=0.2) as peak:
                time.sleep(3)  # every shape at its count
                open_at_start = dict(attack.counts)
                calls, probes = timed_calls(
                    server.url, server.health, verify, time.monotonic() + ATTACK_SECONDS, failures
                )
            scrape = requests.get(f"{server.metrics}/metrics", verify=verify, timeout=10).text
            attack.stop()
    dropped = [
        line for line in scrape.splitlines() if line.startswith("cozystack_gpu_hook_connections")
        and 'listener="hooks"' in line and not line.endswith(" 0.0") and "_created" not in line
    ]  # fmt: skip
    print(
        f"[hostile clients] {TRICKLING} trickling heads, {STALLED} stalled handshakes, {IDLE} "
        "idle connections (reopened as they close), 1 GB admission declarations every 0.2 s; "
        f"none with the token; TLS and the token on; head deadline {HEAD_SECONDS:g} s; "
        f"{ATTACK_SECONDS:g} s under attack"
    )
    print(f"  open when the measurement began: {open_at_start}")
    for route in BODIES:
        print(
            f"  {route}: p99 {p99(calls[route]):.1f} ms (unloaded {p99(calls_unloaded[route]):.1f}"
            f" ms), {len(calls[route])} calls"
        )
    print(
        f"  probes: p99 {p99(probes):.1f} ms (unloaded {p99(probes_unloaded):.1f} ms), "
        f"{len(probes)} probes"
    )
    longest = {shape: max(seconds) for shape, seconds in lifetimes.seconds.items()}
    closed = {shape: len(seconds) for shape, seconds in lifetimes.seconds.items()}
    print(f"  hostile connections closed by the service: {closed}")
    print(f"  longest any stayed open (s): { {k: round(v, 2) for k, v in longest.items()} }")
    codes = sorted(set(attack.admission_codes))
    print(
        f"  1 GB admission declarations: {len(attack.admission_codes)}, answered {codes}, p99 "
        f"{p99(attack.admission_ms):.1f} ms"
    )
    print(f"  memory: idle {idle_mb:.0f} MB, peak {peak.mb:.0f} MB")
    print("  " + "\n  ".join(dropped))
    all_calls = [ms for values in calls.values() for ms in values]
    checks = [
        ("authenticated calls p99 <= 100 ms", p99(all_calls) <= 100, f"{p99(all_calls):.1f} ms"),
        ("probes p99 <= 50 ms", p99(probes) <= 50, f"{p99(probes):.1f} ms"),
        ("no failed call", not failures and not baseline_failures,
         f"{failures[:5]} {baseline_failures[:5]}"),
        ("every head-less connection closed within its deadline + 1 s",
         bool(longest) and max(longest.values()) <= HEAD_SECONDS + 1, f"{longest}"),
        ("every 1 GB admission declaration answered 413 at once",
         codes == [413], f"{codes}"),
        ("memory within 100 MB of idle", peak.mb - idle_mb <= 100,
         f"{peak.mb - idle_mb:.0f} MB"),
    ]  # fmt: skip
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1
