"""Budget reviews at hosting scale, against a real kube-apiserver (the tests' control plane).

    python -m bench.admission                        # make bench-admission: 200x50 and 1000x50
    python -m bench.admission --sizes 20x10 --reviews 50 --baseline-reviews 10   # a quick look
    python -m bench.admission --root-beside 1000    # tenant-root beside 1,000 unbudgeted tenants

For each size (tenants x apps per tenant, added to the same cluster), it stores Tenant,
VMInstance and KubernetesNodes HelmReleases shaped like Cozystack's, legacy ones among them (Tenant
releases without a name label, a second release claiming a tenant, app releases without a name
label, a Tenant release that names no tenant), then posts AdmissionReviews over HTTPS to two copies
of the webhook: the service as it is (scoped reads of the pool under review), one at a time and 20
at once, and the fresh-LIST approach it replaced (every release of the cluster, per review, with
the same identity rules). It reports the median and p99 latency of each, the bytes the API server
sent per review (from its own `apiserver_response_sizes` metric), and checks that the verdicts are
identical on every review, including reviews made right after an app was stored that fills its
pool.
"""

from __future__ import annotations

import argparse
import json
import random
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import trustme
import yaml
from werkzeug.serving import WSGIRequestHandler, make_server

from hooks.controllers.budget import BudgetInputs, review_app
from hooks.kubeapi.budget import HELMRELEASES, TENANCY_SELECTOR, BudgetReader
from hooks.kubeapi.client import ApiClient
from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import App, Tenancy, Tenant
from hooks.serving.app import create_app
from hooks.settings import Settings
from hooks.wire.admission import decode_review
from tests.builders import helmrelease
from tests.controlplane import ADMIN_TOKEN, ControlPlane, control_plane

ROOT = Path(__file__).parent.parent
L40S, H100 = "nvidia.com/NVIDIA_L40S-24Q", "nvidia.com/GH100_H100_PCIE"
# Each tenant's budget is a little above what its apps reserve, so that reviews are both admitted
# and denied: 45 VMs of one device and 5 pools of 1 x 2 replicas hold 55 of 60.
TENANT_BUDGET = {TOTAL_KEY: "60", class_key("l40s"): "40"}
NAME_LABEL = "apps.cozystack.io/application.name"
LAB_BUDGET = {TOTAL_KEY: "3"}


def release(kind: str, namespace: str, name: str, values: dict[str, Any]) -> dict[str, Any]:
    """A HelmRelease as Cozystack stores an app: about 1.5 KB, most of it what the webhook skips."""
    obj = helmrelease(kind, namespace, name, {**values, **APP_VALUES})
    metadata = obj["metadata"]
    metadata["labels"].update(
        {
            "apps.cozystack.io/application.group": "apps.cozystack.io",
            "cozystack.io/ui": "true",
            "helm.toolkit.fluxcd.io/name": metadata["name"],
            "helm.toolkit.fluxcd.io/namespace": namespace,
        }
    )
    metadata["annotations"] = {"meta.helm.sh/release-name": metadata["name"]}
    obj["spec"]["chart"]["spec"].update(
        reconcileStrategy="Revision",
        sourceRef={"kind": "HelmRepository", "name": "cozystack-apps", "namespace": "cozy-public"},
        version=">= 0.0.0-0",
    )
    obj["spec"].update(
        interval="5m",
        install={"remediation": {"retries": -1}},
        upgrade={"remediation": {"retries": -1}},
    )
    return obj


# What a VM's values hold besides the fields the webhook reads.
APP_VALUES = {
    "external": False,
    "externalMethod": "PortList",
    "externalPorts": [22],
    "instanceType": "u1.xlarge",
    "instanceProfile": "ubuntu",
    "systemDisk": {"image": "ubuntu", "storage": "20Gi", "storageClass": "replicated"},
    "resources": {"cpu": "4", "memory": "16Gi"},
    "sshKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheBenchmark user@host"],
    "cloudInit": "#cloud-config\npackages: [nvidia-driver-550]\n",
}


def gpus(*resources: str) -> list[dict[str, str]]:
    return [{"name": r} for r in resources]


def unlabelled(obj: dict[str, Any]) -> dict[str, Any]:
    """A release that a migration left without its name label."""
    del obj["metadata"]["labels"][NAME_LABEL]
    return obj


def tenant_objects(index: int, apps: int) -> tuple[list[str], list[dict[str, Any]]]:
    """One tenant: its namespace, its apps; every tenth has an unbounded `dev` sub-tenant holding
    some of the apps and a bounded `lab` sub-tenant carving 3 devices out of its pool. Legacy
    releases: every seventh tenant's own release has no name label, every twentieth has a second
    release claiming its `dev`, and the first two VMs of every fifth have no name label."""
    name = f"t{index:04d}"
    own = f"tenant-{name}"
    namespaces = [own]
    mine = release("Tenant", "tenant-root", name, {"resourceQuotas": TENANT_BUDGET})
    objects = [unlabelled(mine) if index % 7 == 3 else mine]
    homes = [own]
    if index % 10 == 0:
        namespaces += [f"{own}-dev", f"{own}-lab"]
        objects += [
            release("Tenant", own, "dev", {"host": f"dev.{name}.example.org"}),
            release("Tenant", own, "lab", {"resourceQuotas": LAB_BUDGET}),
        ]
        if index % 20 == 0:
            twin = release("Tenant", own, "dev", {"host": f"dev.{name}.example.org"})
            twin["metadata"]["name"] = "dev-old"
            objects.append(twin)
        homes.append(f"{own}-dev")
    for app in range(apps):
        home = homes[app % len(homes)]
        device = L40S if app % 3 else H100
        if app % 10 == 9:
            values = {"gpus": gpus(device), "maxReplicas": 2}
            objects.append(release("KubernetesNodes", home, f"pool{app}", values))
        else:
            vm = release("VMInstance", home, f"vm{app}", {"gpus": gpus(device)})
            objects.append(unlabelled(vm) if index % 5 == 1 and app < 2 else vm)
    return namespaces, objects


def gpuclass(name: str, resource: str) -> dict[str, Any]:
    return {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": name},
        "spec": {"resourceName": resource},
    }


def prepare(plane: ControlPlane) -> None:
    """Cozystack's app CRDs, the chart's GPUClass CRD, and two classes."""
    crds = yaml.safe_load((ROOT / "tests/manifests/cozystack-crds.yaml").read_text())
    plane.apply(*crds["documents"])
    plane.apply(
        yaml.safe_load((ROOT / "metacontroller/files/gpuclasses.cozystack.io.yaml").read_text())
    )
    plane.wait_established("helmreleases.helm.toolkit.fluxcd.io")
    plane.wait_established("gpuclasses.cozystack.io")
    plane.apply(gpuclass("l40s", L40S), gpuclass("h100", H100))


def admin_settings(plane: ControlPlane, workdir: Path) -> Settings:
    """The service's settings against the plane, as its admin (every release readable)."""
    token = workdir / "token"
    token.write_text(ADMIN_TOKEN)
    return Settings(
        kube_api=plane.url,
        kube_token_file=token,
        kube_ca_file=plane.ca_file,
        kube_timeout_seconds=30,
        admission_cache_seconds=60,
    )


def create(plane: ControlPlane, obj: dict[str, Any]) -> None:
    metadata = obj["metadata"]
    if obj["kind"] == "Namespace":
        path = "/api/v1/namespaces"
    else:
        path = f"/apis/helm.toolkit.fluxcd.io/v2/namespaces/{metadata['namespace']}/helmreleases"
    response = plane.request("POST", path, obj)
    if response.status_code not in (201, 409):
        raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")


def populate(plane: ControlPlane, first: int, last: int, apps: int) -> int:
    """Tenants first..last-1, in parallel; the number of releases stored."""
    namespaces: list[dict[str, Any]] = []
    releases: list[dict[str, Any]] = []
    for index in range(first, last):
        names, objects = tenant_objects(index, apps)
        namespaces += [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in names
        ]
        releases += objects
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda o: create(plane, o), namespaces))
        list(pool.map(lambda o: create(plane, o), releases))
    return len(releases)


class FreshList:
    """The approach the service replaced: every release of the cluster, in one LIST per review
    (read with the service's own identity rules, `release_object`)."""

    def __init__(self, settings: Settings) -> None:
        self._catalog = BudgetReader(settings)
        self._api = ApiClient(settings)
        self._platform_values = settings.platform_values_secret

    def catalog(self) -> Catalog:
        return self._catalog.catalog()

    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        objects = [
            release_object(raw, self._platform_values)
            for raw in self._api.list(HELMRELEASES, TENANCY_SELECTOR)
        ]
        return Tenancy(
            tuple(o for o in objects if isinstance(o, Tenant)),
            tuple(o for o in objects if isinstance(o, App)),
        )


class KeepAlive(WSGIRequestHandler):
    """HTTP/1.1, so that a client keeps its TLS connection as the API server's does; and quiet."""

    protocol_version = "HTTP/1.1"

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


@contextmanager
def https(
    budgets: BudgetInputs, settings: Settings, ca: trustme.CA, workdir: Path
) -> Iterator[str]:
    """The webhook app on loopback over HTTPS (a threaded server, the same for both approaches)."""
    cert = ca.issue_cert("127.0.0.1")
    chain, key = workdir / "chain.pem", workdir / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(chain))
    server = make_server(
        "127.0.0.1",
        0,
        create_app(settings, budgets=budgets),
        threaded=True,
        request_handler=KeepAlive,
        ssl_context=context,
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def review_body(uid: str, namespace: str, name: str, devices: Sequence[str]) -> bytes:
    obj = {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMInstance",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gpus": gpus(*devices), "running": True},
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": "VMInstance"},
            "namespace": namespace,
            "name": name,
            "operation": "CREATE",
            "object": obj,
        },
    }
    return json.dumps(review).encode()


@dataclass
class Review:
    body: bytes
    verdicts: dict[str, tuple[bool, str]] = field(default_factory=dict)


def post(
    session: requests.Session, url: str, body: bytes, ca_file: Path
) -> tuple[float, bool, str]:
    started = time.perf_counter()
    response = session.post(
        f"{url}/admit/gpu-budget",
        data=body,
        headers={"Content-Type": "application/json"},
        verify=str(ca_file),
        timeout=60,
    )
    seconds = time.perf_counter() - started
    response.raise_for_status()
    answer = response.json()["response"]
    return seconds, answer["allowed"], answer.get("status", {}).get("message", "")


def sent_bytes(plane: ControlPlane) -> float:
    """What the API server has sent in answer to LISTs of HelmReleases, by its own metric."""
    total = 0.0
    for line in plane.request("GET", "/metrics").text.splitlines():
        series = line.startswith("apiserver_response_sizes_sum{")
        if series and 'resource="helmreleases"' in line and 'verb="LIST"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


@dataclass
class Figures:
    label: str
    latencies: list[float]
    bytes_per_review: float

    def row(self, size: str) -> str:
        median = 1000 * statistics.median(self.latencies)
        p99 = 1000 * percentile(self.latencies, 0.99)
        kib = self.bytes_per_review / 1024
        count = len(self.latencies)
        return f"{size:<9} {self.label:<22} {count:>7} {median:>10.1f} {p99:>9.1f} {kib:>15,.1f}"


def run_reviews(
    plane: ControlPlane,
    url: str,
    reviews: list[Review],
    label: str,
    ca_file: Path,
    concurrency: int = 1,
) -> Figures:
    """The reviews, `concurrency` at a time (each client with its own connection, as the API
    server's), with the latency of each."""
    sessions = threading.local()
    before = sent_bytes(plane)

    def one(review: Review) -> float:
        if not hasattr(sessions, "session"):
            sessions.session = requests.Session()
        seconds, allowed, message = post(sessions.session, url, review.body, ca_file)
        review.verdicts[label] = (allowed, message)
        return seconds

    with ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(one, reviews))
    return Figures(label, latencies, (sent_bytes(plane) - before) / len(reviews))


def make_reviews(rng: random.Random, tenants: int, count: int, start: int) -> list[Review]:
    reviews = []
    for number in range(count):
        index = rng.randrange(tenants)
        namespace = f"tenant-t{index:04d}"
        if index % 10 == 0 and rng.random() < 0.5:
            namespace += rng.choice(["-dev", "-lab"])
        elif rng.random() < 0.05:
            namespace = "tenant-root"  # the root's own pool: every legacy release in view
        devices = [rng.choice([L40S, L40S, H100]) for _ in range(rng.randint(1, 7))]
        uid = f"review-{start + number}"
        reviews.append(Review(review_body(uid, namespace, f"new{start + number}", devices)))
    return reviews


def fresh_writes(
    plane: ControlPlane, urls: dict[str, str], size: tuple[int, int], count: int, ca_file: Path
) -> tuple[int, int]:
    """Store an app that fills a pool, then at once review one more device in it: both
    approaches must deny, having seen the app stored a moment before."""
    session = requests.Session()
    tenants, apps = size
    agreed = denied = 0
    for number in range(count):
        index = (number * 7 + 3) % tenants
        if index % 10 == 0:
            index += 1  # a tenant without sub-tenants: its pool is exactly what is generated
        namespace = f"tenant-t{index:04d}"
        # a VM of what is left fills the pool: each app holds one device, each pool two
        held = apps + sum(1 for app in range(apps) if app % 10 == 9)
        left = int(TENANT_BUDGET[TOTAL_KEY]) - held
        filler = release("VMInstance", namespace, f"filler{number}", {"gpus": gpus(*[H100] * left)})
        create(plane, filler)
        body = review_body(f"fresh-{number}", namespace, f"late{number}", [H100])
        verdicts = {label: post(session, url, body, ca_file)[1:] for label, url in urls.items()}
        agreed += len(set(verdicts.values())) == 1
        denied += all(not allowed for allowed, _ in verdicts.values())
        plane.request(
            "DELETE",
            f"/apis/helm.toolkit.fluxcd.io/v2/namespaces/{namespace}/helmreleases/"
            f"vm-instance-filler{number}",
        )
    return agreed, denied


HEADER = "size      approach               reviews  median ms    p99 ms  KiB sent/review"
CONCURRENT_P99_MS = 100


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200x50,1000x50", help="tenants x apps, growing")
    parser.add_argument("--reviews", type=int, default=300, help="reviews per size (scoped)")
    parser.add_argument(
        "--baseline-reviews", type=int, default=30, help="of those, also through the fresh LIST"
    )
    parser.add_argument("--fresh", type=int, default=10, help="reviews right after a store")
    parser.add_argument(
        "--root-beside",
        type=int,
        default=0,
        help="instead: reviews in tenant-root (no budget) beside this many tenants without one",
    )
    args = parser.parse_args(argv)
    if args.root_beside:
        return root_beside(args.root_beside)
    sizes = [tuple(int(n) for n in size.split("x")) for size in args.sizes.split(",")]
    rng = random.Random(20261201)
    rows: list[str] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, control_plane(Path(tmp)) as plane:
        workdir = Path(tmp)
        prepare(plane)
        create(
            plane, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-root"}}
        )
        create(plane, release("Tenant", "tenant-root", "root", {"host": "example.org"}))
        legacy = unlabelled(release("Tenant", "tenant-root", "gone", {"host": "example.org"}))
        legacy["metadata"]["name"] = "legacy-tenant"  # names no tenant: placed nowhere
        create(plane, legacy)
        settings = admin_settings(plane, workdir)
        ca = trustme.CA()
        ca_file = workdir / "hooks-ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        stored = tenants_done = 0
        with (
            https(BudgetReader(settings), settings, ca, workdir) as scoped,
            https(FreshList(settings), settings, ca, workdir) as baseline,
        ):
            urls = {"scoped (the service)": scoped, "fresh LIST (baseline)": baseline}
            for tenants, apps in sizes:
                started = time.monotonic()
                stored += populate(plane, tenants_done, tenants, apps)
                tenants_done = tenants
                size = f"{tenants}x{apps}"
                seconds = time.monotonic() - started
                print(f"[{size}] {stored} releases stored ({seconds:.0f} s)", flush=True)
                reviews = make_reviews(rng, tenants, args.reviews, len(rows) * args.reviews)
                run_reviews(plane, scoped, reviews[:20], "warm-up", ca_file)  # caches, connections
                figures = run_reviews(plane, scoped, reviews, "scoped (the service)", ca_file)
                concurrent = run_reviews(
                    plane, scoped, reviews, "scoped, 20 at once", ca_file, concurrency=20
                )
                sample = reviews[: args.baseline_reviews]
                base = run_reviews(plane, baseline, sample, "fresh LIST (baseline)", ca_file)
                # Nothing is stored while reviews run: one fresh LIST judges every review.
                judge = Snapshot(FreshList(settings))
                mismatched = [
                    r for r in reviews if r.verdicts["scoped (the service)"] != judge.verdict(r)
                ]
                mismatched += [
                    r
                    for r in sample
                    if r.verdicts["scoped (the service)"] != r.verdicts["fresh LIST (baseline)"]
                ]
                mismatched += [
                    r
                    for r in reviews
                    if r.verdicts["scoped (the service)"] != r.verdicts["scoped, 20 at once"]
                ]
                denied = sum(not r.verdicts["scoped (the service)"][0] for r in reviews)
                agreed, fresh_denied = fresh_writes(
                    plane, urls, (tenants, apps), args.fresh, ca_file
                )
                rows += [figures.row(size), concurrent.row(size), base.row(size)]
                print(*rows[-3:], sep="\n", flush=True)
                print(
                    f"[{size}] verdicts: {len(reviews) - len(mismatched)}/{len(reviews)} identical "
                    f"({denied} denied); right after a store: {agreed}/{args.fresh} identical, "
                    f"{fresh_denied} denied",
                    flush=True,
                )
                if mismatched or agreed != args.fresh or fresh_denied != args.fresh:
                    failures.append(f"{size}: verdicts differ from the baseline")
                if 1000 * percentile(concurrent.latencies, 0.99) > CONCURRENT_P99_MS:
                    failures.append(
                        f"{size}: p99 of concurrent reviews over {CONCURRENT_P99_MS} ms"
                    )
    print()
    print(HEADER)
    print("\n".join(rows))
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


class Snapshot:
    """Every release of the cluster as one fresh LIST saw it, judging reviews in process."""

    def __init__(self, reader: FreshList) -> None:
        self._reader = reader
        self._tenancy = reader.tenancy(())

    def catalog(self) -> Catalog:
        return self._reader.catalog()

    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        return self._tenancy

    def verdict(self, review: Review) -> tuple[bool, str]:
        verdict = review_app(decode_review(review.body), self).verdict
        return verdict.allowed, verdict.message


class CountedReader(BudgetReader):
    """The service's reader, counting the LISTs of releases each review makes."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.lists = 0
        read = self._releases.read

        def counted(request: Any) -> list[Tenant | App]:
            self.lists += 1
            return read(request)

        self._releases.read = counted  # type: ignore[method-assign]


def root_beside(count: int, apps: int = 5, reviews: int = 50) -> int:
    """A review where no pool applies beside `count` tenants without a budget (`apps` apps each),
    against one in a small pool: the LISTs each makes, and its time, in process against a real
    kube-apiserver (docs/gpu-budgets.md, "Reads by shape")."""
    with tempfile.TemporaryDirectory() as tmp, control_plane(Path(tmp)) as plane:
        prepare(plane)
        objects: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-root"}},
            release("Tenant", "tenant-root", "root", {}),
            release("Tenant", "tenant-root", "small", {"resourceQuotas": {TOTAL_KEY: "8"}}),
        ]
        for index in range(count):
            namespace = f"tenant-u{index}"
            objects.append(release("Tenant", "tenant-root", f"u{index}", {}))
            objects += [
                release("VMInstance", namespace, f"vm{n}", {"gpus": gpus(L40S)})
                for n in range(apps)
            ]
        objects += [
            release("VMInstance", "tenant-small", f"vm{n}", {"gpus": gpus(L40S)}) for n in range(3)
        ]
        namespaces = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            for name in ["tenant-small", *(f"tenant-u{index}" for index in range(count))]
        ]
        started = time.monotonic()
        for obj in objects[:3]:
            create(plane, obj)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda o: create(plane, o), namespaces))
            list(pool.map(lambda o: create(plane, o), objects[3:]))
        print(f"[root beside {count}] {len(objects) - 1} releases stored "
              f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
        settings = admin_settings(plane, Path(tmp))
        reader = CountedReader(settings)
        figures = {}
        for label, namespace in (("tenant-root (no pool)", "tenant-root"),
                                 ("tenant-small (a pool of 3 apps)", "tenant-small")):  # fmt: skip
            body = review_body("uid", namespace, "new", [L40S])
            review_app(decode_review(body), reader)  # warm: classes cached, connection open
            reader.lists, times = 0, []
            for _ in range(reviews):
                begun = time.perf_counter()
                verdict = review_app(decode_review(body), reader).verdict
                times.append(time.perf_counter() - begun)
            figures[label] = (reader.lists / reviews, statistics.median(times), verdict.allowed)
    print("| review | LISTs per review | median | allowed |")
    print("|---|---|---|---|")
    for label, (lists, median, allowed) in figures.items():
        print(f"| {label} | {lists:g} | {1000 * median:.1f} ms | {allowed} |")
    root, small = figures["tenant-root (no pool)"], figures["tenant-small (a pool of 3 apps)"]
    checks = [
        ("a review in tenant-root makes a handful of LISTs at most", root[0] <= 3, f"{root[0]:g}"),
        ("and costs within 3x a review in a small pool", root[1] <= 3 * small[1],
         f"{1000 * root[1]:.1f} vs {1000 * small[1]:.1f} ms"),
    ]  # fmt: skip
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
