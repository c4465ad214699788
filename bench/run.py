"""Benchmark: decode + rules, the HTTP round trip, and memory, on generated clusters.

    python -m bench.run                 # sizes S and M
    python -m bench.run --sizes S,M,L   # everything (L builds the largest request; a few minutes)

For each size, on the same request bodies: the hook in process (decode, rules, encode), the full
HTTP round trip against `gpuclass-hooks serve` on loopback with its peak memory (the worker and
the processes it computes large calls in, sampled every 10 ms), the
decode floor (one msgspec pass into the same typed structures, nothing else), and the common
approach (json.loads and dict walking). Every method must produce the same status; the table
gives medians, ratios to the floor and to the common approach, and MB.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import requests

from bench.cluster import (
    GPU_RESOURCES,
    Cluster,
    dra_sync_body,
    generate,
    generate_dra,
    license_sync_body,
    status_sync_body,
)
from bench.common import free_units
from hooks.controllers import license, status
from hooks.rules.permitted_devices import KubeVirtFound
from hooks.settings import Settings
from hooks.wire.kube import GPUClass, KubeVirt, Namespace, Node, Pod, Secret
from hooks.wire.metacontroller import decode_composite_sync, decode_decorator_sync, encode

MB = 1024 * 1024
CONCURRENCY = 5
KUBEVIRT = {
    "status": {"observedKubeVirtVersion": "v1.9.0"},
    "spec": {
        "configuration": {
            "permittedHostDevices": {
                "pciHostDevices": [
                    {"pciVendorSelector": "10DE:26B9", "resourceName": r} for r in GPU_RESOURCES
                ]
            }
        }
    },
}


class _FloorGroups(msgspec.Struct):
    nodes: dict[str, Node] = msgspec.field(default_factory=dict, name="Node.v1")
    pods: dict[str, Pod] = msgspec.field(default_factory=dict, name="Pod.v1")
    classes: dict[str, GPUClass] = msgspec.field(
        default_factory=dict, name="GPUClass.cozystack.io/v1alpha1"
    )
    secrets: dict[str, Secret] = msgspec.field(default_factory=dict, name="Secret.v1")
    namespaces: dict[str, Namespace] = msgspec.field(default_factory=dict, name="Namespace.v1")


class _Floor(msgspec.Struct):
    parent: GPUClass
    related: _FloorGroups


_FLOOR = msgspec.json.Decoder(_Floor)


def decode_floor(body: bytes) -> Any:
    """The fastest available decoding into just the fields the rules read: one typed pass."""
    return _FLOOR.decode(body)


def in_process(body: bytes, settings: Settings, view: KubeVirtFound) -> bytes:
    outcome = status.sync(decode_composite_sync(body), settings, lambda: view, datetime.now(UTC))
    return encode(outcome.response)


# Turns of the DRA class's request and the device-plugin one it is compared with.
DRA_TURNS = 25


def medians_in_turn(
    first: Callable[[], Any], second: Callable[[], Any], repeat: int
) -> tuple[tuple[float, Any], tuple[float, Any]]:
    """The median seconds and last result of each of two calls, made in turn: a machine whose
    speed drifts (shared cores) then slows both alike, and their ratio holds."""
    times: tuple[list[float], list[float]] = ([], [])
    results: list[Any] = [None, None]
    for _ in range(repeat):
        for index, run in enumerate((first, second)):
            started = time.perf_counter()
            results[index] = run()
            times[index].append(time.perf_counter() - started)
    return (
        (statistics.median(times[0]), results[0]),
        (statistics.median(times[1]), results[1]),
    )


def median_seconds(run: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


@contextmanager
def kubevirt_api() -> Iterator[str]:
    payload = json.dumps(KUBEVIRT).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def process_tree(root: int) -> list[int]:
    """`root` and every process below it, from the parent pids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def cpu_seconds(root: int) -> float:
    """CPU time (user and system) of `root` and every process below it, those already reaped
    included (the service computes some calls in processes that end), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in process_tree(root):
        with suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(fields[index]) for index in (11, 12, 13, 14))
    return total / ticks


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass  # the process ended between listing and reading
    return 0


def _unmapped_memfd_kib(pids: list[int]) -> int:
    """Memory files the processes hold open but none maps (a body being written for a child to
    map): their pages are charged to the container but are in no process's PSS."""
    held: dict[int, int] = {}
    mapped: set[int] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                if "memfd:" in os.readlink(fd):
                    stat = fd.stat()
                    held[stat.st_ino] = stat.st_blocks * 512 // 1024
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "memfd:" in line:
                    mapped.add(int(line.split()[4]))
        except OSError:
            continue  # ended, or closed the file, meanwhile
    return sum(kib for inode, kib in held.items() if inode not in mapped)


@dataclass
class Peak:
    mb: float = 0.0


@dataclass
class Server:
    """The serving gunicorn. Its memory is the worker's and its descendants' (the fork server and
    the processes computing large calls), each page counted once: the sum of their PSS, plus the
    bodies being written into memory files no process maps yet. That is what the container's
    memory limit is charged."""

    url: str
    master: subprocess.Popen[bytes]
    health: str  # /healthz and /readyz
    metrics: str  # /metrics
    admission: str  # the admission reviews

    def worker_pid(self) -> int:
        return process_tree(self.master.pid)[1]

    def memory_mb(self) -> float:
        pids = process_tree(self.worker_pid())
        return (sum(_pss_kib(pid) for pid in pids) + _unmapped_memfd_kib(pids)) / 1024

    @contextmanager
    def peak_memory(self, every_seconds: float = 0.01) -> Iterator[Peak]:
        """The highest memory_mb sampled while the block runs."""
        peak = Peak(self.memory_mb())
        done = threading.Event()

        def sample() -> None:
            while not done.wait(every_seconds):
                peak.mb = max(peak.mb, self.memory_mb())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield peak
        finally:
            done.set()
            sampler.join()
            peak.mb = max(peak.mb, self.memory_mb())


@contextmanager
def serve(
    api: str, threads: int, settings: dict[str, str] | None = None, *, log_pipe: bool = False
) -> Iterator[Server]:
    """`gpuclass-hooks serve` on loopback, with extra GPUCLASS_ settings if given; its output to
    a file, or with `log_pipe` to a pipe the caller reads (or, to stall it, does not)."""
    with tempfile.TemporaryDirectory() as tmp:
        from tests.live import free_port

        port, health_port, metrics_port = free_port(), free_port(), free_port()
        admission_port = free_port()
        env = {
            **os.environ,
            "GPUCLASS_KUBE_API": api,
            "GPUCLASS_KUBE_TOKEN_FILE": f"{tmp}/none",
            "GPUCLASS_KUBEVIRT_CACHE_SECONDS": "60",
            **(settings or {}),
        }
        log = Path(tmp, "serve.log").open("wb")  # noqa: SIM115 - open as long as the server runs
        master = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hooks.cli",
                "serve",
                "--bind",
                f"127.0.0.1:{port}",
                "--threads",
                str(threads),
                f"--health-port={health_port}",
                f"--metrics-port={metrics_port}",
                f"--admission-port={admission_port}",
            ],
            env=env,
            stdout=subprocess.PIPE if log_pipe else log,
            stderr=subprocess.STDOUT,
        )
        scheme = "https" if "GPUCLASS_TLS_CERT_FILE" in env else "http"
        url = f"{scheme}://127.0.0.1:{port}"
        health, metrics = f"http://127.0.0.1:{health_port}", f"{scheme}://127.0.0.1:{metrics_port}"
        try:
            for _ in range(200):
                try:
                    requests.get(f"{health}/readyz", timeout=1).raise_for_status()
                    break
                except requests.RequestException:
                    time.sleep(0.1)
            admission = f"{scheme}://127.0.0.1:{admission_port}"
            yield Server(url, master, health, metrics, admission)
        finally:
            master.send_signal(signal.SIGTERM)
            master.wait(timeout=60)
            log.close()


def post(url: str, body: bytes) -> bytes:
    response = answer(url, body)
    response.raise_for_status()
    return response.content


def answer(url: str, body: bytes) -> requests.Response:
    return requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=120)


@dataclass
class Row:
    size: str
    method: str
    seconds: float
    megabytes: float | None = None


def bench_size(
    size: str, repeat: int, api: str, rows: list[Row], checks: list[tuple[str, bool, str]]
) -> None:
    cluster: Cluster = generate(size)
    settings = Settings(kube_api=api)
    view = KubeVirtFound(msgspec.convert(KUBEVIRT, KubeVirt), "cozy-kubevirt/kubevirt")
    # Feed the status back as the parent's: the hook is idempotent, so every later answer, in
    # process or over HTTP, must be byte-for-byte the same.
    first = json.loads(in_process(status_sync_body(cluster), settings, view))
    body = status_sync_body(cluster, parent_status=first["status"])
    body_mb = len(body) / MB
    selected = status_sync_body(cluster, selected=True, parent_status=first["status"])
    selected_mb = len(selected) / MB
    print(
        f"[{size}] {len(cluster.nodes)} nodes, {len(cluster.pods)} pods: "
        f"/status/sync body {body_mb:.1f} MB, with the documented selectors {selected_mb:.1f} MB",
        flush=True,
    )

    floor_s, _ = median_seconds(lambda: decode_floor(body), repeat)
    ours_s, ours = median_seconds(lambda: in_process(body, settings, view), repeat)
    common_s, common = median_seconds(lambda: free_units(body), max(1, min(repeat, 2)))
    expected = json.loads(ours)
    dra = generate_dra(cluster, size)
    dra_first = json.loads(in_process(dra_sync_body(cluster, dra), settings, view))
    dra_body = dra_sync_body(cluster, dra, parent_status=dra_first["status"])
    dra_expected = json.loads(in_process(dra_body, settings, view))
    print(
        f"[{size}] a DRA class: {len(dra.slices)} slices, {len(dra.claims)} allocated claims: "
        f"/status/sync body {len(dra_body) / MB:.1f} MB",
        flush=True,
    )
    with serve(api, threads=CONCURRENCY) as server:
        idle_mb = server.memory_mb()
        with server.peak_memory() as single_peak:
            http_s, answer = median_seconds(lambda: post(f"{server.url}/status/sync", body), repeat)
        license_body = license_sync_body(cluster)
        license_s, license_answer = median_seconds(
            lambda: post(f"{server.url}/license/sync", license_body), repeat
        )
        with ThreadPoolExecutor(CONCURRENCY) as pool, server.peak_memory() as concurrent_peak:
            started = time.perf_counter()
            answers = list(
                pool.map(lambda _: post(f"{server.url}/status/sync", body), range(CONCURRENCY))
            )
            concurrent_s = time.perf_counter() - started
        (selected_s, _), (dra_s, dra_answer) = medians_in_turn(
            lambda: post(f"{server.url}/status/sync", selected),
            lambda: post(f"{server.url}/status/sync", dra_body),
            max(repeat, DRA_TURNS),
        )
        with server.peak_memory() as dra_peak:
            post(f"{server.url}/status/sync", dra_body)
        after_mb = server.memory_mb()
    local_license = encode(license.sync(decode_decorator_sync(license_body), settings).response)

    rows += [
        Row(size, "decode floor (msgspec, one typed pass)", floor_s),
        Row(size, "hook in process (decode + rules + encode)", ours_s),
        Row(size, "HTTP round trip (gpuclass-hooks serve)", http_s, single_peak.mb),
        Row(
            size, f"{CONCURRENCY} concurrent HTTP requests (wall)", concurrent_s, concurrent_peak.mb
        ),
        Row(size, "common approach (json.loads + dicts)", common_s),
        Row(size, "/license/sync HTTP round trip", license_s),
        Row(size, "HTTP, the documented selectors' request", selected_s),
        Row(size, "a DRA class's HTTP round trip", dra_s, dra_peak.mb),
    ]
    print(f"[{size}] memory idle {idle_mb:.0f} MB, after the run {after_mb:.0f} MB", flush=True)

    same = (
        json.loads(answer) == expected
        and all(json.loads(a) == expected for a in answers)
        and (expected["status"]["free"], expected["status"]["maxFreePerNode"]) == common
        and json.loads(license_answer) == json.loads(local_license)
    )
    checks.append(
        (
            f"{size}: every method produced the same status",
            same,
            "free={free} maxFreePerNode={maxFreePerNode}".format(**expected["status"]),
        )
    )
    checks.append(
        (
            f"{size}: the DRA class's answer over HTTP is its answer in process",
            json.loads(dra_answer) == dra_expected and dra_expected["status"]["free"] > 0,
            "free={free} maxFreePerNode={maxFreePerNode}".format(**dra_expected["status"]),
        )
    )
    if size == "M":
        checks.append(
            (
                "M: a DRA class's sync <= 1.5x a device-plugin class's, the documented "
                "selectors' request (HTTP, in turn)",
                dra_s <= 1.5 * selected_s,
                f"{dra_s / selected_s:.2f}x (of the every-pod request: {dra_s / http_s:.2f}x)",
            )
        )
    if size in ("M", "L"):
        checks.append(
            (
                f"{size}: in process <= 1.5x floor",
                ours_s <= 1.5 * floor_s,
                f"{ours_s / floor_s:.2f}x",
            )
        )
        bound = 2 * body_mb + 150
        checks.append(
            (
                f"{size}: peak memory <= 2x body + 150 MB ({bound:.0f} MB)",
                single_peak.mb <= bound,
                f"{single_peak.mb:.0f} MB",
            )
        )
        checks.append(
            (
                f"{size}: {CONCURRENCY} concurrent within {CONCURRENCY}x the bound",
                concurrent_peak.mb <= CONCURRENCY * bound,
                f"{concurrent_peak.mb:.0f} MB",
            )
        )
    if size == "M":
        checks.append(("M: HTTP <= 3x floor", http_s <= 3 * floor_s, f"{http_s / floor_s:.2f}x"))
        checks.append(
            (
                "M: HTTP >= 10x faster than the common approach",
                common_s >= 10 * http_s,
                f"{common_s / http_s:.1f}x",
            )
        )
    if size == "L":
        checks.append(("L: well inside the 30 s hook timeout", http_s <= 10, f"{http_s:.1f} s"))


def print_table(rows: list[Row]) -> None:
    floors = {r.size: r.seconds for r in rows if r.method.startswith("decode floor")}
    commons = {r.size: r.seconds for r in rows if r.method.startswith("common")}
    header = ("size", "method", "median s", "x floor", "x common", "peak MB")
    print("\n{:<4} {:<44} {:>9} {:>8} {:>9} {:>8}".format(*header))
    for r in rows:
        mb = f"{r.megabytes:.0f}" if r.megabytes is not None else ""
        print(
            f"{r.size:<4} {r.method:<44} {r.seconds:>9.3f} {r.seconds / floors[r.size]:>8.2f} "
            f"{r.seconds / commons[r.size]:>9.3f} {mb:>8}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="S,M", help="comma-separated: S, M, L (default S,M)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method (median)")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    checks: list[tuple[str, bool, str]] = []
    with kubevirt_api() as api:
        for size in args.sizes.split(","):
            bench_size(size.strip(), args.repeat, api, rows, checks)
    print_table(rows)
    print()
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
