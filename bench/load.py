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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import requests

from bench.cluster import generate, license_sync_body, status_sync_body
from bench.run import MB, answer, kubevirt_api, post, serve

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


def waiting_calls(url: str) -> float:
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
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
                load.waiting.append(waiting_calls(server.url))
                load.customize_ms.append(timed_ms(f"{server.url}/status/customize", customize))
                load.license_ms.append(timed_ms(f"{server.url}/license/sync", license_body))
        load.wall_s = time.perf_counter() - started
        load.peak_mb = peak.mb
        alive = server.master.poll() is None and requests.get(f"{server.url}/healthz").ok
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench.load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", default="L", help="cluster size of the concurrent calls")
    parser.add_argument("--sequential", default="M", help="size of the sequential calls")
    args = parser.parse_args(argv)
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
