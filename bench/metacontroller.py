"""Metacontroller's memory with the chart's three controllers, on generated clusters.

    python -m bench.metacontroller --sizes S,M       # make bench-metacontroller (SIZES=S,M,L)

Metacontroller's informers cache every object of every kind a controller relates to, cluster
wide: the status controller's Nodes and Pods, the license controller's Namespaces and Secrets,
the budget report's HelmReleases and ConfigMaps, and the GPUClasses. For each size of
bench/cluster.py it starts the tests' control plane (a real kube-apiserver on loopback), stores
the size's Nodes and Pods (spec and status, as the benchmark generates them), Secrets in tenant
namespaces (a share of a cluster's Secrets: see SECRETS), the tenancy of bench/report.py (see
RELEASES: Tenant, VMInstance and KubernetesNodes releases as Flux stores them), the chart's
controllers pointed at `gpuclass-hooks serve` on loopback, then runs Metacontroller v4.17.2
(built by `make tools` into the tools cache) until every class has its status and every GPU
budget pool its report, and reports its resident memory then (VmRSS), its peak (VmHWM) and its
Go heap in use. BENCH_HEAP_PROFILE=<file> also saves the heap profile (`go tool pprof -top <file>`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
import yaml

from bench import report
from bench.cluster import SIZES, generate
from tests.chart import PLAIN, render
from tests.controlplane import ControlPlane, binary, control_plane, manifests
from tests.live import free_port, live_server

ROOT = Path(__file__).parent.parent
# Secrets per size and their data size: a tenant namespace holds a handful (service tokens kept as
# Secrets, Helm release Secrets, app credentials). The figure scales with the count times the size.
SECRETS = {"S": 500, "M": 5_000, "L": 20_000}
SECRET_BYTES = 4096
TENANT_NAMESPACES = 100
# The tenancy per size: top-level tenants (each with nine sub-tenants) and apps per tenant.
RELEASES = {"S": (10, 10), "M": (100, 10), "L": (100, 50)}
HEADER = "size  nodes   pods  secrets  releases  stored MB  rss MiB  peak MiB  heap MiB  synced s"


def stored(obj: dict[str, Any]) -> dict[str, Any]:
    """What a client creates: the generated object without what the server assigns."""
    metadata = {
        k: v
        for k, v in obj["metadata"].items()
        if k not in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation")
    }
    metadata.pop("ownerReferences", None)  # no owner exists here, and nothing collects
    return {**obj, "metadata": metadata}


def create_with_status(plane: ControlPlane, collection: str, obj: dict[str, Any]) -> int:
    """POST the object, then its status (a create drops it); the bytes stored."""
    body = stored(obj)
    status = body.pop("status", None)
    created = plane.request("POST", collection, body)
    if created.status_code != 201:
        raise RuntimeError(f"{collection}: {created.status_code} {created.text[:300]}")
    if status:
        # the server computes qosClass from the spec, and refuses another value
        status = {k: v for k, v in status.items() if k != "qosClass"}
        path = f"{collection}/{body['metadata']['name']}/status"
        patched = plane.request(
            "PATCH",
            path,
            {"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if patched.status_code != 200:
            raise RuntimeError(f"{path}: {patched.status_code} {patched.text[:300]}")
    return len(json.dumps(obj))


def populate(plane: ControlPlane, size: str) -> tuple[int, int, int, int, int]:
    cluster = generate(size)
    for body in cluster.namespaces.values():
        plane.apply(stored(json.loads(body)))  # tenants, half of them entitled to copies
    namespaces = {json.loads(p)["metadata"]["namespace"] for p in cluster.pods.values()}
    namespaces |= {f"tenant-t{index}" for index in range(TENANT_NAMESPACES)}
    namespaces.add("cozy-gpu-operator")
    for name in sorted(
        namespaces - {json.loads(n)["metadata"]["name"] for n in cluster.namespaces.values()}
    ):
        plane.namespace(name)
    for body in cluster.secrets.values():
        plane.apply(stored(json.loads(body)))  # the license source
    total = 0
    with ThreadPoolExecutor(8) as pool:
        nodes = [json.loads(n) for n in cluster.nodes.values()]
        total += sum(pool.map(lambda n: create_with_status(plane, "/api/v1/nodes", n), nodes))
        pods = [json.loads(p) for p in cluster.pods.values()]

        def create_pod(pod: dict[str, Any]) -> int:
            collection = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods"
            return create_with_status(plane, collection, pod)

        total += sum(pool.map(create_pod, pods))

        def create_secret(index: int) -> int:
            namespace = f"tenant-t{index % TENANT_NAMESPACES}"
            secret = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"app-{index}", "namespace": namespace},
                "stringData": {"data": "x" * SECRET_BYTES},
            }
            return create_with_status(plane, f"/api/v1/namespaces/{namespace}/secrets", secret)

        total += sum(pool.map(create_secret, range(SECRETS[size])))
        top_level, apps = RELEASES[size]
        releases = list(report.tenancy(apps, top_level).values())
        for namespace in sorted({r["metadata"]["namespace"] for r in releases}):
            plane.namespace(namespace)

        def create_release(release: dict[str, Any]) -> int:
            # The tests' HelmRelease CRD has no status subresource: the status goes in the create.
            namespace = release["metadata"]["namespace"]
            collection = f"/apis/helm.toolkit.fluxcd.io/v2/namespaces/{namespace}/helmreleases"
            created = plane.request("POST", collection, stored(release))
            if created.status_code != 201:
                raise RuntimeError(f"{collection}: {created.status_code} {created.text[:300]}")
            return len(json.dumps(release))

        total += sum(pool.map(create_release, releases))
    for body in cluster.classes.values():
        plane.apply(stored(json.loads(body)))
    return len(nodes), len(pods), SECRETS[size], len(releases), total


def controllers(hooks_url: str) -> list[dict[str, Any]]:
    """The chart's controllers, their hooks pointed at the service on loopback, and the
    ClusterRole the budget report decorates."""
    documents = render(*PLAIN, "gpuOperator.variant=vgpu", api_versions=())
    found = [d for d in documents if d["kind"] in ("CompositeController", "DecoratorController")]
    targets = [d for d in documents if d["kind"] == "ClusterRole"]
    for controller in found:
        for hook in controller["spec"]["hooks"].values():
            url = hook["webhook"]["url"]
            path = "/" + url.split("://", 1)[1].split("/", 1)[1]
            hook["webhook"]["url"] = hooks_url + path
    return [*targets, *found]


def memory(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def go_heap_mib(port: int) -> float:
    """The Go heap in use, from Metacontroller's own metrics."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("go_memstats_heap_inuse_bytes "):
            return float(line.split()[1]) / 2**20
    return float("nan")


def synced(plane: ControlPlane, classes: Sequence[str], pools: int) -> bool:
    """Every class has a status written by the status controller, and every GPU budget pool
    its report."""
    for name in classes:
        got = plane.request("GET", f"/apis/cozystack.io/v1alpha1/gpuclasses/{name}").json()
        if not got.get("status", {}).get("observedGeneration"):
            return False
    selector = {"labelSelector": "gpuclass.cozystack.io/budget-report=true"}
    reports = plane.request("GET", "/api/v1/configmaps", params=selector).json()
    return len(reports.get("items", [])) == pools


def measure(size: str, workdir: Path) -> str:
    metacontroller = binary("metacontroller")  # the tools cache, on PATH (make tools)
    with control_plane(workdir) as plane:
        plane.apply(*manifests("metacontroller-crds.yaml"), *manifests("cozystack-crds.yaml"))
        plane.apply(
            yaml.safe_load((ROOT / "metacontroller/files/gpuclasses.cozystack.io.yaml").read_text())
        )
        plane.wait_established("gpuclasses.cozystack.io")
        plane.wait_established("helmreleases.helm.toolkit.fluxcd.io")
        nodes, pods, secrets, releases, stored_bytes = populate(plane, size)
        top_level, _ = RELEASES[size]
        pools = top_level * (1 + report.SUB_TENANTS // 2)
        with live_server({}, workdir) as hooks:
            plane.apply(*controllers(hooks.url))
            env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
            log = (workdir / "metacontroller.log").open("wb")
            started = time.monotonic()
            metrics_port, pprof_port = free_port(), free_port()
            process = subprocess.Popen(
                [
                    metacontroller,
                    f"--metrics-address=127.0.0.1:{metrics_port}",
                    f"--health-probe-bind-address=127.0.0.1:{free_port()}",
                    "--discovery-interval=5s",
                    f"--pprof-address=127.0.0.1:{pprof_port}",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                classes = list(generate(size).classes)
                while not synced(plane, classes, pools):
                    if process.poll() is not None or time.monotonic() - started > 600:
                        raise RuntimeError((workdir / "metacontroller.log").read_text()[-3000:])
                    time.sleep(1)
                took = time.monotonic() - started
                time.sleep(10)  # a few resyncs, so that the caches and the sync buffers are warm
                rss, peak = memory(process.pid)
                heap = go_heap_mib(metrics_port)
                if os.environ.get("BENCH_HEAP_PROFILE"):
                    heap_url = f"http://127.0.0.1:{pprof_port}/debug/pprof/heap"
                    profile = requests.get(heap_url, timeout=30).content
                    Path(os.environ["BENCH_HEAP_PROFILE"]).write_bytes(profile)
            finally:
                process.terminate()
                process.wait(timeout=30)
    return (
        f"{size:<4}{nodes:>7}{pods:>7}{secrets:>9}{releases:>10}{stored_bytes / 1e6:>11.0f}"
        f"{rss:>9.0f}{peak:>10.0f}{heap:>10.0f}{took:>10.0f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="S,M")
    args = parser.parse_args(argv)
    print(HEADER, flush=True)
    for size in args.sizes.split(","):
        if size not in SIZES:
            raise SystemExit(f"unknown size {size}: one of {', '.join(SIZES)}")
        with tempfile.TemporaryDirectory() as tmp:
            print(measure(size, Path(tmp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
