"""Deadlines: the service against a slow API server, and under a crowd of keep-alive callers.

    python -m bench.load --slow-api              # make bench-load ARGS=--slow-api
    python -m bench.load --keep-alive-callers    # make bench-load ARGS=--keep-alive-callers

`--slow-api` runs the service as the chart does (TLS, the token, 64 threads) against a stub API
server on 127.0.0.1 whose answers are, in turn, prompt (the baseline), delayed 2.5 s per read,
trickled one byte a second (each gap within the read timeout), and prompt again. In each phase,
budget reviews (a pool of a bounded tenant, so every review reads the API) and status syncs
(each reading the KubeVirt CR) are sent at once, and each call's time and answer are recorded:
every review must be answered within the webhook's timeout less its margin, every status sync
within its hook timeout less its margin; after the API server recovers,
the next status sync sees KubeVirt again; and no call is left in progress.

`--keep-alive-callers` runs 300 callers, each on a kept-alive connection, sending status
customize calls back to back (Debian's `wrk`, which must be installed), beside an unloaded
baseline: every call answered within its deadline, and the service's own latency histogram (from
when the edge took each call) against what the callers measured.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import trustme

from bench.run import KUBEVIRT, serve
from tests.builders import admission_review, example_of, gpus, helmrelease

TOKEN = "bench-token"
BEARER = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
GPU = "nvidia.com/NVIDIA_L40S-24Q"  # the class of examples/status-sync.json, which KUBEVIRT permits
REVIEW_WITHIN, SYNC_WITHIN = 9.0, 29.0
CALLS_PER_PHASE = 20
CALLERS, CROWD_SECONDS = 300, 30


@dataclass
class Stub:
    """How the stub API server answers now: after `delay` seconds, and `trickle` seconds between
    the bytes of its body."""

    delay: float = 0.0
    trickle: float = 0.0
    reads: int = 0


@contextmanager
def stub_api() -> Iterator[tuple[str, Stub]]:
    stub = Stub()
    bounded = {"resourceQuotas": {"gpuclass.cozystack.io/devices": "100"}}
    tenants = [
        helmrelease("Tenant", "tenant-root", "root", {}),
        helmrelease("Tenant", "tenant-root", "a", bounded),
    ]
    l40s = {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": "l40s", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"resourceName": GPU},
    }

    def listed(items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Its head and body leave in two writes: with Nagle's algorithm the second waits for the
        # client's delayed ACK, and each read would take tens of milliseconds of the stub's.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            stub.reads += 1
            if "kubevirts" in self.path:
                answer: dict[str, Any] = KUBEVIRT
            else:
                answer = listed([l40s] if "gpuclasses" in self.path else tenants)
            body = json.dumps(answer).encode()
            time.sleep(stub.delay)
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not stub.trickle:
                    self.wfile.write(body)
                    return
                for byte in body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(stub.trickle)
            except OSError:
                pass  # the service gave up on the read

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", stub
    finally:
        server.shutdown()


@contextmanager
def tls_settings(**extra: str) -> Iterator[tuple[dict[str, str], str]]:
    """The service's settings as the chart runs it (a serving certificate, a token file), and
    the CA file its callers trust: for every benchmark that calls it over TLS with the token."""
    with tempfile.TemporaryDirectory() as tmp:
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1")
        files = {name: Path(tmp, name) for name in ("tls.crt", "tls.key", "ca.crt", "tokens")}
        leaf.private_key_and_cert_chain_pem.write_to_path(str(files["tls.crt"]))
        leaf.private_key_pem.write_to_path(str(files["tls.key"]))
        ca.cert_pem.write_to_path(str(files["ca.crt"]))
        files["tokens"].write_text(TOKEN + "\n")
        settings = {
            "GPUCLASS_TLS_CERT_FILE": str(files["tls.crt"]),
            "GPUCLASS_TLS_KEY_FILE": str(files["tls.key"]),
            "GPUCLASS_AUTH_TOKEN_FILE": str(files["tokens"]),
            **extra,
        }
        yield settings, str(files["ca.crt"])


@dataclass
class Phase:
    label: str
    reviews: list[tuple[float, str]] = field(default_factory=list)  # seconds, verdict
    syncs: list[tuple[float, str]] = field(default_factory=list)  # seconds, KubeVirt's condition


def review_call(url: str, verify: str) -> tuple[float, str]:
    body = admission_review("VMInstance", "tenant-a", "v", {"gpus": gpus(GPU)})
    started = time.monotonic()
    answer = requests.post(f"{url}/admit/gpu-budget", json=body, verify=verify, timeout=60)
    seconds = time.monotonic() - started
    verdict = answer.json()["response"]
    said = "allowed" if verdict["allowed"] else verdict["status"]["message"]
    return seconds, said


def sync_call(url: str, verify: str) -> tuple[float, str]:
    body = example_of("/status/sync")
    started = time.monotonic()
    answer = requests.post(
        f"{url}/status/sync", data=body, headers=BEARER, verify=verify, timeout=60
    )
    seconds = time.monotonic() - started
    conditions = answer.json()["status"]["conditions"]
    permitted = next(c for c in conditions if c["type"] == "ResourceNameNotPermitted")
    return seconds, f"{permitted['status']} {permitted['reason']}"


def slow_api() -> int:
    with (
        stub_api() as (api, stub),
        tls_settings(GPUCLASS_KUBEVIRT_CACHE_SECONDS="0", GPUCLASS_KUBE_TIMEOUT_SECONDS="3") as (
            settings,
            verify,
        ),
        serve(api, threads=64, settings=settings) as server,
    ):
        phases = []
        for label, delay, trickle in (
            ("prompt (baseline)", 0.0, 0.0),
            ("every read after 2.5 s", 2.5, 0.0),
            ("bodies trickled 1 byte/s", 0.0, 1.0),
            ("recovered", 0.0, 0.0),
        ):
            stub.delay, stub.trickle = delay, trickle
            phase = Phase(label)
            with ThreadPoolExecutor(2 * CALLS_PER_PHASE) as pool:
                reviews = [
                    pool.submit(review_call, server.admission, verify)
                    for _ in range(CALLS_PER_PHASE)
                ]
                syncs = [pool.submit(sync_call, server.url, verify) for _ in range(CALLS_PER_PHASE)]
                phase.reviews = [f.result() for f in reviews]
                phase.syncs = [f.result() for f in syncs]
            phases.append(phase)
        time.sleep(1)
        scrape = requests.get(f"{server.metrics}/metrics", verify=verify, timeout=10).text
    in_progress = next(
        float(line.split()[-1]) for line in scrape.splitlines()
        if line.startswith("cozystack_gpu_hook_calls_in_progress ")
    )  # fmt: skip
    print(f"[slow API] {CALLS_PER_PHASE} budget reviews and {CALLS_PER_PHASE} status syncs at "
          "once per phase; TLS and the token on; 64 threads; kube timeout 3 s")  # fmt: skip
    print(
        "| phase | reviews: slowest | review answers | syncs: slowest | KubeVirt as syncs saw it |"
    )
    print("|---|---|---|---|---|")
    for phase in phases:
        answers = sorted({said[:70] for _, said in phase.reviews})
        seen = sorted({said for _, said in phase.syncs})
        print(f"| {phase.label} | {max(s for s, _ in phase.reviews):.2f} s | {answers} | "
              f"{max(s for s, _ in phase.syncs):.2f} s | {seen} |")  # fmt: skip
    recovered = phases[-1]
    checks = [
        (f"every review answered within {REVIEW_WITHIN:g} s",
         all(s <= REVIEW_WITHIN for p in phases for s, _ in p.reviews),
         f"{max(s for p in phases for s, _ in p.reviews):.2f} s"),
        (f"every status sync answered within {SYNC_WITHIN:g} s",
         all(s <= SYNC_WITHIN for p in phases for s, _ in p.syncs),
         f"{max(s for p in phases for s, _ in p.syncs):.2f} s"),
        ("after recovery every status sync sees KubeVirt",
         all(said == "False Permitted" for _, said in recovered.syncs),
         f"{sorted({said for _, said in recovered.syncs})}"),
        ("after recovery every review is a verdict",
         all(said == "allowed" for _, said in recovered.reviews), ""),
        ("no call in progress afterwards", in_progress == 0, f"{in_progress:g}"),
    ]  # fmt: skip
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


def histogram_p99(scrape: str, route: str) -> float:
    """The p99 the service's own latency histogram gives (the upper bound of its bucket)."""
    buckets = []
    for line in scrape.splitlines():
        if (
            line.startswith("cozystack_gpu_hook_request_duration_seconds_bucket{")
            and f'route="{route}"' in line
        ):
            bound = line.split('le="')[1].split('"')[0]
            buckets.append(
                (float("inf") if bound == "+Inf" else float(bound), float(line.split()[-1]))
            )
    buckets.sort()
    total = buckets[-1][1]
    return next(bound for bound, count in buckets if count >= 0.99 * total)


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
"""


def wrk_crowd(url: str, seconds: float, callers: int) -> dict[str, float]:
    """Debian's wrk (C, two threads): 300 kept-alive connections cost the callers' side little
    CPU, so what they measure is the service's answer, not a Python client's wait for its GIL."""
    body = json.dumps(
        {"controller": {}, "parent": json.loads(example_of("/status/sync"))["parent"]}
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(WRK_SCRIPT % (body, TOKEN))
        script.flush()
        run = subprocess.run(
            ["wrk", f"-t{min(2, callers)}", f"-c{callers}", f"-d{seconds:g}s", "--latency",
             "--timeout", "60s", "-s", script.name, f"{url}/status/customize"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    out = run.stdout
    figures = {"non_2xx": 0.0, "errors": 0.0}
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["99%"]:
            figures["p99"] = seconds_of(words[1])
        elif words[:1] == ["Latency"] and len(words) > 4:
            figures["max"] = seconds_of(words[3])
        elif "requests in" in line:
            figures["calls"] = float(words[0])
        elif line.strip().startswith("Non-2xx"):
            figures["non_2xx"] = float(words[-1])
        elif line.strip().startswith("Socket errors"):
            figures["errors"] = sum(float(w.rstrip(",")) for w in words[3::2])
    return figures


def seconds_of(text: str) -> float:
    for unit, scale in (("us", 1e-6), ("ms", 1e-3), ("s", 1.0), ("m", 60.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


def bucket_of(scrape: str, route: str, seconds: float) -> tuple[float, float]:
    """The bucket of the service's latency histogram that holds `seconds`."""
    bounds = sorted(
        float(line.split('le="')[1].split('"')[0])
        for line in scrape.splitlines()
        if line.startswith("cozystack_gpu_hook_request_duration_seconds_bucket{")
        and f'route="{route}"' in line and "+Inf" not in line
    )  # fmt: skip
    lower = max((b for b in bounds if b < seconds), default=0.0)
    return lower, min((b for b in bounds if b >= seconds), default=float("inf"))


def keep_alive_callers() -> int:
    with (
        stub_api() as (api, _),
        tls_settings() as (settings, verify),
        serve(api, threads=64, settings=settings) as server,
    ):
        unloaded = wrk_crowd(server.url, 10, 1)
        crowded = wrk_crowd(server.url, CROWD_SECONDS, CALLERS)
        scrape = requests.get(f"{server.metrics}/metrics", verify=verify, timeout=10).text
    served = histogram_p99(scrape, "/status/customize")
    lower, upper = bucket_of(scrape, "/status/customize", crowded["p99"])
    print(
        f"[keep-alive callers] {CALLERS} callers of /status/customize, back to back on "
        f"kept-alive connections for {CROWD_SECONDS} s (wrk); TLS, token, 64 threads"
    )
    print(f"  unloaded (one caller): p99 {1000 * unloaded['p99']:.1f} ms, "
          f"{unloaded['calls']:.0f} calls")  # fmt: skip
    print(f"  crowded: {crowded['calls']:.0f} calls, {crowded['non_2xx']:.0f} not 200, "
          f"{crowded['errors']:.0f} socket errors; callers' p99 {1000 * crowded['p99']:.1f} ms, "
          f"max {crowded['max']:.2f} s; the service's histogram: p99 in the bucket up to "
          f"{served:g} s")  # fmt: skip
    checks = [
        ("every call answered (no socket error, no timeout)", crowded["errors"] == 0,
         f"{crowded['errors']:.0f}"),
        (f"every call within its deadline ({SYNC_WITHIN:g} s)", crowded["max"] <= SYNC_WITHIN,
         f"{crowded['max']:.2f} s"),
        ("the histogram's p99 is the bucket the callers' p99 falls in",
         lower < served <= upper or served == upper,
         f"callers {crowded['p99']:.3f} s in ({lower:g}, {upper:g}], histogram {served:g}"),
    ]  # fmt: skip
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1
