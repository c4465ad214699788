"""A DRA class on the real cluster (docs/gpuclass.md, "DRA classes"): a driver's slice publisher
writes the GPU node's devices through the API (this cluster's containerd has no CDI, so no
kubelet plugin runs: docs/cluster.md), pods request claims of the class's DeviceClass, the real
kube-scheduler allocates them, and the class's `kubectl get` row and metrics follow allocation,
release, a cordon, a tainted device and an administrator's DeviceTaintRule (the cluster serves
the beta API: testenv/cluster.py turns its gate on)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from hooks.rules.dra import PCI_BUS_ID
from tests.builders import taint_rule
from tests.e2e.cluster import GPU_NODE, GPU_NODE_TAINT, Cluster, wait_for
from tests.e2e.test_gpus import Shown, gpu_class, row, shows, status_condition

CLASS = "a10-vfio"
DEVICE_CLASS = f"{CLASS}.gpuclass.cozystack.io"
DRIVER = "gpu.nvidia.com"
TENANT = "tenant-dra"
CARDS = 4  # physical GPUs on the node, each published as a `gpu` and a `vfio` device
SLICE = f"{GPU_NODE}-{DRIVER}"
YOUNGER = f"{CLASS}-younger"
RULE = "e2e-maintenance"


def published(generation: int, tainted: tuple[int, ...] = ()) -> dict[str, Any]:
    """The node's pool as NVIDIA's driver publishes it: per card a `gpu-N` and a `gpu-vfio-N`
    sharing its PCI address; the vfio devices of `tainted` carry a taint no class tolerates."""
    devices = []
    for card in range(CARDS):
        bus = {PCI_BUS_ID: {"string": f"0000:0{card + 1}:00.0"}}
        for name, kind in ((f"gpu-{card}", "gpu"), (f"gpu-vfio-{card}", "vfio")):
            device: dict[str, Any] = {
                "name": name,
                "attributes": {"type": {"string": kind}, "index": {"int": card}, **bus},
            }
            if kind == "vfio" and card in tainted:
                device["taints"] = [{"key": "e2e.local/xid", "value": "79", "effect": "NoSchedule"}]
            devices.append(device)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": SLICE},
        "spec": {
            "driver": DRIVER,
            "nodeName": GPU_NODE,
            "pool": {"name": GPU_NODE, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def dra_class(name: str = CLASS) -> dict[str, Any]:
    return gpu_class(name, dra={"driver": DRIVER, "attributes": {"type": "vfio"}})


def vm_pod(name: str) -> dict[str, Any]:
    """A VM's virt-launcher pod with one claim of the class's DeviceClass, from a template."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TENANT, "labels": {"kubevirt.io": "virt-launcher"}},
        "spec": {
            "tolerations": [{"key": GPU_NODE_TAINT, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "vfio"}],
            "containers": [
                {
                    "name": "compute",
                    "image": "e2e.local/pause:1",
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def allocated_devices(cluster: Cluster) -> list[str]:
    """The devices the scheduler allocated to the tenant's claims."""
    claims = cluster.get("resourceclaims", "-n", TENANT) or {"items": []}
    return [
        result["device"]
        for claim in claims["items"]
        for result in claim.get("status", {})
        .get("allocation", {})
        .get("devices", {})
        .get("results", [])
    ]


def allocated(cluster: Cluster) -> int:
    return len(allocated_devices(cluster))


def delete_pod(cluster: Cluster, name: str) -> None:
    """No kubelet plugin prepared the pod's claim, so nothing is left to stop: the pod is gone at
    once, and the claim controller frees its claim."""
    cluster.kubectl(
        "delete", "pod", "-n", TENANT, name, "--grace-period=0", "--force", "--wait=true"
    )  # fmt: skip


@pytest.fixture(scope="module")
def dra(cluster: Cluster, serving: None) -> Iterator[None]:
    """The install of tests.e2e.conftest.serving, a tenant namespace with the claim template, and
    afterwards the cluster as it was: no slice, no class, KubeVirt's gates as they were."""
    cluster.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}},
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "vfio", "namespace": TENANT},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]
                    }
                }
            },
        },
    )
    yield
    cluster.kubectl("delete", "namespace", TENANT, "--wait=true", "--timeout=180s")
    cluster.kubectl("delete", "gpuclass", CLASS, YOUNGER, "--ignore-not-found", "--wait=true")
    cluster.kubectl("delete", "resourceslice", SLICE, "--ignore-not-found")
    cluster.kubectl("delete", "devicetaintrule", RULE, "--ignore-not-found")
    cluster.kubectl("uncordon", GPU_NODE)
    cluster.kubectl(
        "patch", "kubevirt", "-n", "cozy-kubevirt", "kubevirt", "--type=json", "-p",
        '[{"op": "remove", "path": "/spec/configuration/developerConfiguration"}]',
        check=False,
    )  # fmt: skip


def test_a_dra_class_follows_the_devices_the_scheduler_allocates(
    cluster: Cluster, dra: None
) -> None:
    """Scenario: the class and its DeviceClass; the driver publishing; KubeVirt's gate; claims
    allocated by the real kube-scheduler and released; a cordon; a tainted device; a
    DeviceTaintRule."""
    cluster.apply(dra_class())
    shows(cluster, CLASS, Shown(0, 0, "False", "DRANotEnabled"))
    assert status_condition(cluster, CLASS, "DRANotEnabled") == ("True", "GPUsWithDRAOff")
    assert status_condition(cluster, CLASS, "DriverNotPublishing") == ("True", "NoResourceSlices")
    device_class = wait_for(
        "the class's DeviceClass", lambda: cluster.get("deviceclass", DEVICE_CLASS)
    )
    [owner] = device_class["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("GPUClass", CLASS)
    assert (row(cluster, CLASS) or {}).get("DEVICECLASS") == DEVICE_CLASS

    cluster.kubectl(
        "patch", "kubevirt", "-n", "cozy-kubevirt", "kubevirt", "--type=merge", "-p",
        '{"spec":{"configuration":{"developerConfiguration":{"featureGates":["GPUsWithDRA"]}}}}',
    )  # fmt: skip
    shows(cluster, CLASS, Shown(0, 0, "False", "DriverNotPublishing"))
    cluster.apply(published(1))
    at_rest = Shown(CARDS, CARDS, "True", "Ready")
    shows(cluster, CLASS, at_rest)

    # A younger class of the same devices counts nothing and makes no DeviceClass.
    cluster.apply(dra_class(YOUNGER))
    conflict = Shown(0, 0, "False", "DeviceClassConflict")
    shows(cluster, YOUNGER, conflict, exports_inventory=False)
    assert status_condition(cluster, YOUNGER, "DeviceClassConflict") == (
        "True",
        "OlderClassHasDevices",
    )
    assert cluster.get("deviceclass", f"{YOUNGER}.gpuclass.cozystack.io") is None
    cluster.kubectl("delete", "gpuclass", YOUNGER, "--wait=true")

    # Each claim takes one card: its gpu-N sibling is the same GPU, and counts as taken too.
    cluster.apply(vm_pod("vm-1"), vm_pod("vm-2"))
    wait_for("two claims allocated by the scheduler", lambda: allocated(cluster) == 2)
    shows(cluster, CLASS, Shown(CARDS - 2, CARDS - 2, "True", "Ready"))
    delete_pod(cluster, "vm-1")
    wait_for("vm-1's claim released", lambda: allocated(cluster) == 1)
    shows(cluster, CLASS, Shown(CARDS - 1, CARDS - 1, "True", "Ready"))

    cluster.kubectl("cordon", GPU_NODE)
    shows(cluster, CLASS, Shown(0, 0, "True", "Ready"))
    cluster.kubectl("uncordon", GPU_NODE)
    shows(cluster, CLASS, Shown(CARDS - 1, CARDS - 1, "True", "Ready"))

    # A driver marks one free card's vfio device broken: it leaves `free`; unmarked, it is back.
    [held] = allocated_devices(cluster)
    broken = (int(held.removeprefix("gpu-vfio-")) + 1) % CARDS
    tainted = time.time()
    cluster.apply(published(2, tainted=(broken,)))
    shows(cluster, CLASS, Shown(CARDS - 2, CARDS - 2, "True", "Ready"), synced_after=tainted)
    cluster.apply(published(3))
    shows(cluster, CLASS, Shown(CARDS - 1, CARDS - 1, "True", "Ready"))
    # An administrator's DeviceTaintRule on the same device does what the driver's taint did.
    ruled = time.time()
    cluster.apply(
        taint_rule(RULE, {"driver": DRIVER, "pool": GPU_NODE, "device": f"gpu-vfio-{broken}"})
    )
    shows(cluster, CLASS, Shown(CARDS - 2, CARDS - 2, "True", "Ready"), synced_after=ruled)
    cluster.kubectl("delete", "devicetaintrule", RULE, "--wait=true")
    shows(cluster, CLASS, Shown(CARDS - 1, CARDS - 1, "True", "Ready"))
    delete_pod(cluster, "vm-2")
    shows(cluster, CLASS, at_rest)

    cluster.kubectl("delete", "gpuclass", CLASS, "--wait=true")
    wait_for(
        "the DeviceClass collected with its class",
        lambda: cluster.kubectl("get", "deviceclass", DEVICE_CLASS, check=False).returncode != 0,
    )
