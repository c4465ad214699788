"""Benchmark: the budget report's syncs at scale, on a generated tenancy: each report target's.

    python -m bench.report                      # 1,000 tenants x 50 apps
    python -m bench.report --apps 5         # 1,000 tenants x 5 apps

The tenancy: 100 top-level tenants under tenant-root, each bounded on the total and two class
keys, with nine sub-tenants each (every other one bounded too); `apps` apps in every tenant
namespace (VMs with 0 to 2 devices, worker pools of 1 to 3 replicas, VMs without devices). Each
release is shaped as Cozystack's API writes an app and Flux stores it (labels, chartRef,
valuesFrom, values, status with its conditions and history), so each request is the size
Metacontroller would send. Each tenant
namespace's request holds what its rules select once the namespaces are labelled (a top-level
tenant's reports every pool of its subtree). It prints the requests' sizes, the syncs in process
(decode, rules, encode; every target's, and the largest target's alone; medians of three), and
every target's HTTP round trip in turn against
`gpuclass-hooks serve` on loopback with the serving worker's peak memory (the worker and the
process it computes a call in). Figures go in docs/scale.md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from bench.run import post, serve
from hooks.cli import offline
from hooks.controllers import budget_report
from hooks.settings import Settings
from hooks.wire.metacontroller import decode_report_sync, encode
from tests import cozystack
from tests.builders import helmrelease

MB = 1024 * 1024
TOP_LEVEL = 100
SUB_TENANTS = 9
CLASSES = {
    "l40s-24q": "nvidia.com/NVIDIA_L40S-24Q",
    "h100": "nvidia.com/GH100_H100_PCIE",
    "a10-12q": "nvidia.com/NVIDIA_A10-12Q",
    "a100": "nvidia.com/GA100_A100_PCIE_80GB",
}


def release(kind: str, namespace: str, name: str, values: dict[str, Any], n: int) -> dict[str, Any]:
    """The tests' HelmRelease (as Cozystack's API writes it, `tests.cozystack`), with what the API
    server and Flux add to a stored one."""
    body = helmrelease(kind, namespace, name, values)
    prefix = cozystack.release_prefix(kind).rstrip("-")
    metadata = body["metadata"]
    metadata.update(
        uid=f"{n:08x}-7b3c-4d2e-9f10-1a2b3c4d5e6f",
        resourceVersion=str(100000 + n),
        generation=3,
        creationTimestamp="2026-06-01T10:00:00Z",
        finalizers=["finalizers.fluxcd.io"],
        annotations={"reconcile.fluxcd.io/requestedAt": "2026-11-30T08:00:00Z"},
    )
    return {
        **body,
        "status": {
            "conditions": [
                {
                    "type": t,
                    "status": "True",
                    "reason": "UpgradeSucceeded",
                    "message": "Helm upgrade succeeded for release with chart",
                    "lastTransitionTime": "2026-11-30T08:00:05Z",
                    "observedGeneration": 3,
                }
                for t in ("Ready", "Released")
            ],
            "history": [
                {
                    "chartName": prefix,
                    "chartVersion": "0.14.2",
                    "configDigest": "sha256:" + "ab" * 32,
                    "digest": "sha256:" + "cd" * 32,
                    "firstDeployed": "2026-06-01T10:00:10Z",
                    "lastDeployed": "2026-11-30T08:00:05Z",
                    "name": f"{prefix}-{name}",
                    "namespace": namespace,
                    "status": "deployed",
                    "version": 3,
                }
            ],
            "lastAttemptedRevision": "0.14.2",
            "observedGeneration": 3,
        },
    }


def tenancy(
    apps_per_tenant: int, top_level: int = TOP_LEVEL, seed: int = 7
) -> dict[str, dict[str, Any]]:
    """The releases of the generated tenancy (`top_level` tenants with their sub-tenants), keyed
    as Metacontroller keys a related group."""
    rng = random.Random(seed)
    resources = list(CLASSES.values())
    releases: dict[str, dict[str, Any]] = {}
    counter = iter(range(10**9))

    def add(kind: str, namespace: str, name: str, values: dict[str, Any]) -> None:
        body = release(kind, namespace, name, values, next(counter))
        releases[f"{namespace}/{body['metadata']['name']}"] = body

    def quotas(total: int) -> dict[str, str]:
        return {
            "gpuclass.cozystack.io/devices": str(total),
            "l40s-24q.gpuclass.cozystack.io/devices": str(total // 2),
            "h100.gpuclass.cozystack.io/devices": str(total // 4),
            "requests.cpu": "64",
            "requests.memory": "256Gi",
        }

    add("Tenant", "tenant-root", "root", {"host": "example.org"})
    namespaces = []
    for top in range(top_level):
        name = f"t{top:03d}"
        add("Tenant", "tenant-root", name, {"resourceQuotas": quotas(400), "etcd": True})
        namespaces.append(f"tenant-{name}")
        for sub in range(SUB_TENANTS):
            child = f"s{sub}"
            values = {"resourceQuotas": quotas(20)} if sub % 2 else {"monitoring": False}
            add("Tenant", f"tenant-{name}", child, values)
            namespaces.append(f"tenant-{name}-{child}")
    for namespace in namespaces:
        for index in range(apps_per_tenant):
            roll = rng.random()
            gpus = [{"name": rng.choice(resources)} for _ in range(rng.randint(0, 2))]
            common = {
                "resources": {"cpu": "4", "memory": "16Gi"},
                "systemDisk": {"image": "ubuntu", "storage": "50Gi", "storageClass": "replicated"},
                "sshKeys": [
                    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK0wmN/Cr3JXqmLW7u+g9pTh+wyqDHpSQ"
                ],
            }
            if roll < 0.2:
                add(
                    "KubernetesNodes",
                    namespace,
                    f"pool{index}",
                    {**common, "gpus": gpus[:1], "maxReplicas": rng.randint(1, 3)},
                )
            elif roll < 0.8:
                add(
                    "VMInstance", namespace, f"vm{index}", {**common, "running": True, "gpus": gpus}
                )
            else:
                add("VMInstance", namespace, f"vm{index}", {**common, "running": False})
    return releases


def pool_bodies(apps_per_tenant: int) -> dict[str, bytes]:
    """Each tenant namespace's report request, as Metacontroller sends it once the namespaces are
    labelled (`hooks.cli.offline.pool_requests`, the selection plan simulates)."""
    releases = tenancy(apps_per_tenant)
    namespaces = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        # every tenant namespace holds apps: the release namespaces are all of them
        for name in sorted({r["metadata"]["namespace"] for r in releases.values()})
    ]
    classes = [
        {
            "apiVersion": "cozystack.io/v1alpha1",
            "kind": "GPUClass",
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"resourceName": resource},
        }
        for name, resource in CLASSES.items()
    ]
    inventory = offline.Inventory(
        {
            ("helm.toolkit.fluxcd.io/v2", "helmreleases"): list(releases.values()),
            ("cozystack.io/v1alpha1", "gpuclasses"): classes,
            ("v1", "namespaces"): namespaces,
        }
    )
    controller = {"kind": "DecoratorController", "metadata": {"name": "gpuclass-budget-pools"}}
    return {
        name: json.dumps(
            {"controller": controller, **body, "finalizing": False}, separators=(",", ":")
        ).encode()
        for name, body in offline.pool_requests(inventory, Settings()).items()
    }


def in_process(body: bytes) -> bytes:
    settings = Settings()
    outcome = budget_report.sync(
        decode_report_sync(body), settings.platform_values_secret, settings.budget_classes_namespace
    )
    return encode(outcome.response)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", type=int, default=50, help="apps per tenant namespace")
    args = parser.parse_args(argv)
    tenants = TOP_LEVEL * (1 + SUB_TENANTS)
    started = time.perf_counter()
    bodies = pool_bodies(args.apps)
    largest = max(bodies, key=lambda name: len(bodies[name]))
    print(
        f"{tenants} tenants x {args.apps} apps: {tenants * (1 + args.apps)} releases, "
        f"{len(bodies)} report requests of {sum(map(len, bodies.values())) / MB:.1f} MB in all, "
        f"the largest {len(bodies[largest]) / MB:.2f} MB ({largest}; generated in "
        f"{time.perf_counter() - started:.1f} s)"
    )
    times = []
    answers: dict[str, bytes] = {}
    for _ in range(3):
        started = time.perf_counter()
        answers = {name: in_process(body) for name, body in bodies.items()}
        times.append(time.perf_counter() - started)
    largest_times = []
    for _ in range(3):
        started = time.perf_counter()
        in_process(bodies[largest])
        largest_times.append(time.perf_counter() - started)
    reports = sum(len(json.loads(a)["attachments"]) for a in answers.values())
    print(
        f"in process: every target {statistics.median(times):.2f} s, the largest target "
        f"{statistics.median(largest_times) * 1000:.0f} ms (medians of 3); {reports} ConfigMaps"
    )
    with serve(
        "http://127.0.0.1:9", threads=8, settings={"GPUCLASS_MEMORY_BUDGET_BYTES": "0"}
    ) as server:
        idle = server.memory_mb()
        with server.peak_memory() as peak:
            started = time.perf_counter()
            for name, body in bodies.items():
                served = post(f"{server.url}/budget-pools/sync", body)
                assert served == answers[name], f"{name}: served differs from in process"
            took = time.perf_counter() - started
    print(
        f"served (gunicorn), every target in turn: {took:.2f} s of round trips, peak "
        f"{peak.mb:.0f} MB (idle {idle:.0f} MB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
