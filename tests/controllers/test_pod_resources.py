"""The pod labeller and the status's Pods rule (docs/gpuclass.md, "Which pods a class reads"):
each pod the pod selector picks is labelled with the extended resources it names, and a class
reads the selected pods that carry its resource's label, so that its status is the one it would
compute from every selected pod."""

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
from hooks.rules.pod_resources import resource_label
from hooks.serving.app import create_app
from hooks.settings import Settings
from hooks.wire.metacontroller import (
    CustomizeRequest,
    RelatedRule,
    decode_composite_sync,
    decode_envelope,
    encode,
)
from tests.builders import GPU, container, gpuclass, inventory_of, node, pod
from tests.controllers.test_status import NOW, PERMITTED

SYNC = "/pod-resources/sync"
LAUNCHER = {"kubevirt.io": "virt-launcher"}
H100 = "nvidia.com/GH100_H100_PCIE"


@pytest.fixture
def client(settings: Settings) -> FlaskClient:
    return create_app(settings).test_client()


def labels_answered(client: FlaskClient, target: dict[str, Any]) -> dict[str, Any]:
    body = {
        "controller": {
            "kind": "DecoratorController",
            "metadata": {"name": "gpuclass-pod-resources"},
        },
        "object": target,
        "attachments": {},
        "related": {},
        "finalizing": False,
    }
    response = client.post(SYNC, json=body)
    assert response.status_code == 200, response.get_data()
    answer = response.get_json()
    assert set(answer) == {"labels", "attachments", "status"}
    assert (answer["attachments"], answer["status"]) == ([], None)
    labels: dict[str, Any] = answer["labels"]
    return labels


def labelled(target: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    target["metadata"]["labels"] = labels
    return target


def test_a_resource_label_keeps_both_halves_of_the_resource_name() -> None:
    assert resource_label(GPU) == "nvidia.com.requests.gpuclass.cozystack.io/NVIDIA_L40S-24Q"
    assert resource_label(H100) == "nvidia.com.requests.gpuclass.cozystack.io/GH100_H100_PCIE"
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
    assert labels_answered(client, labelled(target, LAUNCHER)) == {
        "devices.kubevirt.io.requests.gpuclass.cozystack.io/kvm": "true",
        "example.com.requests.gpuclass.cozystack.io/fpga": "true",
        "nvidia.com.requests.gpuclass.cozystack.io/GH100_H100_PCIE": "true",
        "nvidia.com.requests.gpuclass.cozystack.io/NVIDIA_L40S-24Q": "true",
    }


def test_a_resource_label_the_pod_does_not_ask_for_is_removed(client: FlaskClient) -> None:
    """A tenant's VM labels are copied onto its pod: a label naming another resource goes, and
    labels of any other form stay as they are (the answer does not name them)."""
    claimed = {**LAUNCHER, resource_label(H100) or "": "true", "team": "a"}
    answer = labels_answered(client, labelled(pod("vm", gpus=1), claimed))
    assert answer == {resource_label(GPU): "true", resource_label(H100): None}


def test_with_gpu_features_off_every_resource_label_is_removed() -> None:
    client = create_app(Settings(enabled=False)).test_client()
    target = labelled(pod("vm", gpus=1), {**LAUNCHER, resource_label(GPU) or "": "true"})
    assert labels_answered(client, target) == {resource_label(GPU): None}


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


def pods_rule(resource: str | None, settings: Settings) -> dict[str, Any]:
    spec = {} if resource is None else {"resourceName": resource}
    request = decode_envelope(
        json.dumps({"parent": gpuclass("c", spec=spec)}).encode(), CustomizeRequest
    )
    rules = msgspec.json.decode(encode(status.customize(request, settings)))["relatedResources"]
    [pods] = [r for r in rules if r["resource"] == "pods"]
    return dict(pods)


def test_a_class_reads_the_selected_pods_that_carry_its_resource_label() -> None:
    settings = Settings(pod_selector="kubevirt.io=virt-launcher,team notin (x)")
    assert pods_rule(GPU, settings)["labelSelector"] == {
        "matchLabels": {"kubevirt.io": "virt-launcher"},
        "matchExpressions": [
            {"key": "team", "operator": "NotIn", "values": ["x"]},
            {"key": resource_label(GPU), "operator": "Exists"},
        ],
    }
    assert pods_rule(GPU, Settings(pod_selector=""))["labelSelector"] == {
        "matchExpressions": [{"key": resource_label(GPU), "operator": "Exists"}]
    }


def test_a_class_without_a_resource_label_reads_every_selected_pod() -> None:
    """A domain too long for the key's prefix, or a spec that cannot be read."""
    settings = Settings(pod_selector="kubevirt.io=virt-launcher")
    long_domain = ".".join(["d" * 55] * 4) + ".example.com/gpu"  # 235 characters
    assert resource_label(long_domain) is None
    for resource in (long_domain, None, "not-a-resource"):
        assert pods_rule(resource, settings)["labelSelector"] == {
            "matchLabels": {"kubevirt.io": "virt-launcher"}
        }


# --- the invariant: labelled and narrowed, a class computes what it would from every pod -----

RESOURCES = (GPU, H100, "devices.kubevirt.io/kvm")
QUANTITIES = st.sampled_from(["0", "1", "2", "1500m"])


@st.composite
def pods_of_a_cluster(draw: st.DrawFn) -> list[dict[str, Any]]:
    def resources() -> dict[str, str]:
        names = draw(st.lists(st.sampled_from(RESOURCES), max_size=2, unique=True))
        return {"cpu": "1", **{name: draw(QUANTITIES) for name in names}}

    made = []
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
            node_name=draw(st.sampled_from(["gpu-1", "gpu-2", "gpu-2", None])),
            containers=containers,
            init_containers=inits or None,
            overhead=draw(st.sampled_from([None, {GPU: "1"}, {H100: "1"}])),
            phase=draw(st.sampled_from(["Running", "Running", "Pending", "Succeeded"])),
        )
        launcher = draw(st.sampled_from([True, True, True, False]))
        tenant_claims = draw(st.sampled_from([{}, {resource_label(H100) or "": "true"}]))
        made.append(labelled(target, {**(LAUNCHER if launcher else {}), **tenant_claims}))
    return made


def status_of(resource: str, pod_rule: RelatedRule, items: list[dict[str, Any]]) -> Any:
    parent = gpuclass("c", resource=resource)
    nodes = [node("gpu-1", resource=resource), node("gpu-2", resource=resource, gpus=8)]
    inventory = inventory_of([parent, *nodes, *items])
    rules = [RelatedRule(api_version="v1", resource="nodes"), pod_rule]
    rules.append(RelatedRule(api_version="cozystack.io/v1alpha1", resource="gpuclasses"))
    request = {"parent": parent, "related": offline.select_related(rules, inventory)}
    outcome = status.sync(
        decode_composite_sync(json.dumps(request).encode()),
        Settings(),
        lambda: PERMITTED,
        NOW,
    )
    return encode(outcome.response), sorted(o.name for o in outcome.invalid)


@given(pods_of_a_cluster(), st.sampled_from([GPU, H100]))
def test_a_classs_status_is_the_one_it_would_compute_from_every_selected_pod(
    items: list[dict[str, Any]], resource: str
) -> None:
    """Every pod the selector picks, labelled by the labeller, through the class's own Pods rule,
    gives the status (and the objects it warns about) that every selected pod gives."""
    settings = Settings(pod_selector="kubevirt.io=virt-launcher")
    labelled_inventory = offline.pods_labelled(inventory_of(items), settings)
    narrowed = msgspec.convert(
        msgspec.to_builtins(status.pods_rule(resource, settings)), RelatedRule
    )
    every = RelatedRule(
        api_version="v1", resource="pods", label_selector=settings.pod_label_selector
    )
    pods_after = labelled_inventory.objects.get(("v1", "pods"), [])
    assert status_of(resource, narrowed, pods_after) == status_of(resource, every, items)
