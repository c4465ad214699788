import json
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from hooks.controllers import status
from hooks.rules.permitted_devices import (
    KubeVirtAbsent,
    KubeVirtFound,
    KubeVirtUnreadable,
    KubeVirtView,
)
from hooks.settings import Settings
from hooks.wire.kube import KubeVirt
from hooks.wire.metacontroller import (
    CustomizeRequest,
    decode_composite_sync,
    decode_envelope,
    encode,
)
from tests.builders import (
    GPU,
    OTHER_GPU,
    as_wire,
    conditions_in_order,
    gpuclass,
    node,
    pod,
    status_sync_request,
)
from tests.fake_apiserver import kubevirt_cr

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PERMITTED = KubeVirtFound(as_wire(kubevirt_cr(GPU, OTHER_GPU), KubeVirt), "cozy-kubevirt/kubevirt")


def run(
    request: dict[str, Any],
    view: KubeVirtView = PERMITTED,
    settings: Settings | None = None,
    now: datetime = NOW,
) -> dict[str, Any]:
    decoded = decode_composite_sync(json.dumps(request).encode())
    outcome = status.sync(decoded, settings or Settings(), lambda: view, now)
    return msgspec.json.decode(encode(outcome.response))


def conditions(response: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in response["status"]["conditions"]}


def cluster() -> dict[str, Any]:
    parent = gpuclass("l40s", tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    return status_sync_request(
        parent,
        nodes=[
            node("gpu-1", gpus=4, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
            node("gpu-2", gpus=2),
            node("gpu-3", gpus=8, unschedulable=True),
            node("cpu-1", gpus=None),
        ],
        pods=[pod("vm-1", node_name="gpu-1", gpus=1), pod("vm-2", node_name="gpu-2", gpus=2)],
    )


def test_status_reports_free_and_max_free_per_node() -> None:
    response = run(cluster())
    assert set(response) == {"status", "children"}
    assert response["children"] == []
    assert (response["status"]["free"], response["status"]["maxFreePerNode"]) == (3, 3)
    found = conditions(response)
    assert list(found) == conditions_in_order(licensed=False)
    assert found["Ready"] == ("True", "Ready")
    assert all(status == "False" for kind, (status, _) in found.items() if kind != "Ready")
    assert [found[kind][1] for kind in ("ResourceNameConflict", "ResourceNameNotPermitted")] == [
        "NoConflict",
        "Permitted",
    ]
    assert found["ResourceNotAdvertised"] == ("False", "Advertised")


def test_status_is_idempotent() -> None:
    request = cluster()
    first = run(request)
    request["parent"]["status"] = dict(first["status"], observedGeneration=1)
    second = run(request, now=NOW + timedelta(minutes=5))
    assert second == first


def test_status_is_idempotent_while_kubevirt_is_unreadable() -> None:
    request = cluster()
    first = run(request, KubeVirtUnreadable("HTTP 503"))
    request["parent"]["status"] = first["status"]
    assert run(request, KubeVirtUnreadable("HTTP 503"), now=NOW + timedelta(minutes=1)) == first


def test_kubevirt_unreadable_keeps_the_previous_permission_and_asks_for_a_resync() -> None:
    request = cluster()
    request["parent"]["status"] = run(request)["status"]
    response = run(request, KubeVirtUnreadable("timed out"), now=NOW + timedelta(minutes=1))
    assert response["resyncAfterSeconds"] == status.KUBEVIRT_RETRY_SECONDS
    assert conditions(response)["ResourceNameNotPermitted"] == ("False", "Permitted")
    assert conditions(response)["Ready"] == ("True", "Ready")


def test_kubevirt_unreadable_without_history_makes_ready_unknown() -> None:
    response = run(cluster(), KubeVirtUnreadable("timed out"))
    assert conditions(response)["Ready"] == ("Unknown", "KubeVirtUnreadable")
    assert response["resyncAfterSeconds"] == status.KUBEVIRT_RETRY_SECONDS


def test_no_resync_requested_when_kubevirt_was_read() -> None:
    assert "resyncAfterSeconds" not in run(cluster())


def test_no_resync_requested_on_a_cluster_without_kubevirt() -> None:
    """An answer, not a failure: KubeVirt is not there, and asking again every few seconds
    would multiply the sync load for ever on a cluster that will not grow it soon."""
    response = run(cluster(), KubeVirtAbsent("cozy-kubevirt/kubevirt"))
    assert "resyncAfterSeconds" not in response


def test_resource_name_conflict_reports_zero_for_the_younger_class() -> None:
    older = gpuclass("a-old", created="2025-01-01T00:00:00Z")
    younger = gpuclass("b-new", created="2026-01-01T00:00:00Z")
    request = status_sync_request(younger, nodes=[node("gpu-1")], classes=[older, younger])
    response = run(request)
    assert (response["status"]["free"], response["status"]["maxFreePerNode"]) == (0, 0)
    assert conditions(response)["ResourceNameConflict"] == ("True", "OlderClassHasResource")
    assert conditions(response)["Ready"] == ("False", "ResourceNameConflict")
    assert "a-old" in response["status"]["conditions"][0]["message"]
    request["parent"] = older
    assert run(request)["status"]["free"] == 4


def test_conflict_ignores_related_classes_with_invalid_specs() -> None:
    parent = gpuclass("b", created="2026-01-01T00:00:00Z")
    broken = gpuclass("a", created="2025-01-01T00:00:00Z", spec={"resourceName": 42})
    response = run(status_sync_request(parent, nodes=[node("gpu-1")], classes=[broken, parent]))
    assert conditions(response)["ResourceNameConflict"] == ("False", "NoConflict")


def test_not_permitted_resource_makes_class_unready() -> None:
    request = status_sync_request(
        gpuclass("h100", resource="nvidia.com/UNLISTED"),
        nodes=[node("g", resource="nvidia.com/UNLISTED")],
    )
    assert conditions(run(request))["Ready"] == ("False", "ResourceNameNotPermitted")


def test_not_advertised_resource_makes_class_unready() -> None:
    response = run(status_sync_request(gpuclass("l40s"), nodes=[node("cpu", gpus=None)]))
    assert conditions(response)["ResourceNotAdvertised"] == ("True", "NoNodeAdvertises")
    assert conditions(response)["Ready"] == ("False", "ResourceNotAdvertised")


def test_zero_free_units_do_not_make_a_class_unready() -> None:
    request = status_sync_request(
        gpuclass("l40s"), nodes=[node("gpu-1", gpus=1)], pods=[pod("vm", gpus=1)]
    )
    response = run(request)
    assert response["status"]["free"] == 0
    assert conditions(response)["Ready"] == ("True", "Ready")


def test_invalid_spec_gets_only_ready_false_invalid_spec() -> None:
    response = run(status_sync_request(gpuclass("broken", resource=None, generation=4)))
    assert [
        (c["type"], c["status"], c["reason"], c["observedGeneration"])
        for c in response["status"]["conditions"]
    ] == [("Ready", "False", "InvalidSpec", 4)]
    assert "exactly one of resourceName and dra" in response["status"]["conditions"][0]["message"]
    assert (response["status"]["free"], response["status"]["maxFreePerNode"]) == (0, 0)


def test_conditions_carry_the_parent_generation() -> None:
    request = cluster()
    request["parent"]["metadata"]["generation"] = 9
    assert {c["observedGeneration"] for c in run(request)["status"]["conditions"]} == {9}


def test_disabled_returns_empty_status_and_no_children() -> None:
    assert run(cluster(), settings=Settings(enabled=False)) == {"status": {}, "children": []}


def test_missing_related_group_keeps_previous_status_and_asks_for_resync() -> None:
    request = cluster()
    previous = run(request)["status"]
    request["parent"]["status"] = previous
    del request["related"]["Pod.v1"]
    response = run(request)
    assert response == {
        "status": previous,
        "children": [],
        "resyncAfterSeconds": status.STALE_RULES_RETRY_SECONDS,
    }


def test_invalid_objects_are_skipped_and_reported_without_failing() -> None:
    request = cluster()
    request["related"]["Node.v1"]["bad"] = {"metadata": {"name": "bad"}, "spec": {"taints": "oops"}}
    request["related"]["Pod.v1"]["tenant-a/broken"] = pod("broken", node_name="gpu-2", gpus="2.5")
    decoded = decode_composite_sync(json.dumps(request).encode())
    outcome = status.sync(decoded, Settings(), lambda: PERMITTED, NOW)
    assert {(o.kind, o.name) for o in outcome.invalid} == {
        ("Node", "bad"),
        ("Pod", "tenant-a/broken"),
    }
    assert outcome.response.status.free == 3  # type: ignore[union-attr]


def customize(settings: Settings) -> list[dict[str, Any]]:
    request = decode_envelope(json.dumps({"parent": gpuclass("l40s")}).encode(), CustomizeRequest)
    return msgspec.json.decode(encode(status.customize(request, settings)))["relatedResources"]


def test_customize_asks_for_the_nodes_and_pods_of_its_resource_and_all_gpuclasses() -> None:
    labelled = {"key": "nvidia.com.resources.gpuclass.cozystack.io/NVIDIA_L40S-24Q"}
    named = {"labelSelector": {"matchExpressions": [{**labelled, "operator": "Exists"}]}}
    unread = {"key": "gpuclass.cozystack.io/resources-labelled", "operator": "DoesNotExist"}
    not_yet = {"labelSelector": {"matchExpressions": [unread]}}
    assert customize(Settings()) == [
        {"apiVersion": "v1", "resource": "nodes", **named},
        {"apiVersion": "v1", "resource": "nodes", **not_yet},
        {"apiVersion": "v1", "resource": "pods", **named},
        {"apiVersion": "v1", "resource": "pods", **not_yet},
        {"apiVersion": "cozystack.io/v1alpha1", "resource": "gpuclasses"},
    ]


def test_customize_applies_the_configured_selectors() -> None:
    rules = customize(
        Settings(
            node_selector="nvidia.com/gpu.present=true", pod_selector="kubevirt.io=virt-launcher"
        )
    )
    assert rules[0]["labelSelector"]["matchLabels"] == {"nvidia.com/gpu.present": "true"}
    assert rules[2]["labelSelector"]["matchLabels"] == {"kubevirt.io": "virt-launcher"}


def test_customize_disabled_asks_for_no_nodes_or_pods() -> None:
    assert [r["resource"] for r in customize(Settings(enabled=False))] == ["gpuclasses"]


@pytest.mark.parametrize(
    "parent", [None, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "x"}}]
)
def test_customize_refuses_a_parent_that_is_not_a_gpuclass(parent: Any) -> None:
    from hooks.wire.metacontroller import BadRequest

    request = decode_envelope(json.dumps({"parent": parent}).encode(), CustomizeRequest)
    with pytest.raises(BadRequest):
        status.customize(request, Settings())


def licensed_cluster(**kwargs: Any) -> dict[str, Any]:
    from tests.builders import licensed_class

    request = status_sync_request(licensed_class(), nodes=[node("gpu-1")], **kwargs)
    return request


def test_license_secret_missing_reasons_and_ready() -> None:
    from tests.builders import SOURCE_NAME, SOURCE_NS, TOKEN_KEY, namespace, secret, source_secret

    cases = [
        ([source_secret()], ("False", "SecretFound")),
        ([], ("True", "SecretNotFound")),
        ([secret(SOURCE_NAME, SOURCE_NS, data={TOKEN_KEY: b"  "})], ("True", "TokenMissing")),
    ]
    for secrets, expected in cases:
        response = run(licensed_cluster(secrets=secrets, namespaces=[namespace("a")]))
        assert conditions(response)["LicenseSecretMissing"] == expected
        ready = ("True", "Ready") if expected[0] == "False" else ("False", "LicenseSecretMissing")
        assert conditions(response)["Ready"] == ready


def test_license_namespace_not_allowed() -> None:
    from tests.builders import licensed_class, namespace

    parent = licensed_class(license={"secretRef": {"name": "tok", "namespace": "tenant-x"}})
    request = status_sync_request(
        parent, nodes=[node("gpu-1")], secrets=[], namespaces=[namespace("a")]
    )
    assert conditions(run(request))["LicenseSecretMissing"] == ("True", "NamespaceNotAllowed")


def test_license_copy_conflict_counts_foreign_secrets_with_first_five_sorted() -> None:
    from tests.builders import namespace, secret, source_secret

    names = [f"tenant-{c}" for c in "gfedcba"]
    foreign = [secret("gpuclass-l40s-license", n) for n in names]
    response = run(
        licensed_cluster(
            secrets=[source_secret(), *foreign], namespaces=[namespace(n) for n in names]
        )
    )
    assert conditions(response)["LicenseCopyConflict"] == ("True", "ForeignSecret")
    message = next(
        c["message"] for c in response["status"]["conditions"] if c["type"] == "LicenseCopyConflict"
    )
    assert message == (
        "7 entitled namespaces hold a Secret gpuclass-l40s-license that is not a managed copy "
        "and get no copy: tenant-a, tenant-b, tenant-c, tenant-d, tenant-e, ..."
    )
    assert conditions(response)["Ready"] == ("True", "Ready")


def test_license_copy_conflict_unmanaged_copy() -> None:
    from tests.builders import managed_copy, namespace, source_secret

    orphan = managed_copy("l40s", "tenant-a")
    del orphan["metadata"]["ownerReferences"]
    response = run(
        licensed_cluster(secrets=[source_secret(), orphan], namespaces=[namespace("tenant-a")])
    )
    assert conditions(response)["LicenseCopyConflict"] == ("True", "UnmanagedCopy")


def test_license_conditions_order_and_idempotency() -> None:
    from tests.builders import namespace, source_secret

    request = licensed_cluster(secrets=[source_secret()], namespaces=[namespace("a")])
    first = run(request)
    assert [c["type"] for c in first["status"]["conditions"]] == conditions_in_order(licensed=True)
    request["parent"]["status"] = first["status"]
    assert run(request, now=NOW + timedelta(hours=1)) == first


def test_unlicensed_class_has_no_license_conditions() -> None:
    assert "LicenseSecretMissing" not in conditions(run(cluster()))


def test_licensed_class_with_missing_license_groups_keeps_status() -> None:
    from tests.builders import namespace, source_secret

    previous = run(licensed_cluster(secrets=[source_secret()], namespaces=[namespace("a")]))
    request = licensed_cluster(secrets=None, namespaces=None)
    request["parent"]["status"] = previous["status"]
    assert run(request) == {
        "status": previous["status"],
        "children": [],
        "resyncAfterSeconds": status.STALE_RULES_RETRY_SECONDS,
    }


def test_status_customize_adds_the_license_rules_for_licensed_classes() -> None:
    from tests.builders import licensed_class

    request = decode_envelope(json.dumps({"parent": licensed_class()}).encode(), CustomizeRequest)
    rules = msgspec.json.decode(encode(status.customize(request, Settings())))["relatedResources"]
    assert [r["resource"] for r in rules] == [
        "nodes",
        "nodes",
        "pods",
        "pods",
        "gpuclasses",
        "secrets",
        "namespaces",
        "secrets",
    ]


# --- what the route logs and exports: the outcome beside the response ---------------------------


def outcome_of(
    request: dict[str, Any], view: KubeVirtView = PERMITTED, settings: Settings | None = None
) -> status.StatusOutcome:
    decoded = decode_composite_sync(json.dumps(request).encode())
    return status.sync(decoded, settings or Settings(), lambda: view, NOW)


def test_outcome_of_a_disabled_class_names_it_and_exports_nothing() -> None:
    outcome = outcome_of(cluster(), settings=Settings(enabled=False))
    assert (outcome.class_name, outcome.outcome, outcome.computation.known_classes) == (
        "l40s",
        "disabled",
        (),
    )
    assert (outcome.computation.conditions, outcome.counts, outcome.computation.capacity) == (
        (),
        {},
        None,
    )


def test_outcome_of_an_invalid_spec_carries_its_one_condition() -> None:
    outcome = outcome_of(status_sync_request(gpuclass("bad", resource="no-slash")))
    assert (outcome.class_name, outcome.outcome, outcome.computation.resource) == (
        "bad",
        "invalid_spec",
        None,
    )
    [condition] = outcome.computation.conditions
    assert (condition.type, condition.status, condition.reason) == ("Ready", "False", "InvalidSpec")
    assert outcome.response.children == []


def test_outcome_of_stale_related_groups_names_class_and_resource() -> None:
    request = cluster()
    del request["related"]["Node.v1"]
    outcome = outcome_of(request)
    assert (outcome.class_name, outcome.outcome, outcome.computation.resource) == (
        "l40s",
        "stale_related",
        GPU,
    )


def test_outcome_of_a_sync_counts_what_it_read_and_names_what_it_skipped() -> None:
    request = cluster()
    request["related"]["Node.v1"]["broken"] = {"metadata": {"name": "broken"}, "spec": []}
    request["related"]["Pod.v1"]["tenant-a/broken"] = {"spec": []}
    request["related"]["GPUClass.cozystack.io/v1alpha1"]["broken"] = {"metadata": []}
    outcome = outcome_of(request)
    assert (outcome.class_name, outcome.outcome, outcome.computation.resource) == (
        "l40s",
        "ok",
        GPU,
    )
    assert outcome.counts == {"nodes": 4, "eligible_nodes": 2, "counted_pods": 2}
    assert [(o.kind, o.name, o.reason) for o in outcome.invalid] == [
        ("Node", "broken", "does not decode"),
        ("Pod", "tenant-a/broken", "does not decode"),
        ("GPUClass", "broken", "does not decode"),
    ]
    assert (
        outcome.computation.free,
        outcome.computation.max_free_per_node,
        outcome.computation.exports_inventory,
    ) == (3, 3, True)
    assert sorted(outcome.computation.known_classes or ()) == ["l40s"]
    assert outcome.computation.conditions == tuple(outcome.response.status.conditions)  # type: ignore[union-attr]
    assert outcome_of(cluster(), KubeVirtUnreadable("timed out")).outcome == "kubevirt_unreadable"


def test_outcome_of_a_licensed_class_counts_copies_and_conflicts() -> None:
    from tests.builders import namespace, orphaned_copy, secret, source_secret

    tenant_secret = secret("gpuclass-l40s-license", "tenant-b", data={"x": b"y"})
    orphan = orphaned_copy("l40s", "elsewhere")
    request = licensed_cluster(
        secrets=[source_secret(), tenant_secret, orphan],
        namespaces=[namespace("tenant-a"), namespace("tenant-b"), namespace("tenant-c")],
    )
    outcome = outcome_of(request)
    assert outcome.counts == {
        "nodes": 1,
        "eligible_nodes": 1,
        "counted_pods": 0,
        "copies": 2,
        "conflicts": 2,  # the tenant's own Secret, and the orphaned copy elsewhere
    }
    assert conditions(msgspec.json.decode(encode(outcome.response)))["LicenseCopyConflict"] == (
        "True",
        "ForeignSecret",
    )


def test_conditions_name_the_resource_and_the_older_class() -> None:
    request = status_sync_request(
        gpuclass("young", created="2026-02-01T00:00:00Z"),
        nodes=[],
        classes=[gpuclass("old", created="2026-01-01T00:00:00Z")],
    )
    messages = {c["type"]: c["message"] for c in run(request)["status"]["conditions"]}
    assert messages["ResourceNameConflict"] == (
        f"class old is older and has the same resourceName {GPU}"
    )
    assert messages["ResourceNotAdvertised"] == f"no node lists {GPU} in status.capacity"
