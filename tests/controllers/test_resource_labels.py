"""The resource labeller and the status's Pods and Nodes rules (docs/gpuclass.md, "Which pods
and nodes a class reads"): each pod and node the selectors pick is labelled with the extended
resources it names, and a class reads the selected ones that carry its resource's label, so that
its status is the one it would compute from every selected pod and node."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from hooks.cli import offline
from hooks.controllers import status
from hooks.rules.resource_labels import LABELLED, resource_label
from hooks.serving.app import create_app
from hooks.settings import Settings
from hooks.wire.metacontroller import (
    CustomizeRequest,
    RelatedRule,
    decode_composite_sync,
    decode_envelope,
    encode,
)
from tests.builders import GPU, container, gpuclass, inventory_of, labels_answered, node, pod
from tests.controllers.test_status import NOW, PERMITTED

SYNC = "/resource-labels/sync"
LAUNCHER = {"kubevirt.io": "virt-launcher"}
H100 = "nvidia.com/GH100_H100_PCIE"


def labels_of(client: FlaskClient, target: dict[str, Any]) -> dict[str, Any]:
    body = {
        "controller": {
            "kind": "DecoratorController",
            "metadata": {"name": "gpuclass-resource-labels"},
        },
        "object": target,
        "attachments": {},
        "related": {},
        "finalizing": False,
    }
    return labels_answered(client, SYNC, body)


def labelled(target: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    target["metadata"]["labels"] = labels
    return target


def test_a_resource_label_keeps_both_halves_of_the_resource_name() -> None:
    assert resource_label(GPU) == "nvidia.com.resources.gpuclass.cozystack.io/NVIDIA_L40S-24Q"
    assert resource_label(H100) == "nvidia.com.resources.gpuclass.cozystack.io/GH100_H100_PCIE"
    assert resource_label("example.com/gpu") != resource_label("example.org/gpu")
    # what no class can name gets none
    assert [resource_label(r) for r in ("cpu", "hugepages-2Mi", "kubernetes.io/x")] == [None] * 3


def test_a_pod_is_labelled_for_every_extended_resource_it_names(client: FlaskClient) -> None:
    target = pod(
        "vm",
        containers=[
            container(
                requests={"cpu": "4", "memory": "1Gi"}, limits={"devices.kubevirt.io/kvm": "1"}
            )
        ],
        init_containers=[
            container(requests={GPU: "1"}, restart_policy="Always"),  # a sidecar
            container(limits={"example.com/fpga": "0"}),  # named, whatever the quantity
        ],
        overhead={H100: "1", "cpu": "100m"},
    )
    assert labels_of(client, labelled(target, LAUNCHER)) == {
        LABELLED: "true",
        "devices.kubevirt.io.resources.gpuclass.cozystack.io/kvm": "true",
        "example.com.resources.gpuclass.cozystack.io/fpga": "true",
        "nvidia.com.resources.gpuclass.cozystack.io/GH100_H100_PCIE": "true",
        "nvidia.com.resources.gpuclass.cozystack.io/NVIDIA_L40S-24Q": "true",
    }


def test_a_resource_label_the_pod_does_not_ask_for_is_removed(client: FlaskClient) -> None:
    """A tenant's VM labels are copied onto its pod: a label naming another resource goes, and
    labels of any other form stay as they are (the answer does not name them)."""
    claimed = {**LAUNCHER, resource_label(H100) or "": "true", "team": "a"}
    answer = labels_of(client, labelled(pod("vm", gpus=1), claimed))
    assert answer == {resource_label(GPU): "true", resource_label(H100): None, LABELLED: "true"}


def test_with_gpu_features_off_every_resource_label_is_removed() -> None:
    client = create_app(Settings(enabled=False)).test_client()
    target = labelled(pod("vm", gpus=1), {**LAUNCHER, resource_label(GPU) or "": "true"})
    assert labels_of(client, target) == {resource_label(GPU): None}
    target["metadata"]["labels"][LABELLED] = "true"
    assert labels_of(client, target) == {resource_label(GPU): None, LABELLED: None}


@pytest.mark.parametrize(
    "target",
    [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": 3}},
        None,
    ],
)
def test_a_sync_of_anything_but_a_named_pod_is_a_400(client: FlaskClient, target: Any) -> None:
    response = client.post(SYNC, json={"object": target, "attachments": {}, "related": {}})
    assert response.status_code == 400
    assert set(response.get_json()) == {"error"}


def labelled_rules(resource: str | None, settings: Settings) -> dict[str, list[Any]]:
    """The class's Pods and Nodes rules' label selectors, by resource."""
    spec = {} if resource is None else {"resourceName": resource}
    request = decode_envelope(
        json.dumps({"parent": gpuclass("c", spec=spec)}).encode(), CustomizeRequest
    )
    rules = msgspec.json.decode(encode(status.customize(request, settings)))["relatedResources"]
    selectors: dict[str, list[Any]] = {"pods": [], "nodes": []}
    for rule in rules:
        if rule["resource"] in selectors:
            selectors[rule["resource"]].append(rule.get("labelSelector"))
    return selectors


def test_a_class_reads_the_selected_pods_and_nodes_of_its_resource_or_not_labelled_yet() -> None:
    settings = Settings(
        pod_selector="kubevirt.io=virt-launcher,team notin (x)",
        node_selector="nvidia.com/gpu.present=true",
    )
    named = {"key": resource_label(GPU), "operator": "Exists"}
    unread = {"key": LABELLED, "operator": "DoesNotExist"}
    team = {"key": "team", "operator": "NotIn", "values": ["x"]}
    rules = labelled_rules(GPU, settings)
    assert rules["pods"] == [
        {"matchLabels": {"kubevirt.io": "virt-launcher"}, "matchExpressions": [team, named]},
        {"matchLabels": {"kubevirt.io": "virt-launcher"}, "matchExpressions": [team, unread]},
    ]
    assert rules["nodes"] == [
        {"matchLabels": {"nvidia.com/gpu.present": "true"}, "matchExpressions": [named]},
        {"matchLabels": {"nvidia.com/gpu.present": "true"}, "matchExpressions": [unread]},
    ]
    unselected = labelled_rules(GPU, Settings(pod_selector="", node_selector=""))
    both = [{"matchExpressions": [named]}, {"matchExpressions": [unread]}]
    assert unselected == {"pods": both, "nodes": both}


def test_a_class_without_a_resource_label_reads_every_selected_pod_and_node() -> None:
    """A domain too long for the key's prefix, or a spec that cannot be read."""
    settings = Settings(pod_selector="kubevirt.io=virt-launcher", node_selector="")
    long_domain = ".".join(["d" * 55] * 4) + ".example.com/gpu"  # 235 characters
    assert resource_label(long_domain) is None
    for resource in (long_domain, None, "not-a-resource"):
        rules = labelled_rules(resource, settings)
        assert rules == {
            "pods": [{"matchLabels": {"kubevirt.io": "virt-launcher"}}],
            "nodes": [None],
        }


def test_a_node_is_labelled_for_every_extended_resource_it_lists(client: FlaskClient) -> None:
    """In capacity or in allocatable, whatever the count (a device plugin gone leaves 0)."""
    target = node("gpu-1", gpus=0, capacity=4)
    target["status"]["allocatable"][H100] = "2"
    target["status"]["capacity"]["hugepages-1Gi"] = "4Gi"
    target["metadata"]["labels"] = {resource_label("example.com/fpga") or "": "true", "zone": "a"}
    assert labels_of(client, target) == {
        resource_label(GPU): "true",
        resource_label(H100): "true",
        resource_label("example.com/fpga"): None,
        LABELLED: "true",
    }


# --- the invariant: labelled and narrowed, a class computes what it would from everything ---

RESOURCES = (GPU, H100, "devices.kubevirt.io/kvm")
QUANTITIES = st.sampled_from(["0", "1", "2", "1500m"])
NODES = ("gpu-1", "gpu-2", "cpu-1")
GPU_NODES = {"nvidia.com/gpu.present": "true"}


@st.composite
def a_cluster(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Pods naming the resources anywhere the rules read them (or not at all), some selected,
    some carrying a tenant's false label; nodes listing them in capacity, allocatable, both or
    neither, some selected."""

    def resources() -> dict[str, str]:
        names = draw(st.lists(st.sampled_from(RESOURCES), max_size=2, unique=True))
        return {"cpu": "1", **{name: draw(QUANTITIES) for name in names}}

    made = []
    for name in NODES:
        made_node = node(name, gpus=None)
        for resource in draw(st.lists(st.sampled_from(RESOURCES), max_size=2, unique=True)):
            where = draw(
                st.sampled_from([("capacity",), ("allocatable",), ("capacity", "allocatable")])
            )
            for field in where:
                made_node["status"][field][resource] = draw(QUANTITIES)
        selected = draw(st.sampled_from([True, True, False]))
        made.append(labelled(made_node, GPU_NODES if selected else {}))
    for index in range(draw(st.integers(0, 6))):
        containers = [
            container(requests=resources(), limits=resources())
            for _ in range(draw(st.integers(1, 2)))
        ]
        inits = [
            container(requests=resources(), restart_policy="Always")
            if draw(st.booleans())
            else container(limits=resources())
            for _ in range(draw(st.integers(0, 1)))
        ]
        target = pod(
            f"p{index}",
            node_name=draw(st.sampled_from([*NODES, "gpu-2", None])),
            containers=containers,
            init_containers=inits or None,
            overhead=draw(st.sampled_from([None, {GPU: "1"}, {H100: "1"}])),
            phase=draw(st.sampled_from(["Running", "Running", "Pending", "Succeeded"])),
        )
        launcher = draw(st.sampled_from([True, True, True, False]))
        tenant_claims = draw(st.sampled_from([{}, {resource_label(H100) or "": "true"}]))
        made.append(labelled(target, {**(LAUNCHER if launcher else {}), **tenant_claims}))
    return made


def status_of(resource: str, rules: list[RelatedRule], items: list[dict[str, Any]]) -> Any:
    parent = gpuclass("c", resource=resource)
    inventory = inventory_of([parent, *items])
    rules = [*rules, RelatedRule(api_version="cozystack.io/v1alpha1", resource="gpuclasses")]
    request = {"parent": parent, "related": offline.select_related(rules, inventory)}
    outcome = status.sync(
        decode_composite_sync(json.dumps(request).encode()), Settings(), lambda: PERMITTED, NOW
    )
    return encode(outcome.response), sorted(o.name for o in outcome.invalid)


@given(a_cluster(), st.sampled_from([GPU, H100]), st.booleans())
def test_a_classs_status_is_the_one_it_would_compute_from_every_selected_pod_and_node(
    items: list[dict[str, Any]], resource: str, labeller_ran: bool
) -> None:
    """Every pod and node the selectors pick, through the class's own rules, gives the status
    (and the objects it warns about) that every selected one gives: once the labeller has
    labelled them, and before it has read any (an upgrade, a Metacontroller that may not label)."""
    settings = Settings(
        pod_selector="kubevirt.io=virt-launcher", node_selector="nvidia.com/gpu.present=true"
    )
    inventory = inventory_of(items)
    if labeller_ran:
        inventory = offline.resources_labelled(inventory, settings)
    narrowed = [
        *status.labelled_rules("nodes", settings.node_label_selector, resource),
        *status.labelled_rules("pods", settings.pod_label_selector, resource),
    ]
    every = [
        RelatedRule(
            api_version="v1", resource="nodes", label_selector=settings.node_label_selector
        ),
        RelatedRule(api_version="v1", resource="pods", label_selector=settings.pod_label_selector),
    ]
    seen = [*inventory.objects.get(("v1", "nodes"), []), *inventory.objects.get(("v1", "pods"), [])]
    assert status_of(resource, narrowed, seen) == status_of(resource, every, items)


def test_an_object_the_labeller_read_reaches_only_the_classes_it_names() -> None:
    """What the labels are for: a labelled pod or node of one resource is not related to the
    class of another; one not read yet is related to every class."""
    settings = Settings()
    made = [labelled(node("gpu-1", resource=GPU), {}), labelled(pod("vm", gpus=1), LAUNCHER)]
    read = offline.resources_labelled(inventory_of(made), settings)
    for inventory, reaches_h100 in ((inventory_of(made), True), (read, False)):
        for resource, reached in ((GPU, True), (H100, reaches_h100)):
            rules = [
                *status.labelled_rules("nodes", settings.node_label_selector, resource),
                *status.labelled_rules("pods", settings.pod_label_selector, resource),
            ]
            related = offline.select_related(rules, inventory)
            assert bool(related["Node.v1"]) is reached and bool(related["Pod.v1"]) is reached
