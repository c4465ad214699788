"""Load: ten concurrent L-sized status syncs under the chart's 2 GiB memory limit, with the memory
budget and without it.

    python -m bench.load       # make bench-load: a few minutes, several GB of memory at the peak

Metacontroller runs five workers per controller, so ten calls can arrive at once. In one run this
reports, for a generated cluster of size L (about 455 MB per status sync):
- the ten calls with GPUCLASS_MEMORY_LIMIT_BYTES at 2 GiB (budget 1,792 MiB): the peak memory
  of the serving process and the processes computing large calls, how many were answered 200
  and 429, that none was lost, and that every 200 is the sequential answer;
- the same ten with the budget off (GPUCLASS_MEMORY_BUDGET_BYTES=0), for comparison;
- the latency of a customize call and a license sync made while the L calls wait, against the
  same calls unloaded;
- the throughput of sequential M-sized calls with the budget on and off.

    python -m bench.load --slow-clients   # make bench-load ARGS=--slow-clients

reports instead, in one run under the same 2 GiB limit, 32 stalled clients that carry the bearer
token (a partitioned Metacontroller: half declare 1 MB, half 50 MB, send a little and then
nothing) together with ten concurrent M-sized syncs, retried after Retry-After as Metacontroller
does: the latency of /healthz and /readyz (health port) and of small customize calls, that every
M sync is answered 200 once the stalled clients' deadline passed, and the whole process tree's
peak memory; and, for scale, the p99 of a round trip to a bare loopback echo process under the
same load (what any call on the machine waits for before the service does anything).

    python -m bench.load --hostile-clients   # make bench-load ARGS=--hostile-clients

reports clients without the token that never finish their head, beside authenticated calls
(`bench.hostile`).

    python -m bench.load --slow-heads   # make bench-load ARGS=--slow-heads

reports never-ending heads on the admission port beside kept-alive reviews (`bench.slow_heads`).

    python -m bench.load --slow-api             # make bench-load ARGS=--slow-api
    python -m bench.load --keep-alive-callers   # make bench-load ARGS=--keep-alive-callers

report every call's time against its deadline with an API server that delays and trickles, and
under 300 keep-alive callers (`bench.deadlines`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench.cluster import generate, license_sync_body, status_sync_body
from bench.deadlines import keep_alive_callers, slow_api
from bench.hostile import hostile_clients
from bench.run import MB, answer, kubevirt_api, post, serve
from bench.slow_heads import slow_heads

LIMIT = 2 * 1024 * MB
CALLS = 10
# Small calls timed unloaded, and again while the large ones run (as many as they last for).
SAMPLES = 100
BUDGET_ON = {"GPUCLASS_MEMORY_LIMIT_BYTES": str(LIMIT)}
BUDGET_OFF = {"GPUCLASS_MEMORY_BUDGET_BYTES": "0"}


@dataclass
class Load:
    label: str
    peak_mb: float = 0.0
    codes: list[int] = field(default_factory=list)
    lost: int = 0
    identical: bool = True
    wall_s: float = 0.0
    customize_ms: list[float] = field(default_factory=list)
    license_ms: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)  # calls waiting at each small-call sample


def timed_ms(url: str, body: bytes) -> float:
    started = time.perf_counter()
    post(url, body)
    return 1000 * (time.perf_counter() - started)


def waiting_calls(metrics: str) -> float:
    for line in requests.get(f"{metrics}/metrics", timeout=10).text.splitlines():
        if line.startswith("cozystack_gpu_hook_memory_waiting_calls "):
            return float(line.split()[1])
    return 0.0


def small_calls(
    url: str, customize: bytes, license_body: bytes, samples: int
) -> tuple[list[float], list[float]]:
    customize_ms = [timed_ms(f"{url}/status/customize", customize) for _ in range(samples)]
    license_ms = [timed_ms(f"{url}/license/sync", license_body) for _ in range(samples)]
    return customize_ms, license_ms


def run_load(
    label: str, settings: dict[str, str], api: str, body: bytes, expected: bytes,
    customize: bytes, license_body: bytes,
) -> tuple[Load, tuple[list[float], list[float]]]:  # fmt: skip
    load = Load(label)
    with serve(api, threads=CALLS + 4, settings=settings) as server:
        unloaded = small_calls(server.url, customize, license_body, SAMPLES)
        results: list[requests.Response | Exception] = []

        def call(_: int) -> None:
            try:
                results.append(answer(f"{server.url}/status/sync", body))
            except requests.RequestException as error:
                results.append(error)

        started = time.perf_counter()
        with ThreadPoolExecutor(CALLS) as pool, server.peak_memory() as peak:
            futures = [pool.submit(call, i) for i in range(CALLS)]
            time.sleep(1.0)  # the large calls arrive, and reserve or wait
            # Small calls while the large ones are in flight; with a budget, some of them wait.
            while not all(f.done() for f in futures) and len(load.customize_ms) < SAMPLES:
                load.waiting.append(waiting_calls(server.metrics))
                load.customize_ms.append(timed_ms(f"{server.url}/status/customize", customize))
                load.license_ms.append(timed_ms(f"{server.url}/license/sync", license_body))
        load.wall_s = time.perf_counter() - started
        load.peak_mb = peak.mb
        alive = server.master.poll() is None and requests.get(f"{server.health}/healthz").ok
    for result in results:
        if isinstance(result, Exception):
            load.lost += 1
            continue
        load.codes.append(result.status_code)
        if result.status_code == 200:
            load.identical &= json.loads(result.content) == json.loads(expected)
    load.lost += CALLS - len(results) + (0 if alive else CALLS)
    return load, unloaded


def throughputs(api: str, body: bytes, rounds: int) -> tuple[float, float]:
    """Sequential calls per second with the budget on and off. Both servers run side by side and
    take turns, call by call, so that whatever else the machine does slows both alike."""
    seconds = [0.0, 0.0]
    with (
        serve(api, threads=4, settings=BUDGET_ON) as on,
        serve(api, threads=4, settings=BUDGET_OFF) as off,
    ):
        servers = (on, off)
        for server in servers:
            post(f"{server.url}/status/sync", body)  # warm
        for turn in range(rounds):
            for index in (0, 1) if turn % 2 == 0 else (1, 0):
                started = time.perf_counter()
                post(f"{servers[index].url}/status/sync", body)
                seconds[index] += time.perf_counter() - started
    return rounds / seconds[0], rounds / seconds[1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] if ordered else 0.0


STALLED = 32
TOKEN = "bench-token"
BEARER = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def stall(url: str, declared: int, opened: list[socket.socket]) -> None:
    """A client that carries the token, declares `declared` bytes, sends 64 KiB and then
    nothing, keeping its connection open until the server closes it."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = socket.create_connection((host, int(port)))
    head = (
        f"POST /status/sync HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    )
    connection.sendall(head.encode() + b" " * 65536)
    opened.append(connection)


def synced_until_200(url: str, body: bytes, deadline: float) -> tuple[int, int]:
    """Post until 200, honouring Retry-After as Metacontroller does; (final code, attempts)."""
    attempts = 0
    while True:
        attempts += 1
        try:
            response = requests.post(url, data=body, headers=BEARER, timeout=60)
        except requests.RequestException:
            code, wait = 0, 1.0
        else:
            code = response.status_code
            wait = float(response.headers.get("Retry-After", "1"))
        if code == 200 or time.monotonic() + wait > deadline:
            return code, attempts
        time.sleep(wait)


def echo_forever(listening: socket.socket) -> None:
    """Echo each byte back, on the first connection: the machine's own round trip, for scale."""
    connection, _ = listening.accept()
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := connection.recv(64):
        connection.sendall(data)


@contextmanager
def echo_round_trip() -> Iterator[Callable[[], float]]:
    """A process that echoes bytes on loopback, and a function timing one round trip to it:
    what any call on this machine waits for, under the same load, before the service does
    anything."""
    listening = socket.create_server(("127.0.0.1", 0))
    echo = multiprocessing.get_context("fork").Process(
        target=echo_forever, args=(listening,), daemon=True
    )
    echo.start()
    with socket.create_connection(listening.getsockname()) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listening.close()

        def timed() -> float:
            started = time.perf_counter()
            connection.sendall(b"x")
            connection.recv(64)
            return 1000 * (time.perf_counter() - started)

        yield timed
    echo.join(timeout=5)


def timed_get(url: str) -> float:
    started = time.perf_counter()
    requests.get(url, timeout=10).raise_for_status()
    return 1000 * (time.perf_counter() - started)


def slow_clients(api: str, size: str) -> int:
    """32 stalled clients with the token, and ten concurrent syncs of `size`."""
    body = status_sync_body(generate(size))
    customize = example_customize(body)
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp, "tokens")
        tokens.write_text(TOKEN + "\n")
        settings = {**BUDGET_ON, "GPUCLASS_AUTH_TOKEN_FILE": str(tokens)}
        with serve(api, threads=64, settings=settings) as server, echo_round_trip() as echo:
            small = f"{server.url}/status/customize"
            unloaded = [timed_post(small, customize) for _ in range(SAMPLES)]
            echoes_unloaded = [echo() for _ in range(SAMPLES)]
            probes_unloaded = [timed_get(f"{server.health}/readyz") for _ in range(SAMPLES)]
            opened: list[socket.socket] = []
            results: list[tuple[int, int]] = []
            started = time.monotonic()
            with server.peak_memory() as peak:
                for index in range(STALLED):
                    stall(server.url, 1_000_000 if index % 2 else 50_000_000, opened)
                time.sleep(0.5)
                syncs = [
                    threading.Thread(
                        target=lambda: results.append(
                            synced_until_200(f"{server.url}/status/sync", body, started + 120)
                        )
                    )
                    for _ in range(CALLS)
                ]
                for thread in syncs:
                    thread.start()
                probes: list[float] = []
                loaded: list[float] = []
                echoes: list[float] = []
                while any(thread.is_alive() for thread in syncs):
                    probes.append(timed_get(f"{server.health}/healthz"))
                    probes.append(timed_get(f"{server.health}/readyz"))
                    loaded.append(timed_post(small, customize))
                    echoes.append(echo())
                    time.sleep(0.05)
                wall = time.monotonic() - started
            for connection in opened:
                connection.close()
            scrape = requests.get(f"{server.metrics}/metrics", timeout=10).text
    deadlines = [
        line
        for line in scrape.splitlines()
        if "apart_calls_total{" in line or "memory_refused_total{" in line
    ]
    print(f"[slow clients] {STALLED} stalled (half 1 MB, half 50 MB declared), {CALLS} x "
          f"{len(body) / MB:.0f} MB syncs; 64 threads; memory limit {LIMIT // MB} MB; "
          "body deadline 10 s + size at 8 MiB/s, at most the 30 s hook timeout")  # fmt: skip
    print(
        f"  probes: p99 {p99(probes):.1f} ms (unloaded {p99(probes_unloaded):.1f} ms), "
        f"{len(probes)} samples"
    )
    print(
        f"  customize: p99 {p99(loaded):.1f} ms (unloaded {p99(unloaded):.1f} ms), "
        f"median {median(loaded):.1f} ms (unloaded {median(unloaded):.1f} ms)"
    )
    print(
        f"  for scale, a loopback round trip to a bare echo process: p99 {p99(echoes):.1f} ms "
        f"(unloaded {p99(echoes_unloaded):.1f} ms)"
    )
    codes = [code for code, _ in results]
    print(
        f"  syncs: {codes.count(200)}/{CALLS} answered 200, attempts "
        f"{sorted(attempts for _, attempts in results)}, all done in {wall:.1f} s"
    )
    print(f"  peak memory of the process tree: {peak.mb:,.0f} MB")
    print("  " + "\n  ".join(deadlines))
    checks = [
        ("probes answer within 50 ms at p99", p99(probes) <= 50, f"{p99(probes):.1f} ms"),
        ("customize within unloaded + 10 ms at p99", p99(loaded) <= p99(unloaded) + 10,
         f"{p99(loaded):.1f} vs {p99(unloaded):.1f} ms"),
        ("every sync answered 200", codes.count(200) == CALLS, f"{codes}"),
        (f"peak memory under {LIMIT // MB} MB", peak.mb < LIMIT / MB, f"{peak.mb:.0f} MB"),
    ]  # fmt: skip
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


def example_customize(sync_body: bytes) -> bytes:
    """A customize request for the class the sync is about."""
    parent = json.loads(sync_body)["parent"]
    return json.dumps({"controller": {}, "parent": parent}).encode()


def timed_post(url: str, body: bytes) -> float:
    started = time.perf_counter()
    requests.post(url, data=body, headers=BEARER, timeout=60).raise_for_status()
    return 1000 * (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench.load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", default="L", help="cluster size of the concurrent calls")
    parser.add_argument("--sequential", default="M", help="size of the sequential calls")
    parser.add_argument(
        "--slow-clients", action="store_true", help="stalled clients beside M-sized syncs"
    )
    parser.add_argument(
        "--slow-api",
        action="store_true",
        help="reviews and syncs against an API server that delays and trickles (bench.deadlines)",
    )
    parser.add_argument(
        "--keep-alive-callers",
        action="store_true",
        help="300 keep-alive callers of customize beside a baseline (bench.deadlines)",
    )
    parser.add_argument(
        "--slow-heads",
        action="store_true",
        help="never-ending heads on the admission port, kept-alive reviews (bench.slow_heads)",
    )
    parser.add_argument(
        "--hostile-clients",
        action="store_true",
        help="connections without the token that never finish their head (bench.hostile)",
    )
    args = parser.parse_args(argv)
    if args.slow_api:
        return slow_api()
    if args.keep_alive_callers:
        return keep_alive_callers()
    if args.slow_heads:
        return slow_heads()
    if args.hostile_clients:
        with kubevirt_api() as api:
            return hostile_clients(api)
    if args.slow_clients:
        with kubevirt_api() as api:
            return slow_clients(api, "M")
    checks: list[tuple[str, bool, str]] = []
    large = generate(args.size)
    first = status_sync_body(large)
    license_body = license_sync_body(large)
    customize = json.dumps(
        {"controller": {}, "parent": json.loads(large.classes["l40s-24q"])}
    ).encode()
    with kubevirt_api() as api:
        # The status fed back as the parent's: the hook is idempotent, so every later answer must
        # be byte-for-byte this one (condition times included).
        with serve(api, threads=2, settings=BUDGET_OFF) as server:
            status = json.loads(post(f"{server.url}/status/sync", first))["status"]
            del first
            body = status_sync_body(large, parent_status=status)
            expected = post(f"{server.url}/status/sync", body)
        print(
            f"[{args.size}] /status/sync body {len(body) / MB:.0f} MB, {CALLS} at once", flush=True
        )
        loads = []
        for label, settings in (("budget on (2 GiB limit)", BUDGET_ON), ("budget off", BUDGET_OFF)):
            load, unloaded = run_load(label, settings, api, body, expected, customize, license_body)
            loads.append((load, unloaded))
        del large, body
        medium = status_sync_body(generate(args.sequential))
        on, off = throughputs(api, medium, 30)

    print()
    print(f"| {CALLS} concurrent {args.size} syncs | peak memory | 200 | 429 | lost | wall | "
          "customize unloaded / loaded | license sync unloaded / loaded |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for load, (customize_ms, license_ms) in loads:
        print(
            f"| {load.label} | {load.peak_mb:,.0f} MB | {load.codes.count(200)} | "
            f"{load.codes.count(429)} | {load.lost} | {load.wall_s:.1f} s | "
            f"{median(customize_ms):.1f} / {median(load.customize_ms):.1f} ms "
            f"(max {max(load.customize_ms, default=float('nan')):.0f}) | "
            f"{median(license_ms):.1f} / {median(load.license_ms):.1f} ms "
            f"(max {max(load.license_ms, default=float('nan')):.0f}) |"
        )
    print(f"\nsequential {args.sequential} calls: {on:.2f}/s with the budget, {off:.2f}/s without")
    print()

    budgeted, (customize_ms, license_ms) = loads[0]
    checks += [
        (f"budget on: peak memory under {LIMIT // MB} MB", budgeted.peak_mb < LIMIT / MB,
         f"{budgeted.peak_mb:.0f} MB"),
        ("budget on: every call answered 200 or 429, none lost",
         budgeted.lost == 0 and set(budgeted.codes) <= {200, 429} and len(budgeted.codes) == CALLS,
         f"{budgeted.codes.count(200)} x 200, {budgeted.codes.count(429)} x 429"),
        ("budget on: every 200 is the sequential answer", budgeted.identical, ""),
        ("budget on: large calls were waiting while the small calls were made",
         bool(budgeted.waiting) and min(budgeted.waiting) > 0,
         f"waiting {min(budgeted.waiting, default=0):.0f}-{max(budgeted.waiting, default=0):.0f}"),
        ("small calls while large ones wait: customize within unloaded + 10 ms",
         median(budgeted.customize_ms) <= median(customize_ms) + 10,
         f"{median(budgeted.customize_ms):.1f} vs {median(customize_ms):.1f} ms"),
        ("small calls while large ones wait: license sync within unloaded + 10 ms",
         median(budgeted.license_ms) <= median(license_ms) + 10,
         f"{median(budgeted.license_ms):.1f} vs {median(license_ms):.1f} ms"),
        (f"sequential {args.sequential}: throughput with the budget within 5% of without",
         on >= 0.95 * off, f"{on / off:.3f}"),
    ]  # fmt: skip
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
