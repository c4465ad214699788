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
budget pool its report (synced), then until Metacontroller idles (drained: the first sync's label
writes and what they re-sync done), and reports its resident memory then (VmRSS), its peak
(VmHWM) and its Go heap in use. BENCH_HEAP_PROFILE=<file> also saves the heap profile (`go tool
pprof -top <file>`). `--only-go-envs` leaves out the run of Metacontroller's defaults.

    python -m bench.metacontroller --sizes M --go-env GOMEMLIMIT=2GiB --go-env GOGC=50
    python -m bench.metacontroller --sizes M --go-env client-go-qps=50,client-go-burst=100
    python -m bench.metacontroller --sizes S --churn-seconds 180 --rate 1

`--go-env` adds a run of Metacontroller with that environment beside the default one (a lowercase
name is one of Metacontroller's flags instead, such as its API client's rate), on the same
stored cluster (the reports and statuses the previous run wrote are removed first), so that the
Go runtime's settings are compared in one run. `--churn-seconds` follows each settled run with a
quiet minute and then the churn a hoster's cluster sees, `--rate` changes a second, in turn: a
VMInstance created in a bounded pool, the devices of the last one changed (a values update), a
status written on a release as Flux does, a VM's pod bound to a GPU node or deleted, and a
kubelet's status report on a node (the nodes in turn; at M each reports every five minutes,
1.7 a second). For the
quiet minute and the churn it reports the CPU of the hooks, Metacontroller and kube-apiserver per
second, the bytes each hook received per second, and how long each change took to show: in its
pool's `gpu-budget` report, or in the classes' `free`. The service runs with the settings the
chart gives it (its selectors decide what Metacontroller sends) and reads KubeVirt from the API
server. `--restart` then starts Metacontroller again over what it wrote (a pod restarted, an
upgrade) with the churn running from its first second: how long changes take to show while it
works through its start, and when it idles again (BENCH_CPU_PROFILE=<file>: its first minute's
CPU profile).

    python -m bench.metacontroller --sizes M --churn-seconds 120 --restart
    python -m bench.metacontroller --sizes S --churn-seconds 120 --at 0ada804

`--at` runs first the service and chart of that commit (its tree unpacked with `git archive`, its
controllers in place of this tree's), then this tree's, each with every `--go-env`, on the same
stored cluster: a design measured beside the one it replaced, in one run (0ada804: the budget
report as one target over the whole tenancy, before the per-pool report). The column "hooks"
names the commit.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from bench import report
from bench.cluster import GPU_RESOURCES, SIZES, Cluster, generate
from bench.common import free_by_node
from bench.run import cpu_seconds
from hooks.controllers.budget_report import REPORT_LABEL
from hooks.controllers.tenant_namespaces import TENANT_NAMESPACE_LABEL
from hooks.rules.license import COPY_LABEL
from tests.chart import PLAIN, render
from tests.controlplane import ADMIN_TOKEN, ControlPlane, binary, control_plane, manifests
from tests.fake_apiserver import kubevirt_cr
from tests.live import LiveServer, free_port, live_server

ROOT = Path(__file__).parent.parent
# Secrets per size and their data size: a tenant namespace holds a handful (service tokens kept as
# Secrets, Helm release Secrets, app credentials). The figure scales with the count times the size.
SECRETS = {"S": 500, "M": 5_000, "L": 20_000}
SECRET_BYTES = 4096
TENANT_NAMESPACES = 100
# The tenancy per size: top-level tenants (each with nine sub-tenants) and apps per tenant.
RELEASES = {"S": (10, 10), "M": (100, 10), "L": (100, 50)}
HEADER = (
    "size  hooks          go env                     nodes   pods  secrets  releases  stored MB"
    "  rss MiB  peak MiB  heap MiB  synced s  drained s"
)
CHURN_HEADER = (
    "size  hooks          go env                     phase   changes  hooks cpu/s  mc cpu/s"
    "  api cpu/s  status KB/s  license KB/s  report KB/s  report shown s p50/p90/max"
    "  status shown s p50/p90/max  mc peak MiB"
)
QUIET_SECONDS = 60
# Metacontroller below IDLE_CORES over DRAINED_SECONDS counts as drained: the first sync's
# writes done, its resyncs' bursts aside.
DRAINED_SECONDS = 10
IDLE_CORES = 0.25
DRAIN_LIMIT_SECONDS = 1200
SHOW_SECONDS = 120  # a change not shown by then is counted as not shown
# The churn's changes, taken in turn (--kinds).
KINDS = ("create", "values", "flux-status", "pod", "node-status")
HOOK_ROUTES = {
    # the status's cost is its controllers': the classes' syncs and the labels they select by
    "status": ("/status/sync", "/resource-labels/sync"),
    "license": ("/license/sync",),
    # the report's cost is its controllers': the pools' reports, the labels they select by and the
    # class index (before the pools, one report of the whole tenancy: `--at`)
    "report": ("/budget-pools/sync", "/tenant-namespaces/sync", "/budget-report/sync"),
}


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


def create_node(plane: ControlPlane, node: dict[str, Any]) -> int:
    """A node as its kubelet and kube-controller-manager leave it: the API server taints a new
    node not-ready until the node lifecycle controller, which does not run here, lifts it."""
    stored_bytes = create_with_status(plane, "/api/v1/nodes", node)
    path = f"/api/v1/nodes/{node['metadata']['name']}"
    taints = {"spec": {"taints": node["spec"].get("taints", [])}}
    merge = {"Content-Type": "application/merge-patch+json"}
    plane.request("PATCH", path, taints, headers=merge).raise_for_status()
    return stored_bytes


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
        total += sum(pool.map(lambda n: create_node(plane, n), nodes))
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


@dataclass(frozen=True)
class Hooks:
    """The service and chart a run measures: this tree's, or another commit's (`--at`), so that
    a design is measured beside the one it replaced on the same cluster."""

    label: str  # the commit
    root: Path

    @functools.cached_property
    def chart(self) -> list[dict[str, Any]]:
        """Rendered once: every run of the design reads its service's settings and controllers."""
        return render(
            *PLAIN, "gpuOperator.variant=vgpu", api_versions=(), chart=self.root / "metacontroller"
        )


def this_tree() -> Hooks:
    described = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return Hooks(described.stdout.strip() or "this tree", ROOT)


def hooks_at(ref: str, into: Path) -> Hooks:
    """The tree of a commit, unpacked into `into`."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    return Hooks(commit, into)


def service_env(plane: ControlPlane, workdir: Path, hooks: Hooks) -> dict[str, str]:
    """The settings the chart gives the service (its selectors among them, which decide what
    Metacontroller sends), and the API server to read KubeVirt from, as the admin."""
    [deployment] = [d for d in hooks.chart if d["kind"] == "Deployment"]
    [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"]]
    token = workdir / "hooks-token"
    token.write_text(ADMIN_TOKEN)
    return {
        **{e["name"]: e["value"] for e in container["env"] if "value" in e},
        "GPUCLASS_KUBE_API": plane.url,
        "GPUCLASS_KUBE_TOKEN_FILE": str(token),
        "GPUCLASS_KUBE_CA_FILE": str(plane.ca_file),
    }


def controllers(hooks_url: str, hooks: Hooks) -> list[dict[str, Any]]:
    """The chart's controllers, their hooks pointed at the service on loopback, and the
    ClusterRole the budget report decorates."""
    documents = hooks.chart
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


@dataclass(frozen=True)
class Settled:
    rss: float
    peak: float
    heap: float
    took: float  # until every class has its status and every pool its report
    drained: float  # until Metacontroller idled (nan: not within DRAIN_LIMIT_SECONDS)


def replace_controllers(plane: ControlPlane, documents: Sequence[dict[str, Any]]) -> None:
    """The controllers of the run's chart in place of the previous run's (a design drops some)."""
    for kind in ("compositecontrollers", "decoratorcontrollers"):
        collection = f"/apis/metacontroller.k8s.io/v1alpha1/{kind}"
        for item in plane.request("GET", collection).json()["items"]:
            plane.request("DELETE", f"{collection}/{item['metadata']['name']}").raise_for_status()
    plane.apply(*documents)


def reset(plane: ControlPlane, classes: Sequence[str]) -> None:
    """What a Metacontroller run writes, removed, so that the next run syncs from nothing: the
    statuses, the reports, the license copies and the tenant namespaces' labels."""
    for name in classes:
        plane.request(
            "PATCH",
            f"/apis/cozystack.io/v1alpha1/gpuclasses/{name}/status",
            {"status": None},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    for kind, label in (("configmaps", REPORT_LABEL), ("secrets", COPY_LABEL)):
        listed = plane.request("GET", f"/api/v1/{kind}", params={"labelSelector": f"{label}=true"})
        for item in listed.json().get("items", []):
            meta = item["metadata"]
            plane.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/{kind}/{meta['name']}")
    selector = {"labelSelector": TENANT_NAMESPACE_LABEL}
    for item in plane.request("GET", "/api/v1/namespaces", params=selector).json()["items"]:
        ours = [k for k in item["metadata"]["labels"] if k.startswith("gpuclass.cozystack.io/")]
        plane.request(
            "PATCH",
            f"/api/v1/namespaces/{item['metadata']['name']}",
            {"metadata": {"labels": dict.fromkeys(ours)}},
            headers={"Content-Type": "application/merge-patch+json"},
        )


def run_metacontroller(
    plane: ControlPlane, workdir: Path, go_env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], int, int]:
    metrics_port, pprof_port = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
    env.update({name: value for name, value in go_env.items() if not name.islower()})
    flags = [f"--{name}={value}" for name, value in go_env.items() if name.islower()]
    log = (workdir / "metacontroller.log").open("ab")
    process = subprocess.Popen(
        [
            binary("metacontroller"),  # the tools cache, on PATH (make tools)
            f"--metrics-address=127.0.0.1:{metrics_port}",
            f"--health-probe-bind-address=127.0.0.1:{free_port()}",
            "--discovery-interval=5s",
            f"--pprof-address=127.0.0.1:{pprof_port}",
            *flags,
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return process, metrics_port, pprof_port


def settle(
    plane: ControlPlane,
    workdir: Path,
    process: subprocess.Popen[bytes],
    ports: tuple[int, int],
    classes: Sequence[str],
    pools: int,
) -> Settled:
    started = time.monotonic()
    while not synced(plane, classes, pools):
        if process.poll() is not None or time.monotonic() - started > 900:
            raise RuntimeError((workdir / "metacontroller.log").read_text()[-3000:])
        time.sleep(1)
    took = time.monotonic() - started
    # Every report existing is not the end of the first sync: namespaces below a pool are still
    # being labelled, each label re-syncing the pool, at Metacontroller's client rate.
    drained = idle_after(process, started)
    rss, peak = memory(process.pid)
    heap = go_heap_mib(ports[0])
    if os.environ.get("BENCH_HEAP_PROFILE"):
        heap_url = f"http://127.0.0.1:{ports[1]}/debug/pprof/heap"
        profile = requests.get(heap_url, timeout=30).content
        Path(os.environ["BENCH_HEAP_PROFILE"]).write_bytes(profile)
    return Settled(rss, peak, heap, took, drained)


def measure(
    size: str,
    workdir: Path,
    designs: Sequence[Hooks],
    go_envs: Sequence[dict[str, str]],
    churn_seconds: float,
    rate: float,
    kinds: Sequence[str] = KINDS,
    restart: bool = False,
) -> tuple[list[str], list[str]]:
    settled_rows: list[str] = []
    churn_rows: list[str] = []
    with control_plane(workdir) as plane:
        plane.apply(*manifests("metacontroller-crds.yaml"), *manifests("cozystack-crds.yaml"))
        plane.apply(
            yaml.safe_load((ROOT / "metacontroller/files/gpuclasses.cozystack.io.yaml").read_text())
        )
        plane.apply(*manifests("kubevirt-crd.yaml"))
        plane.wait_established("gpuclasses.cozystack.io")
        plane.wait_established("helmreleases.helm.toolkit.fluxcd.io")
        plane.wait_established("kubevirts.kubevirt.io")
        plane.namespace("cozy-kubevirt")
        plane.apply(kubevirt_cr(*GPU_RESOURCES))
        nodes, pods, secrets, releases, stored_bytes = populate(plane, size)
        top_level, _ = RELEASES[size]
        pools = top_level * (1 + report.SUB_TENANTS // 2)
        classes = list(generate(size).classes)
        apiserver = apiserver_pid(workdir)
        for run_hooks, go_env in [(h, g) for h in designs for g in go_envs]:
            go_label = ",".join(f"{k}={v}" for k, v in go_env.items()) or "(none)"
            label = f"{run_hooks.label:<15}{go_label}"
            env = service_env(plane, workdir, run_hooks)
            if "GPUCLASS_BUDGET_CLASSES_NAMESPACE" in env:
                plane.namespace(env["GPUCLASS_BUDGET_CLASSES_NAMESPACE"])  # the release's
            with live_server(env, workdir, cwd=run_hooks.root) as hooks:
                replace_controllers(plane, controllers(hooks.url, run_hooks))
                reset(plane, classes)
                process, metrics_port, pprof_port = run_metacontroller(plane, workdir, go_env)
                try:
                    ports = (metrics_port, pprof_port)
                    found = settle(plane, workdir, process, ports, classes, pools)
                    settled_rows.append(
                        f"{size:<6}{label:<40}{nodes:>7}{pods:>7}{secrets:>9}{releases:>10}"
                        f"{stored_bytes / 1e6:>11.0f}{found.rss:>9.0f}{found.peak:>10.0f}"
                        f"{found.heap:>10.0f}{found.took:>10.0f}{found.drained:>11.0f}"
                    )
                    print(settled_rows[-1], flush=True)
                    if churn_seconds:
                        meters = Meters(hooks.metrics, hooks.process.pid, process.pid, apiserver)
                        quiet = meters.over(functools.partial(time.sleep, QUIET_SECONDS))
                        churn = Churn(plane, size, rate, str(len(settled_rows)), kinds)
                        churned = meters.over(functools.partial(churn.run, churn_seconds))
                        for phase, figures, shown in (
                            ("quiet", quiet, None),
                            ("churn", churned, churn),
                        ):
                            churn_rows.append(
                                churn_row(size, label, phase, figures, shown, process.pid)
                            )
                            print(churn_rows[-1], flush=True)
                    if restart:
                        process.terminate()
                        process.wait(timeout=30)
                        process, row = restarted(
                            plane,
                            workdir,
                            go_env,
                            hooks,
                            apiserver,
                            (size, label, rate, kinds),
                            churn_seconds or QUIET_SECONDS,
                            str(len(settled_rows)) + "r",
                        )
                        churn_rows.append(row)
                        print(row, flush=True)
                finally:
                    process.terminate()
                    process.wait(timeout=30)
    return settled_rows, churn_rows


def restarted(
    plane: ControlPlane,
    workdir: Path,
    go_env: dict[str, str],
    hooks: LiveServer,
    apiserver: int,
    run: tuple[str, str, float, Sequence[str]],
    seconds: float,
    tag: str,
) -> tuple[subprocess.Popen[bytes], str]:
    """Metacontroller started again over what its previous run wrote (a pod restarted, an
    upgrade), under churn from its first second: how long changes take to show while its start
    is worked through, and when it idles again. BENCH_CPU_PROFILE=<file> saves a CPU profile of
    its first minute (`go tool pprof -top <file>`)."""
    size, label, rate, kinds = run
    process, _, pprof_port = run_metacontroller(plane, workdir, go_env)
    started = time.monotonic()
    background = ThreadPoolExecutor(2)
    drained = background.submit(idle_after, process, started)
    if os.environ.get("BENCH_CPU_PROFILE"):
        background.submit(cpu_profile, pprof_port, Path(os.environ["BENCH_CPU_PROFILE"]))
    meters = Meters(hooks.metrics, hooks.process.pid, process.pid, apiserver)
    churn = Churn(plane, size, rate, tag, kinds)
    figures = meters.over(functools.partial(churn.run, seconds))
    row = churn_row(size, label, "restart", figures, churn, process.pid)
    background.shutdown(wait=True)
    return process, f"{row}  drained {drained.result():.0f} s"


def idle_after(process: subprocess.Popen[bytes], started: float) -> float:
    """Seconds from started until Metacontroller idles (nan: not within the limit)."""
    while time.monotonic() - started < DRAIN_LIMIT_SECONDS:
        before = cpu_seconds(process.pid)
        time.sleep(DRAINED_SECONDS)
        if (cpu_seconds(process.pid) - before) / DRAINED_SECONDS < IDLE_CORES:
            return time.monotonic() - started
    return float("nan")


def cpu_profile(pprof_port: int, into: Path) -> None:
    url = f"http://127.0.0.1:{pprof_port}/debug/pprof/profile"
    for _ in range(50):  # its pprof server listens a moment after the start
        with suppress(requests.ConnectionError):
            into.write_bytes(requests.get(url, params={"seconds": 60}, timeout=90).content)
            return
        time.sleep(0.1)


def apiserver_pid(workdir: Path) -> int:
    """The control plane's kube-apiserver: the one whose certificates are in workdir."""
    marker = f"--cert-dir={workdir / 'certs'}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                if marker in (entry / "cmdline").read_bytes().split(b"\0"):
                    return int(entry.name)
    raise RuntimeError("no kube-apiserver of this control plane")


@dataclass(frozen=True)
class Figures:
    seconds: float
    hooks_cpu: float
    metacontroller_cpu: float
    apiserver_cpu: float
    route_bytes: dict[str, float]


@dataclass(frozen=True)
class Meters:
    hooks_metrics: str
    hooks_pid: int
    metacontroller_pid: int
    apiserver_pid: int

    def body_bytes(self) -> dict[str, float]:
        text = requests.get(self.hooks_metrics + "/metrics", timeout=10).text
        sums = dict.fromkeys(HOOK_ROUTES, 0.0)
        for line in text.splitlines():
            if line.startswith("cozystack_gpu_hook_request_body_bytes_sum{"):
                for name, routes in HOOK_ROUTES.items():
                    if any(f'route="{route}"' in line for route in routes):
                        sums[name] += float(line.rsplit(" ", 1)[1])
        return sums

    def cpu(self) -> tuple[float, float, float]:
        return (
            cpu_seconds(self.hooks_pid),
            cpu_seconds(self.metacontroller_pid),
            cpu_seconds(self.apiserver_pid),
        )

    def over(self, phase: Callable[[], Any]) -> Figures:
        cpu_before, bytes_before = self.cpu(), self.body_bytes()
        started = time.monotonic()
        phase()
        took = time.monotonic() - started
        cpu_after, bytes_after = self.cpu(), self.body_bytes()
        used = [
            (after - before) / took for before, after in zip(cpu_before, cpu_after, strict=True)
        ]
        route_bytes = {k: (bytes_after[k] - bytes_before[k]) / took for k in HOOK_ROUTES}
        return Figures(took, used[0], used[1], used[2], route_bytes)


class Churn:
    """A hoster's steady churn, one change every 1/rate seconds, in turn: a VMInstance created
    in a bounded pool, the devices of the last one changed, a Flux-like status write on a
    release, a VM's pod bound to a GPU node or deleted, a kubelet's status report. The first two
    and the pod are timed until they show (the pool's report, the classes' free)."""

    def __init__(
        self, plane: ControlPlane, size: str, rate: float, tag: str, kinds: Sequence[str] = KINDS
    ) -> None:
        self.plane, self.rate, self.tag, self.kinds = plane, rate, tag, tuple(kinds)
        self.top_level, _ = RELEASES[size]
        cluster = generate(size)
        self.room = room_for_one(cluster)
        self.nodes = sorted(cluster.nodes)
        self.classes = list(cluster.classes)
        self.releases = sorted(report.tenancy(RELEASES[size][1], self.top_level))
        self.made: dict[str, int] = dict.fromkeys(self.kinds, 0)
        self.report_shown: list[float | None] = []
        self.status_shown: list[float | None] = []
        self._last_vm: tuple[str, str] | None = None
        self._bound: list[str] = []

    def run(self, seconds: float) -> None:
        watchers = ThreadPoolExecutor(16)
        started = time.monotonic()
        count = 0
        while time.monotonic() - started < seconds:
            kind = self.kinds[count % len(self.kinds)]
            watch = getattr(self, "_" + kind.replace("-", "_"))(count)
            self.made[kind] += 1
            if watch is not None:
                watchers.submit(self._time_until, *watch)
            count += 1
            time.sleep(max(0.0, started + count / self.rate - time.monotonic()))
        watchers.shutdown(wait=True)
        while self._bound:  # the cluster as it was, for the next run
            self._pod(0)

    def _time_until(
        self, into: list[float | None], changed: Callable[[], bool], since: float
    ) -> None:
        while time.monotonic() - since < SHOW_SECONDS:
            if changed():
                into.append(time.monotonic() - since)
                return
            time.sleep(0.25)
        into.append(None)

    def _report_of(self, namespace: str) -> Callable[[], Any]:
        path = f"/api/v1/namespaces/{namespace}/configmaps/gpu-budget"
        return lambda: self.plane.request("GET", path).json().get("data")

    def _create(self, count: int) -> tuple[list[float | None], Callable[[], bool], float]:
        namespace = f"tenant-t{count // 4 % self.top_level:03d}-s1"  # a bounded sub-tenant
        name = f"churn-{self.tag}-{count}"
        body = report.release(
            "VMInstance", namespace, name, {"gpus": [{"name": GPU_RESOURCES[0]}]}, 10**6 + count
        )
        before = self._report_of(namespace)()
        since = time.monotonic()
        collection = f"/apis/helm.toolkit.fluxcd.io/v2/namespaces/{namespace}/helmreleases"
        self.plane.request("POST", collection, stored(body)).raise_for_status()
        self._last_vm = (namespace, body["metadata"]["name"])
        return self.report_shown, lambda: self._report_of(namespace)() != before, since

    def _values(self, count: int) -> tuple[list[float | None], Callable[[], bool], float] | None:
        if self._last_vm is None:
            return None
        namespace, name = self._last_vm
        before = self._report_of(namespace)()
        since = time.monotonic()
        path = f"/apis/helm.toolkit.fluxcd.io/v2/namespaces/{namespace}/helmreleases/{name}"
        gpus = [{"name": GPU_RESOURCES[0]}] * 2
        patch = {"spec": {"values": {"gpus": gpus}}}
        self.plane.request(
            "PATCH", path, patch, headers={"Content-Type": "application/merge-patch+json"}
        ).raise_for_status()
        return self.report_shown, lambda: self._report_of(namespace)() != before, since

    def _flux_status(self, count: int) -> None:
        key = self.releases[count * 7919 % len(self.releases)]
        namespace, name = key.split("/", 1)
        path = f"/apis/helm.toolkit.fluxcd.io/v2/namespaces/{namespace}/helmreleases/{name}"
        patch = {"status": {"lastHandledReconcileAt": f"churn-{count}", "observedGeneration": 3}}
        self.plane.request(
            "PATCH", path, patch, headers={"Content-Type": "application/merge-patch+json"}
        ).raise_for_status()

    def _node_status(self, count: int) -> None:
        """A kubelet's status report: every node sends one at least every five minutes (its
        conditions' heartbeat), whether anything changed or not; the nodes in turn."""
        name = self.nodes[count // len(self.kinds) % len(self.nodes)]
        beat = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patch = {"status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": beat}]}}
        self.plane.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            patch,
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        ).raise_for_status()

    def _free(self) -> list[int]:
        got = self.plane.request("GET", "/apis/cozystack.io/v1alpha1/gpuclasses").json()
        return [item.get("status", {}).get("free", -1) for item in got["items"]]

    def _pod(self, count: int) -> tuple[list[float | None], Callable[[], bool], float]:
        """A VM's pod bound to a node with room, taking one unit; the next time, deleted."""
        before = self._free()
        since = time.monotonic()
        collection = "/api/v1/namespaces/tenant-00/pods"
        if self._bound:
            name = self._bound.pop()
            self.plane.request("DELETE", f"{collection}/{name}", {"gracePeriodSeconds": 0})
        else:
            node, resource = self.room
            name = f"churn-{self.tag}-{count}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"kubevirt.io": "virt-launcher"}},
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {
                            "name": "compute",
                            "image": "virt-launcher",
                            "resources": {"limits": {resource: "1"}},
                        }
                    ],
                },
                "status": {"phase": "Running"},
            }
            create_with_status(self.plane, collection, pod)
            self._bound.append(name)
        return self.status_shown, lambda: self._free() != before, since


def room_for_one(cluster: Cluster) -> tuple[str, str]:
    """A node with a unit of a class's resource free, and the resource: a pod bound there
    requesting one changes the class's `free` (on a full node it would change nothing)."""
    nodes = [json.loads(body) for body in cluster.nodes.values()]
    pods = [json.loads(body) for body in cluster.pods.values()]
    for body in cluster.classes.values():
        spec = json.loads(body)["spec"]
        free = free_by_node(nodes, pods, spec["resourceName"], spec.get("tolerations", []))
        for node, units in sorted(free.items()):
            if units >= 1:
                return node, spec["resourceName"]
    raise RuntimeError("no node has a unit free")


def percentiles(shown: list[float | None]) -> str:
    seen = sorted(s for s in shown if s is not None)
    missed = len(shown) - len(seen)
    if not seen:
        return f"- ({missed} not shown)" if missed else "-"
    tenth = seen[min(len(seen) - 1, int(len(seen) * 0.9))]
    text = f"{statistics.median(seen):.1f}/{tenth:.1f}/{seen[-1]:.1f}"
    return text + (f" ({missed} not shown)" if missed else "")


def churn_row(
    size: str, label: str, phase: str, figures: Figures, churn: Churn | None, pid: int
) -> str:
    changes = sum(churn.made.values()) if churn else 0
    kib = {k: v / 1024 for k, v in figures.route_bytes.items()}
    shown_report = percentiles(churn.report_shown) if churn else "-"
    shown_status = percentiles(churn.status_shown) if churn else "-"
    _, peak = memory(pid)
    return (
        f"{size:<6}{label:<40}{phase:<8}{changes:>8}{figures.hooks_cpu:>13.3f}"
        f"{figures.metacontroller_cpu:>10.3f}{figures.apiserver_cpu:>11.3f}{kib['status']:>13.0f}"
        f"{kib['license']:>14.0f}{kib['report']:>13.0f}  {shown_report:>27}  {shown_status:>27}"
        f"{peak:>13.0f}"
    )


def go_env(text: str) -> dict[str, str]:
    """NAME=VALUE[,NAME=VALUE]: environment variables, or flags where the name is lowercase."""
    pairs = [item.split("=", 1) for item in text.split(",")]
    if any(len(pair) != 2 for pair in pairs):
        raise SystemExit(f"--go-env {text}: want NAME=VALUE[,NAME=VALUE]")
    return {name: value for name, value in pairs}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="S,M")
    parser.add_argument(
        "--go-env", action="append", default=[], help="NAME=VALUE[,NAME=VALUE]: one more run"
    )
    parser.add_argument(
        "--only-go-envs", action="store_true", help="no run of Metacontroller's defaults"
    )
    parser.add_argument("--churn-seconds", type=float, default=0.0)
    parser.add_argument(
        "--restart",
        action="store_true",
        help="then start Metacontroller again over what it wrote, under churn from the start",
    )
    parser.add_argument("--rate", type=float, default=1.0, help="changes a second under churn")
    parser.add_argument(
        "--at",
        action="append",
        default=[],
        metavar="COMMIT",
        help="first run the service and chart of this commit, then this tree's, on one cluster",
    )
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help="the changes the churn takes in turn"
    )
    args = parser.parse_args(argv)
    go_envs = [*([] if args.only_go_envs else [{}]), *(go_env(text) for text in args.go_env)]
    kinds = args.kinds.split(",")
    if not set(kinds) <= set(KINDS):
        raise SystemExit(f"--kinds: each of {', '.join(KINDS)}")
    settled_rows: list[str] = []
    churn_rows: list[str] = []
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as trees:
        designs = [
            *(hooks_at(ref, Path(trees) / str(index)) for index, ref in enumerate(args.at)),
            this_tree(),
        ]
        for size in args.sizes.split(","):
            if size not in SIZES:
                raise SystemExit(f"unknown size {size}: one of {', '.join(SIZES)}")
            with tempfile.TemporaryDirectory() as tmp:
                rows = measure(
                    size,
                    Path(tmp),
                    designs,
                    go_envs,
                    args.churn_seconds,
                    args.rate,
                    kinds,
                    args.restart,
                )
            settled_rows += rows[0]
            churn_rows += rows[1]
    print("\n".join([HEADER, *settled_rows]))
    if churn_rows:
        print("\n".join([CHURN_HEADER, *churn_rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
