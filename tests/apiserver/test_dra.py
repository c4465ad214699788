"""A DRA class's DeviceClass selector on the real API server, which compiles every selector's
CEL when the DeviceClass is written: hostile attribute values still make one valid expression."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from hooks.controllers import status
from hooks.rules.dra import device_class_selector
from hooks.rules.permitted_devices import KubeVirtFound
from hooks.settings import Settings
from hooks.wire.kube import KubeVirt
from hooks.wire.metacontroller import decode_composite_sync, encode
from tests.builders import (
    as_wire,
    claim,
    device,
    dra_class,
    dra_sync_request,
    node,
    resource_slice,
    taint_rule,
)
from tests.chart import render
from tests.controlplane import ControlPlane, object_path
from tests.e2e.cluster import wait_for

DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
DEVICE_CLASS = "a10.gpuclass.cozystack.io"


@pytest.mark.tools
@pytest.mark.parametrize(
    "value", ["NVIDIA A10", '" || true || "', "\\", '\\"', "a\nb", "\u2028", "'", "`", 7, -(2**63)]
)
def test_the_selector_compiles_whatever_the_attribute_value(
    kube: ControlPlane, value: str | int
) -> None:
    selector = device_class_selector("gpu.nvidia.com", {"productName": value, "x.io/kind": "a"})
    name = f"t{abs(hash(repr(value))) % 10**8}.gpuclass.cozystack.io"
    created = kube.request(
        "POST",
        DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": selector}}]},
        },
    )
    assert created.status_code == 201, created.text
    stored = created.json()["spec"]["selectors"][0]["cel"]["expression"]
    assert stored == selector
    kube.request("DELETE", f"{DEVICE_CLASSES}/{name}")


@pytest.mark.tools
def test_a_broken_selector_is_refused_so_the_compile_check_is_real(kube: ControlPlane) -> None:
    created = kube.request(
        "POST",
        DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "broken.gpuclass.cozystack.io"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "a" || "'}}]},
        },
    )
    assert created.status_code == 422, created.text


# --- slices and claims as a driver and the scheduler write them, read through the status hook ---

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def claims_path(namespace: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"


def allocated_claim(kube: ControlPlane, name: str, pool: str, device: str) -> None:
    """A claim of one device of the class's DeviceClass, and its allocation as kube-scheduler
    writes it to the status subresource."""
    kube.namespace("tenant-a")
    made = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "tenant-a"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}
        },
    }
    created = kube.request("POST", claims_path("tenant-a"), made)
    assert created.status_code == 201, created.text
    stored = created.json()
    [result] = claim((pool, device))["status"]["allocation"]["devices"]["results"]
    stored["status"] = {"allocation": {"devices": {"results": [result]}}}
    written = kube.request("PUT", f"{claims_path('tenant-a')}/{name}/status", stored)
    assert written.status_code == 200, written.text


def listed(kube: ControlPlane, path: str) -> list[dict[str, Any]]:
    """What a watch gives Metacontroller: each item with its kind, as the list leaves it out."""
    answer = kube.request("GET", path).json()
    kind = answer["kind"].removesuffix("List")
    return [{"apiVersion": answer["apiVersion"], "kind": kind, **item} for item in answer["items"]]


TAINT_RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


def synced_from_the_server(kube: ControlPlane, *, taint_rules: bool = False) -> dict[str, Any]:
    request = dra_sync_request(
        dra_class("a10"),
        nodes=[node("n1", gpus=None), node("n2", gpus=None)],
        slices=listed(kube, SLICES),
        claims=listed(kube, "/apis/resource.k8s.io/v1/resourceclaims"),
        device_classes=listed(kube, DEVICE_CLASSES),
        taint_rules=listed(kube, TAINT_RULES) if taint_rules else None,
    )
    view = KubeVirtFound(as_wire({"status": {"observedKubeVirtVersion": "v1.9.0"}}, KubeVirt), "k")
    outcome = status.sync(
        decode_composite_sync(json.dumps(request).encode()),
        Settings(dra_device_taint_rules=taint_rules),
        lambda: view,
        datetime(2026, 12, 1, tzinfo=UTC),
    )
    answer: dict[str, Any] = msgspec.json.decode(encode(outcome.response))
    return answer


def conditions(answer: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in answer["status"]["conditions"]}


@pytest.fixture
def clean_dra(kube: ControlPlane) -> Iterator[None]:
    yield
    for path in (SLICES, "/apis/resource.k8s.io/v1/resourceclaims", DEVICE_CLASSES, TAINT_RULES):
        for item in kube.request("GET", path).json()["items"]:
            meta = item["metadata"]
            where = claims_path(meta["namespace"]) if "namespace" in meta else path
            kube.request("DELETE", f"{where}/{meta['name']}")


@pytest.mark.tools
@pytest.mark.usefixtures("clean_dra")
def test_a_dra_class_counts_what_the_server_holds_through_every_condition(
    kube: ControlPlane,
) -> None:
    assert conditions(synced_from_the_server(kube))["DriverNotPublishing"] == (
        "True",
        "NoResourceSlices",
    )
    # n1's pool in two slices, of which the driver has written one so far
    n1_devices = [device(f"vfio-{i}", bus=f"0000:0{i}:00.0") for i in range(3)]
    first = resource_slice("n1", n1_devices[:2], node_name="n1", count=2, name="n1-a")
    second = resource_slice("n1", n1_devices[2:], node_name="n1", count=2, name="n1-b")
    n2 = resource_slice("n2", [device("vfio-0", bus="0000:01:00.0")], node_name="n2")
    for made in (first, n2):
        assert kube.request("POST", SLICES, made).status_code == 201
    answer = synced_from_the_server(kube)
    assert conditions(answer)["PoolsIncomplete"] == ("True", "SlicesMissing")
    assert (answer["status"]["free"], answer["status"]["maxFreePerNode"]) == (1, 1)
    assert kube.request("POST", SLICES, second).status_code == 201
    allocated_claim(kube, "vm-1", "n1", "vfio-1")
    answer = synced_from_the_server(kube)
    assert conditions(answer)["PoolsIncomplete"] == ("False", "Complete")
    assert conditions(answer)["Ready"] == ("True", "Ready")
    assert (answer["status"]["free"], answer["status"]["maxFreePerNode"]) == (3, 2)
    # the DeviceClass the class renders is accepted as it is; one it did not make is not its
    [child] = answer["children"]
    assert kube.request("POST", DEVICE_CLASSES, child).status_code == 201
    answer = synced_from_the_server(kube)
    assert conditions(answer)["DeviceClassConflict"] == ("True", "ForeignDeviceClass")
    assert answer["children"] == []


@pytest.mark.tools
@pytest.mark.usefixtures("clean_dra")
def test_a_device_taint_rule_on_the_server_leaves_out_the_devices_it_selects(
    kube: ControlPlane,
) -> None:
    """DeviceTaintRules as an administrator writes them to the beta API (the tests' API server
    serves it, with the DRADeviceTaintRules gate): read through the status hook where served."""
    n1 = resource_slice("n1", [device("vfio-0"), device("vfio-1")], node_name="n1")
    n2 = resource_slice("n2", [device("vfio-0")], node_name="n2")
    for made in (n1, n2):
        assert kube.request("POST", SLICES, made).status_code == 201
    rules = [
        taint_rule("n1-vfio-1", {"driver": "gpu.nvidia.com", "pool": "n1", "device": "vfio-1"}),
        taint_rule("inert", {}, effect="None"),
        taint_rule("no-selector", None, effect="NoExecute"),
    ]
    for rule in rules:
        created = kube.request("POST", TAINT_RULES, rule)
        assert created.status_code == 201, created.text
    answer = synced_from_the_server(kube, taint_rules=True)
    assert (answer["status"]["free"], answer["status"]["maxFreePerNode"]) == (2, 1)
    assert synced_from_the_server(kube)["status"]["free"] == 3


def device_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]},
    }


@pytest.mark.tools
@pytest.mark.usefixtures("clean_dra")
def test_metacontroller_writes_only_the_device_classes_of_gpu_classes(kube: ControlPlane) -> None:
    """RBAC grants Metacontroller DeviceClasses by kind; the chart's ValidatingAdmissionPolicy
    refuses its ServiceAccount every other name, and nobody else anything."""
    policy = [
        d
        for d in render("dra.api=true", "dra.metacontrollerServiceAccount=mc/metacontroller")
        if d["kind"].startswith("ValidatingAdmissionPolicy")
    ]
    assert len(policy) == 2
    kube.apply(*policy)
    metacontroller = {
        "Impersonate-User": "system:serviceaccount:mc:metacontroller",
        "Impersonate-Group": "system:masters",  # every right RBAC could grant it
    }

    def refused_to_metacontroller() -> bool:
        """Whether the API server applies the policy yet (it compiles it in the background)."""
        answer = kube.request("POST", DEVICE_CLASSES, device_class("x.io"), headers=metacontroller)
        if answer.status_code == 201:
            kube.request("DELETE", f"{DEVICE_CLASSES}/x.io")
        return answer.status_code == 403

    try:
        wait_for("the policy in force", refused_to_metacontroller)
        own = device_class(DEVICE_CLASS)
        made = kube.request("POST", DEVICE_CLASSES, own, headers=metacontroller)
        assert made.status_code == 201, made.text
        other = kube.request("POST", DEVICE_CLASSES, device_class("x.io"))
        assert other.status_code == 201, other.text  # an administrator, not Metacontroller
        for name, expected in (("x.io", 403), (DEVICE_CLASS, 200)):
            deleted = kube.request("DELETE", f"{DEVICE_CLASSES}/{name}", headers=metacontroller)
            assert deleted.status_code == expected, (name, deleted.text)
    finally:
        for document in policy:
            kube.request("DELETE", object_path(document))
