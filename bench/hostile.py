"""Hostile clients without the token, all at once, beside authenticated calls: the edge's bound.

    python -m bench.load --hostile-clients   # make bench-load ARGS=--hostile-clients

The service runs as the chart runs it (TLS and the bearer token on, 64 threads, a 2 GiB memory
limit). In one run this reports, first unloaded, then while all of these are open at once, none
with the token:
- on the hook port: trickling heads (TLS done, then the request line one byte every 3 s);
  stalled handshakes (half a TLS ClientHello, then nothing); an idle flood (TCP connections that
  send nothing); 64 KiB heads by the thousand (TLS done, then 64 KiB of a head that never ends);
  connect-and-close churn (plain TCP, 1,500 a second);
- on the admission port: stalled bodies (a whole head declaring 1,204 bytes, then 100 of them and
  nothing more); 7 MiB heads (a whole head declaring the admission limit, then nothing); bodiless
  reviews declaring 1 GB;
every shape reopened as the service closes it. Measured: the p99 of authenticated customize,
license and S-sized (11.9 MB) status sync calls (each on a new connection), of /healthz and
/readyz, every failed call, how long each connection that never finished its head stayed open
(against the head deadline plus 1 s), the 1 GB declarations' answers, the most the admission port
held for anonymous callers against what their received bytes need, and the service's memory
against its idle memory.

Then, in the same run, a service whose stderr is a pipe nobody reads for 60 s (a stalled log
pipeline) while the same calls, and refused ones that log too, go on: every call must be answered,
and the lines dropped counted, then said once the pipe is read again.
"""

from __future__ import annotations

import os
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

from bench.cluster import generate, status_sync_body
from bench.deadlines import TOKEN, tls_settings
from bench.run import Server, cpu_seconds, process_tree, serve
from hooks.serving.edge import SOCKET_BYTES, TLS_BYTES

HEAD_SECONDS = 10.0
TRICKLING, STALLED, IDLE = 100, 200, 2000
FULL_HEADS, STALLED_BODIES, HUGE_HEADS = 2300, 80, 60
CHURN_PER_SECOND = 1500
FULL_HEAD_BYTES = 64 * 1024 - 100
STALLED_BODY_SENT = 100
ATTACK_SECONDS = 40.0
UNREAD_STDERR_SECONDS = 60.0
ROOT = Path(__file__).resolve().parent.parent
BODIES = {
    "/status/customize": (ROOT / "examples" / "status-customize.json").read_bytes(),
    "/license/sync": (ROOT / "examples" / "license-sync.json").read_bytes(),
    "/status/sync": status_sync_body(generate("S")),
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

    def __init__(
        self, port: int, admission_port: int, client: ssl.SSLContext, lifetimes: Lifetimes
    ) -> None:
        self.port = port
        self.admission_port = admission_port
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
            threading.Thread(target=self._keep_tls_open, daemon=True),
            threading.Thread(target=self._churn, daemon=True),
        ]
        self.counts = {
            "stalled handshake": 0,
            "idle": 0,
            "64 KiB head": 0,
            "stalled admission body": 0,
            "7 MiB admission head": 0,
        }
        self.churned = 0

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

    def _open_tls(self, shape: str) -> None:
        """A TLS connection that sends its shape's bytes, then waits to be closed."""
        port = self.port if shape == "64 KiB head" else self.admission_port
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        tls = self.client.wrap_socket(raw, server_hostname="127.0.0.1")
        if shape == "64 KiB head":
            tls.sendall(b"POST /status/customize HTTP/1.1\r\nX: " + b"a" * FULL_HEAD_BYTES)
        else:
            declared = 1204 if shape == "stalled admission body" else 7 * 1024 * 1024
            tls.sendall(
                "POST /admit/gpu-budget HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                f"\r\nContent-Length: {declared}\r\n\r\n".encode()
            )
            if shape == "stalled admission body":
                tls.sendall(b"{" * STALLED_BODY_SENT)
        tls.setblocking(False)
        with self.lock:
            self.counts[shape] += 1
            self.selector.register(tls, selectors.EVENT_READ, (shape, time.monotonic()))

    def _keep_tls_open(self) -> None:
        targets = {
            "stalled admission body": STALLED_BODIES,
            "7 MiB admission head": HUGE_HEADS,
            "64 KiB head": FULL_HEADS,
        }
        while not self.stopping.is_set():
            opened = False
            for shape, target in targets.items():
                while self.counts[shape] < target and not self.stopping.is_set():
                    try:
                        self._open_tls(shape)
                    except OSError:
                        break
                    opened = True
            if not opened:
                time.sleep(0.05)

    def _churn(self) -> None:
        """Plain TCP connect and close, CHURN_PER_SECOND of them."""
        started = time.monotonic()
        while not self.stopping.is_set():
            ahead = self.churned / CHURN_PER_SECOND - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
                self.churned += 1
            except OSError:
                time.sleep(0.01)

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
                except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    continue
                except OSError:
                    data = b""
                if data or (isinstance(sock, ssl.SSLSocket) and sock.pending()):
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
                raw = socket.create_connection(("127.0.0.1", self.admission_port), timeout=10)
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
                    f"{url}{route}", data=body, headers=headers, verify=ca, timeout=30
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


def gauge(scrape: str, name: str) -> float:
    for line in scrape.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


class Scrapes:
    """The metrics, scraped every second while the attack runs: the most the admission port
    held for its reviews, and the hooks' memory budget reserved."""

    def __init__(self, url: str, ca: str) -> None:
        self.url, self.ca = url, ca
        self.admission_held = 0.0
        self.hooks_reserved = 0.0
        self.last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scrapes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                text = requests.get(f"{self.url}/metrics", verify=self.ca, timeout=5).text
            except requests.RequestException:
                continue
            self.last = text
            held = gauge(text, "cozystack_gpu_hook_admission_memory_held_bytes")
            self.admission_held = max(self.admission_held, held)
            reserved = gauge(text, "cozystack_gpu_hook_memory_reserved_bytes")
            self.hooks_reserved = max(self.hooks_reserved, reserved)


def unread_stderr(api: str) -> list[tuple[str, bool, str]]:
    """Calls while nobody reads the service's stderr; the checks on what followed."""
    with (
        tls_settings() as (settings, verify),
        serve(api, threads=64, settings=settings, log_pipe=True) as server,
    ):
        assert server.master.stdout is not None
        stop = threading.Event()
        refused: list[int] = []

        def refuse() -> None:  # each refusal is a log line too
            while not stop.is_set():
                with suppress(requests.RequestException):
                    answer = requests.post(f"{server.url}/status/sync", verify=verify, timeout=5)
                    refused.append(answer.status_code)

        # Four at once: one refusing client wrote about as many lines as the queue holds, so
        # whether any was dropped depended on the machine's speed.
        refusing = [threading.Thread(target=refuse, daemon=True) for _ in range(4)]
        for thread in refusing:
            thread.start()
        failures: list[str] = []
        calls, probes = timed_calls(
            server.url, server.health, verify, time.monotonic() + UNREAD_STDERR_SECONDS, failures
        )
        stop.set()
        for thread in refusing:
            thread.join(10)
        scrape = requests.get(f"{server.metrics}/metrics", verify=verify, timeout=10).text
        dropped = gauge(scrape, "cozystack_gpu_log_lines_dropped_total")
        said: list[bytes] = []
        reader = threading.Thread(target=lambda: said.extend(server.master.stdout), daemon=True)
        reader.start()  # the pipeline reads again
        requests.post(f"{server.url}/status/sync", verify=verify, timeout=5)
        time.sleep(2)
        told = any(b'"log lines dropped"' in line for line in said)
    answered = sum(len(values) for values in calls.values())
    print(
        f"[unread stderr] {UNREAD_STDERR_SECONDS:g} s with stderr unread: {answered} "
        f"authenticated calls, {len(refused)} refused ones, {len(probes)} probes; "
        f"{dropped:.0f} lines dropped; said once read again: {told}"
    )
    return [
        ("with stderr unread, no failed call", not failures, f"{failures[:5]}"),
        ("the dropped lines counted", dropped > 0, f"{dropped:.0f}"),
        ("the dropped lines said once stderr is read", told, f"{told}"),
    ]


def apart_cores(server: Server) -> str:
    """The service on one core, this benchmark's clients on the others (where there are two or
    more): a pod's CPU is its own, and its attackers run elsewhere. The unloaded calls run so
    too, so both sides of the comparison have the same core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return "one core: the service and the clients share it"
    for pid in process_tree(server.master.pid):
        with suppress(OSError):
            os.sched_setaffinity(pid, {cores[-1]})
    os.sched_setaffinity(0, set(cores[:-1]))
    return f"the service on core {cores[-1]}, the clients on {cores[:-1]}"


def hostile_clients(api: str) -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    limits = {
        "GPUCLASS_HEADER_TIMEOUT_SECONDS": str(HEAD_SECONDS),
        "GPUCLASS_MEMORY_LIMIT_BYTES": str(2 * 1024**3),
    }
    with tls_settings(**limits) as (settings, verify):
        client = ssl.create_default_context(cafile=verify)
        with serve(api, threads=64, settings=settings) as server:
            placement = apart_cores(server)
            baseline_failures: list[str] = []
            time.sleep(1)
            idle_mb = server.memory_mb()
            calls_unloaded, probes_unloaded = timed_calls(
                server.url, server.health, verify, time.monotonic() + 15, baseline_failures
            )
            lifetimes = Lifetimes()
            port = int(server.url.rsplit(":", 1)[1])
            attack = Attack(port, int(server.admission.rsplit(":", 1)[1]), client, lifetimes)
            attack.start()
            failures: list[str] = []
            with (
                server.peak_memory(every_seconds=0.2) as peak,
                Scrapes(server.metrics, verify) as scrapes,
            ):
                time.sleep(10)  # every shape at its count
                open_at_start = dict(attack.counts)
                churned = attack.churned
                started = time.monotonic()
                cpu_before = (
                    cpu_seconds(server.master.pid),
                    resource.getrusage(resource.RUSAGE_SELF),
                )
                calls, probes = timed_calls(
                    server.url, server.health, verify, time.monotonic() + ATTACK_SECONDS, failures
                )
                took = time.monotonic() - started
                churn_rate = (attack.churned - churned) / took
                cpu_after = cpu_seconds(server.master.pid), resource.getrusage(resource.RUSAGE_SELF)
            scrape = scrapes.last
            attack.stop()
    shown = ("cozystack_gpu_hook_connections", "cozystack_gpu_hook_listen_overflows")
    dropped = [
        line for line in scrape.splitlines()
        if line.startswith(shown) and not line.endswith(" 0.0") and "_created" not in line
    ]  # fmt: skip
    print(
        f"[hostile clients] hook port: {TRICKLING} trickling heads, {STALLED} stalled "
        f"handshakes, {IDLE} idle connections, {FULL_HEADS} 64 KiB heads, connect-and-close "
        f"churn; admission port: {STALLED_BODIES} stalled bodies, {HUGE_HEADS} 7 MiB heads, 1 GB "
        "declarations every 0.2 s; every shape reopened as it closes; none with the token; TLS "
        f"and the token on; head deadline {HEAD_SECONDS:g} s; {ATTACK_SECONDS:g} s measured"
    )
    print(f"  {placement}")
    print(f"  open when the measurement began: {open_at_start}; churn {churn_rate:.0f}/s")
    used = (cpu_after[0] - cpu_before[0]) / took
    client_used = (
        sum(
            getattr(cpu_after[1], field) - getattr(cpu_before[1], field)
            for field in ("ru_utime", "ru_stime")
        )
        / took
    )
    print(f"  cores busy: the service {used:.2f}, this benchmark (the clients) {client_used:.2f}")
    slowdowns = {}
    for route in BODIES:
        slowdowns[route] = p99(calls[route]) - p99(calls_unloaded[route])
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
    # What the anonymous callers' received bytes need: each connection's socket and TLS state,
    # and the bytes of body each sent.
    needed = STALLED_BODIES * (SOCKET_BYTES + TLS_BYTES + STALLED_BODY_SENT) + HUGE_HEADS * (
        SOCKET_BYTES + TLS_BYTES
    )
    print(
        f"  admission port held at most {scrapes.admission_held / 1024:.0f} KiB for anonymous "
        f"reviews (their received bytes need {needed / 1024:.0f} KiB); the hooks' budget "
        f"reserved at most {scrapes.hooks_reserved / 1024**2:.0f} MiB (authenticated syncs)"
    )
    print(f"  memory: idle {idle_mb:.0f} MB, peak {peak.mb:.0f} MB")
    print("  " + "\n  ".join(dropped))
    checks = [
        ("authenticated calls p99 within unloaded p99 + 100 ms",
         all(slowdown <= 100 for slowdown in slowdowns.values()),
         ", ".join(f"{route} +{ms:.0f} ms" for route, ms in slowdowns.items())),
        ("probes p99 <= 50 ms", p99(probes) <= 50, f"{p99(probes):.1f} ms"),
        ("no failed call", not failures and not baseline_failures,
         f"{failures[:5]} {baseline_failures[:5]}"),
        ("every head-less connection closed within its deadline + 1 s",
         bool(longest) and max(longest.values()) <= HEAD_SECONDS + 1, f"{longest}"),
        ("every 1 GB admission declaration answered 413 at once",
         codes == [413], f"{codes}"),
        ("anonymous reviews held no more than their received bytes need",
         scrapes.admission_held <= needed, f"{scrapes.admission_held:.0f} <= {needed}"),
        ("memory within 150 MB of idle", peak.mb - idle_mb <= 150,
         f"{peak.mb - idle_mb:.0f} MB"),
    ]  # fmt: skip
    checks += unread_stderr(api)
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1
