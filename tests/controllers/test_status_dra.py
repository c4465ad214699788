"""The status of a DRA class (docs/gpuclass.md, "DRA classes"): what its customize relates, its
free units from slices and claims, its DeviceClass child, and each of its conditions."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from hooks.controllers import status
from hooks.rules.dra import device_class_selector
from hooks.rules.permitted_devices import (
    KubeVirtAbsent,
    KubeVirtFound,
    KubeVirtUnreadable,
    KubeVirtView,
)
from hooks.settings import Settings
from hooks.wire.kube import KubeVirt
from hooks.wire.metacontroller import CustomizeRequest, decode_envelope, encode
from tests.builders import (
    DRIVER,
    as_wire,
    claim,
    conditions_in_order,
    device,
    dra_class,
    dra_sync_request,
    node,
    resource_slice,
    taint_rule,
)
from tests.controllers.test_status import conditions, run

DEVICE_CLASS = "a10.gpuclass.cozystack.io"


def kubevirt(
    version: str = "v1.9.0", gates: list[str] | None = None, disabled: list[str] | None = None
) -> KubeVirtFound:
    developer: dict[str, Any] = {}
    if gates is not None:
        developer["featureGates"] = gates
    if disabled is not None:
        developer["disabledFeatureGates"] = disabled
    cr = {
        "spec": {"configuration": {"developerConfiguration": developer}},
        "status": {"observedKubeVirtVersion": version},
    }
    return KubeVirtFound(as_wire(cr, KubeVirt), "cozy-kubevirt/kubevirt")


ON = kubevirt()


def gpu_nodes() -> list[dict[str, Any]]:
    return [node("n1", gpus=None), node("n2", gpus=None), node("n3", gpus=None)]


def cluster(**kwargs: Any) -> dict[str, Any]:
    """Three vfio GPUs on n1 (one taken), one on n2, and n1's gpu-type devices (not the class's)."""
    slices = [
        resource_slice(
            "n1",
            [device(f"vfio-{i}", bus=f"0000:0{i}:00.0") for i in range(3)]
            + [device("gpu-9", kind="gpu", bus="0000:09:00.0")],
            node_name="n1",
        ),
        resource_slice("n2", [device("vfio-0", bus="0000:01:00.0")], node_name="n2"),
    ]
    defaults: dict[str, Any] = {
        "nodes": gpu_nodes(),
        "slices": slices,
        "claims": [claim(("n1", "vfio-1"))],
    }
    return dra_sync_request(dra_class("a10"), **(defaults | kwargs))


def dra_run(request: dict[str, Any], view: KubeVirtView = ON, **settings: Any) -> dict[str, Any]:
    return run(request, view, Settings(**settings))


def owned(uid: str = "uid-a10") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {
            "name": DEVICE_CLASS,
            "ownerReferences": [
                {
                    "apiVersion": "cozystack.io/v1alpha1",
                    "kind": "GPUClass",
                    "name": "a10",
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
    }


def test_a_dra_class_reports_the_free_devices_of_its_kind_and_the_best_node() -> None:
    response = dra_run(cluster())
    assert (response["status"]["free"], response["status"]["maxFreePerNode"]) == (3, 2)
    assert response["status"]["deviceClass"] == DEVICE_CLASS
    assert [c["type"] for c in response["status"]["conditions"]] == conditions_in_order(dra=True)
    assert conditions(response)["Ready"] == ("True", "Ready")


def test_a_dra_class_renders_its_device_class_with_its_one_selector() -> None:
    [child] = dra_run(cluster())["children"]
    assert child == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS, "labels": {"gpuclass.cozystack.io/class": "a10"}},
        "spec": {
            "selectors": [{"cel": {"expression": device_class_selector(DRIVER, {"type": "vfio"})}}]
        },
    }


def test_its_own_device_class_is_kept_and_a_foreign_one_is_never_written_over() -> None:
    mine = dra_run(cluster(device_classes=[owned()]))
    assert len(mine["children"]) == 1
    assert conditions(mine)["DeviceClassConflict"] == ("False", "NoConflict")
    for foreign in (owned("uid-someone-else"), {**owned(), "metadata": {"name": DEVICE_CLASS}}):
        response = dra_run(cluster(device_classes=[foreign]))
        assert response["children"] == []
        assert conditions(response)["DeviceClassConflict"] == ("True", "ForeignDeviceClass")
        assert conditions(response)["Ready"] == ("False", "DeviceClassConflict")


def test_device_class_conflict_the_older_class_of_the_same_devices_wins() -> None:
    older = dra_class("a10-old", created="2025-01-01T00:00:00Z")
    other_kind = dra_class("gpus", attributes={"type": "gpu"}, created="2025-01-01T00:00:00Z")
    younger = dra_run(cluster(classes=[dra_class("a10"), older, other_kind]))
    assert conditions(younger)["DeviceClassConflict"] == ("True", "OlderClassHasDevices")
    assert (younger["status"]["free"], younger["children"]) == (0, [])
    alone = dra_run(cluster(classes=[dra_class("a10"), other_kind]))
    assert conditions(alone)["DeviceClassConflict"] == ("False", "NoConflict")


def test_driver_not_publishing_when_no_slice_of_the_driver_exists() -> None:
    other_driver = resource_slice("n1", [device("vfio-0")], node_name="n1", driver="x.example")
    response = dra_run(cluster(slices=[other_driver], claims=[]))
    assert conditions(response)["DriverNotPublishing"] == ("True", "NoResourceSlices")
    assert conditions(response)["Ready"] == ("False", "DriverNotPublishing")
    assert response["status"]["free"] == 0


def test_pools_incomplete_count_nothing_and_say_how_many() -> None:
    half = resource_slice("n1", [device("vfio-0")], node_name="n1", count=2)
    whole = resource_slice("n2", [device("vfio-0")], node_name="n2")
    response = dra_run(cluster(slices=[half, whole], claims=[]))
    assert conditions(response)["PoolsIncomplete"] == ("True", "SlicesMissing")
    [incomplete] = [c for c in response["status"]["conditions"] if c["type"] == "PoolsIncomplete"]
    assert incomplete["message"].startswith("1 pools") and f"{DRIVER}/n1" in incomplete["message"]
    assert response["status"]["free"] == 1


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (kubevirt("v1.9.0"), ("False", "Enabled")),
        (kubevirt("v1.10.2-rc.1"), ("False", "Enabled")),
        (kubevirt("v1.8.1"), ("True", "GPUsWithDRAOff")),
        (kubevirt("v1.8.1", gates=["GPUsWithDRA"]), ("False", "Enabled")),
        (kubevirt("v1.9.0", disabled=["GPUsWithDRA"]), ("True", "GPUsWithDRAOff")),
        (kubevirt(""), ("True", "GPUsWithDRAOff")),
        (KubeVirtAbsent("cozy-kubevirt/kubevirt"), ("True", "KubeVirtNotFound")),
        (KubeVirtUnreadable("timed out"), ("Unknown", "KubeVirtUnreadable")),
    ],
)
def test_dra_not_enabled_follows_kubevirts_gpus_with_dra_gate(
    view: KubeVirtView, expected: tuple[str, str]
) -> None:
    response = dra_run(cluster(), view)
    assert conditions(response)["DRANotEnabled"] == expected
    ready = {"True": ("False", "DRANotEnabled"), "False": ("True", "Ready")}
    assert conditions(response)["Ready"] == ready.get(expected[0], ("Unknown", expected[1]))


def test_dra_not_enabled_where_the_api_server_does_not_serve_dra() -> None:
    request = dra_sync_request(dra_class("a10"))
    for group in ("Node.v1", *(k for k in request["related"] if "resource.k8s.io" in k)):
        del request["related"][group]
    response = dra_run(request, dra_api=False)
    assert conditions(response)["DRANotEnabled"] == ("True", "APINotServed")
    assert (response["status"]["free"], response["children"]) == (0, [])


def customize(settings: Settings, parent: dict[str, Any]) -> list[dict[str, Any]]:
    request = decode_envelope(json.dumps({"parent": parent}).encode(), CustomizeRequest)
    return msgspec.json.decode(encode(status.customize(request, settings)))["relatedResources"]


def test_customize_relates_slices_claims_and_its_device_class_only_for_a_dra_class() -> None:
    rules = customize(Settings(node_selector="gpu=true"), dra_class("a10"))
    assert rules == [
        {
            "apiVersion": "v1",
            "resource": "nodes",
            "labelSelector": {"matchLabels": {"gpu": "true"}},
        },
        {"apiVersion": "resource.k8s.io/v1", "resource": "resourceslices"},
        {"apiVersion": "resource.k8s.io/v1", "resource": "resourceclaims"},
        {"apiVersion": "resource.k8s.io/v1", "resource": "deviceclasses", "names": [DEVICE_CLASS]},
        {"apiVersion": "cozystack.io/v1alpha1", "resource": "gpuclasses"},
    ]
    plugin = customize(Settings(), dra_class("a10", spec={"dra": None, "resourceName": "a/b"}))
    assert not [r for r in plugin if r["apiVersion"] == "resource.k8s.io/v1"]
    without_api = customize(Settings(dra_api=False), dra_class("a10"))
    assert [r["resource"] for r in without_api] == ["gpuclasses"]


def test_customize_relates_device_taint_rules_only_where_they_are_served() -> None:
    taint_rules = {"apiVersion": "resource.k8s.io/v1beta2", "resource": "devicetaintrules"}
    assert taint_rules not in customize(Settings(), dra_class("a10"))
    assert taint_rules in customize(Settings(dra_device_taint_rules=True), dra_class("a10"))
    plugin = dra_class("a10", spec={"dra": None, "resourceName": "a/b"})
    assert taint_rules not in customize(Settings(dra_device_taint_rules=True), plugin)


def test_a_device_taint_rule_leaves_out_the_devices_it_selects_unless_tolerated() -> None:
    rules = [taint_rule("n1-maintenance", {"driver": DRIVER, "pool": "n1"})]
    response = dra_run(cluster(taint_rules=rules), dra_device_taint_rules=True)
    assert (response["status"]["free"], response["status"]["maxFreePerNode"]) == (1, 1)
    tolerant = dra_class(
        "a10", spec={"tolerations": [{"key": "maintenance", "operator": "Exists"}]}
    )
    request = cluster(taint_rules=rules) | {"parent": tolerant}
    assert dra_run(request, dra_device_taint_rules=True)["status"]["free"] == 3
    # Where they are not served, no rule is read.
    assert dra_run(cluster(), dra_device_taint_rules=False)["status"]["free"] == 3


def test_a_sync_without_the_device_taint_rules_asked_for_keeps_the_status() -> None:
    settled = dra_run(cluster(taint_rules=[]), dra_device_taint_rules=True)
    parent = dra_class("a10")
    parent["status"] = settled["status"]
    response = dra_run(cluster() | {"parent": parent}, dra_device_taint_rules=True)
    assert response["status"] == settled["status"]
    assert response["children"] == settled["children"] != []
    assert response["resyncAfterSeconds"] == status.STALE_RULES_RETRY_SECONDS


def test_stale_related_groups_keep_the_device_class_the_class_owns() -> None:
    settled = dra_run(cluster())
    parent = dra_class("a10")
    parent["status"] = settled["status"]
    stale = cluster()
    stale["parent"] = parent
    del stale["related"]["ResourceClaim.resource.k8s.io/v1"]
    response = dra_run(stale)
    assert response["children"] == settled["children"] != []
    assert response["status"] == settled["status"]
    # a class whose status said the DeviceClass is not its own names none
    foreign = dra_run(cluster(device_classes=[{**owned(), "metadata": {"name": DEVICE_CLASS}}]))
    parent["status"] = foreign["status"]
    assert dra_run(stale | {"parent": parent})["children"] == []


def test_a_dra_class_status_is_idempotent() -> None:
    first = dra_run(cluster())
    again = cluster()
    again["parent"] = {**again["parent"], "status": first["status"]}
    assert dra_run(again) == first


def test_a_dra_class_and_a_license_are_refused_together() -> None:
    licensed = dra_class("a10", spec={"license": {"secretRef": {"name": "n"}}})
    response = dra_run(dra_sync_request(licensed))
    assert conditions(response) == {"Ready": ("False", "InvalidSpec")}
    assert "takes no license" in response["status"]["conditions"][0]["message"]
