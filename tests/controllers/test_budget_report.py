"""The budget report's hooks through HTTP (Flask's test metered_client), with Metacontroller-shaped
requests (each tenant namespace's, as its rules select them once the namespaces are labelled):
one ConfigMap `gpu-budget` per GPU budget pool, holding its own figures only, never written over a
tenant's own, kept while the request cannot be trusted; its metrics; the class index the pools
read, attached to the release's ClusterRole, which also replaces the one-target report of earlier
versions."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings

from hooks.cli import offline
from hooks.controllers import budget_report
from hooks.rules.budget.subtrees import top_level_namespace
from hooks.serving.app import create_app, settings_metrics
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from hooks.wire.metacontroller import LabelSelector, Requirement, decode_report_sync
from tests.builders import example_of, helmrelease, inventory_of, tenancy_items
from tests.cli.test_plan import run_plan
from tests.profiles import examples
from tests.rules.budget.test_invariant import (
    BUDGET_KEYS,
    CLASS_OBJECTS,
    INSTANCE_TYPES,
    Cluster,
    instance_type_objects,
)
from tests.rules.budget.test_usage import carved, grown_then_lowered

SYNC = "/budget-pools/sync"
HELMRELEASES = "HelmRelease.helm.toolkit.fluxcd.io/v2"
CONFIGMAPS = "ConfigMap.v1"
NAMESPACES = "Namespace.v1"
TOTAL = "gpuclass.cozystack.io/devices"
L40S_KEY = "l40s-24q.gpuclass.cozystack.io/devices"
L40S = "nvidia.com/NVIDIA_L40S-24Q"
GPUCLASSES = "GPUClass.cozystack.io/v1alpha1"
REPORT_LABELS = {"gpuclass.cozystack.io/budget-report": "true"}


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(180.0, clock=lambda: 1000.0)


def requests(items: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Each tenant namespace's sync request, as Metacontroller sends it once every namespace is
    labelled (examples/tenancy.yaml unless told otherwise)."""
    return offline.pool_requests(
        inventory_of(tenancy_items() if items is None else items), Settings()
    )


def answered(metered_client: FlaskClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = metered_client.post(SYNC, json=body)
    assert response.status_code == 200, response.get_data()
    answer = response.get_json()
    assert set(answer) <= {"attachments", "status", "resyncAfterSeconds"}
    assert answer["status"] is None
    attachments: list[dict[str, Any]] = answer["attachments"]
    return attachments


def reports(
    metered_client: FlaskClient, bodies: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Every pool's report, by namespace: a top-level namespace's sync attaches those of its
    subtree, `tenant-root`'s its own, the others none; no two attach one."""
    found: dict[str, dict[str, Any]] = {}
    for namespace, body in bodies.items():
        for attached in answered(metered_client, body):
            where = attached["metadata"]["namespace"]
            assert where not in found
            assert where == namespace or top_level_namespace(where) == namespace
            found[where] = attached
    return found


def release(items: list[dict[str, Any]], key: str) -> dict[str, Any]:
    [found] = [
        o
        for o in items
        if o["kind"] == "HelmRelease"
        and f"{o['metadata']['namespace']}/{o['metadata']['name']}" == key
    ]
    return found


def document(report: dict[str, Any]) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(report["data"]["budget.json"])
    return parsed


def config_map(namespace: str, data: dict[str, str], **metadata: Any) -> dict[str, Any]:
    """A ConfigMap gpu-budget as Metacontroller sends one, attached or related."""
    meta = {"name": "gpu-budget", "namespace": namespace, **metadata}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def test_each_gpu_budget_pool_gets_a_report_of_its_own_figures(metered_client: FlaskClient) -> None:
    found = reports(metered_client, requests())
    assert sorted(found) == ["tenant-acme", "tenant-acme-lab", "tenant-legacy"]
    acme = found["tenant-acme"]
    assert (acme["apiVersion"], acme["kind"], acme["metadata"]) == (
        "v1",
        "ConfigMap",
        {
            "name": "gpu-budget",
            "namespace": "tenant-acme",
            "labels": {"gpuclass.cozystack.io/budget-report": "true"},
        },
    )
    assert document(acme)["keys"] == [
        {"key": TOTAL, "budget": 4, "carvedOut": 1, "reserved": 3, "left": 0},
        {"key": L40S_KEY, "budget": 2, "carvedOut": 0, "reserved": 2, "left": 0},
    ]
    assert [(a["namespace"], a["name"], a["reserves"]) for a in document(acme)["apps"]] == [
        ("tenant-acme", "render", {TOTAL: 2, L40S_KEY: 2}),
        ("tenant-acme-team", "workers", {TOTAL: 1}),
    ]
    assert acme["data"]["budget.txt"].splitlines()[:3] == [
        "KEY                                     BUDGET  CARVED OUT  RESERVED  LEFT",
        "gpuclass.cozystack.io/devices           4       1           3         0",
        "l40s-24q.gpuclass.cozystack.io/devices  2       0           2         0",
    ]


def test_a_report_holds_no_other_tenants_data(metered_client: FlaskClient) -> None:
    """The sub-tenant lab sees its own pool: none of acme's apps, nor acme's figures."""
    lab = reports(metered_client, requests())["tenant-acme-lab"]
    assert document(lab) == {
        "tenant": "lab",
        "namespace": "tenant-acme-lab",
        "keys": [
            {"key": TOTAL, "budget": 1, "carvedOut": 0, "reserved": 0, "left": 1},
            {"key": L40S_KEY, "budget": 0, "carvedOut": 0, "reserved": 0, "left": 0},
        ],
        "apps": [],
        "unclassed": [],
        "unreadable": None,
    }
    assert "render" not in json.dumps(lab) and "acme/" not in json.dumps(lab)


def test_a_pool_whose_figures_cannot_be_known_says_why_and_gives_none(
    metered_client: FlaskClient,
) -> None:
    legacy = reports(metered_client, requests())["tenant-legacy"]
    assert document(legacy)["keys"] == [] and document(legacy)["unreadable"].startswith(
        "HelmRelease tenant-legacy/vm-instance-old: spec.values.gpus"
    )
    assert legacy["data"]["budget.txt"].startswith("the figures of this pool cannot be known: ")


def test_a_gpu_budget_not_its_own_is_never_written_over(metered_client: FlaskClient) -> None:
    """A labelled `gpu-budget` the target did not attach (an earlier version's, owned by its
    namespace, or a tenant's) is left out until it is gone; its other pools are reported. An
    unlabelled one the target does not see: Metacontroller's create of it fails as already there,
    and it writes over no object it does not own."""
    body = requests()["tenant-acme"]
    not_ours = config_map("tenant-acme-lab", {"notes": "mine"}, uid="theirs", labels=REPORT_LABELS)
    body["related"][CONFIGMAPS]["tenant-acme-lab/gpu-budget"] = not_ours
    assert [a["metadata"]["namespace"] for a in answered(metered_client, body)] == ["tenant-acme"]


def test_a_report_asked_for_and_not_attached_is_counted_in_its_log_line(
    metered_client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A first report, or one an unlabelled `gpu-budget` of a tenant's stands in the way of
    (Metacontroller's create finds it there and skips it): the count that stays above zero sync
    after sync is the hoster's sign of it."""
    body = requests()["tenant-acme"]

    def unattached() -> int:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
            answered(metered_client, body)
        [call] = [r.fields for r in caplog.records if r.getMessage() == "hook call"]  # type: ignore[attr-defined]
        count: int = call["unattached"]
        return count

    assert unattached() == 2
    first = {a["metadata"]["namespace"]: a for a in answered(metered_client, body)}
    body["attachments"][CONFIGMAPS] = {"tenant-acme/gpu-budget": first["tenant-acme"]}
    assert unattached() == 1  # the lab's, whose own `gpu-budget` Metacontroller keeps finding
    body["attachments"][CONFIGMAPS]["tenant-acme-lab/gpu-budget"] = first["tenant-acme-lab"]
    assert unattached() == 0


def test_the_reports_own_configmap_is_rewritten_with_the_current_figures(
    metered_client: FlaskClient,
) -> None:
    body = requests()["tenant-acme"]
    ours = config_map(
        "tenant-acme",
        {"budget.json": "{}", "budget.txt": "old"},
        annotations={"metacontroller.k8s.io/decorator-controller": "gpuclass-budget-pools"},
        labels=REPORT_LABELS,
    )
    body["attachments"][CONFIGMAPS] = {"tenant-acme/gpu-budget": ours}
    body["related"][CONFIGMAPS]["tenant-acme/gpu-budget"] = ours
    acme = {a["metadata"]["namespace"]: a for a in answered(metered_client, body)}["tenant-acme"]
    assert document(acme)["keys"][0]["reserved"] == 3


def test_a_namespace_below_a_top_level_one_relates_nothing_and_drops_its_old_report(
    metered_client: FlaskClient,
) -> None:
    """Its pool is its top-level namespace's to report: what it attached in earlier versions
    (its own report) goes."""
    assert budget_report.customize("tenant-acme-lab", "cozy-gpu").related_resources == []
    body = requests()["tenant-acme-lab"]
    assert body["related"] == {CONFIGMAPS: body["related"][CONFIGMAPS]}
    old = config_map("tenant-acme-lab", {"budget.txt": "old"}, labels=REPORT_LABELS)
    body["attachments"][CONFIGMAPS] = {"tenant-acme-lab/gpu-budget": old}
    assert answered(metered_client, body) == []


# A namespace being deleted, as its phase or its deletion timestamp says.
being_deleted = pytest.mark.parametrize(
    "terminating",
    [
        {"status": {"phase": "Terminating"}},
        {"metadata": {"deletionTimestamp": "2026-12-04T00:00:00Z"}},
    ],
    ids=["phase", "deletion-timestamp"],
)


def terminated(namespace: dict[str, Any], terminating: dict[str, Any]) -> dict[str, Any]:
    return {
        **namespace,
        **terminating,
        "metadata": {**namespace["metadata"], **terminating.get("metadata", {})},
    }


@being_deleted
def test_a_report_goes_only_where_its_namespace_is_not_terminating(
    metered_client: FlaskClient, terminating: dict[str, Any]
) -> None:
    """A namespace being deleted takes no new object: a ConfigMap there would fail the sync."""
    body = requests()["tenant-acme"]
    body["object"] = terminated(body["object"], terminating)
    assert answered(metered_client, body) == []


@being_deleted
def test_no_report_goes_into_a_terminating_namespace_at_any_depth(
    metered_client: FlaskClient, terminating: dict[str, Any]
) -> None:
    """The top-level target writes its subtree's reports: a sub-tenant's namespace being deleted
    gets none (the sync would fail on it), the others theirs, and its figures stay in the
    metrics."""
    body = requests()["tenant-acme"]
    lab = body["related"][NAMESPACES]["tenant-acme-lab"]
    body["related"][NAMESPACES]["tenant-acme-lab"] = terminated(lab, terminating)
    assert [r["metadata"]["namespace"] for r in answered(metered_client, body)] == ["tenant-acme"]
    outcome = budget_report.sync(
        decode_report_sync(json.dumps(body).encode()), "cozystack-values", "cozy-gpu"
    )
    assert {p.namespace for p in outcome.pools or ()} == {"tenant-acme", "tenant-acme-lab"}
    assert outcome.counts["unwritable"] == 1


def test_the_class_index_is_read_from_the_releases_namespace_alone(settings: Settings) -> None:
    """A ConfigMap of the index's name planted in a member namespace with the report's label
    (which the pools relate) is not the index, even where it sorts first (Metacontroller sends
    each group as a map sorted by `namespace/name`): the figures stay the real index's."""
    installed = settings.model_copy(update={"budget_classes_namespace": "zz-gpu"})
    metered_client = create_app(installed, metrics=Metrics(180.0)).test_client()
    body = requests()["tenant-acme"]
    [(key, index)] = body["related"][CONFIGMAPS].items()
    index = {**index, "metadata": {**index["metadata"], "namespace": "zz-gpu"}}
    body["related"][CONFIGMAPS] = {"zz-gpu/gpuclass-budget-classes": index}
    real = answered(metered_client, json.loads(json.dumps(body)))
    assert real and key.endswith("/gpuclass-budget-classes")
    planted_index = {"classes": [], "undecodable": []}  # every device of no class
    planted = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "gpuclass-budget-classes",
            "namespace": "tenant-acme",
            "labels": REPORT_LABELS,
        },
        "data": {"classes.json": json.dumps(planted_index)},
    }
    body["related"][CONFIGMAPS]["tenant-acme/gpuclass-budget-classes"] = planted
    assert answered(metered_client, body) == real


def test_a_release_without_the_application_name_label_is_listed_by_its_release_name(
    metered_client: FlaskClient,
) -> None:
    items = tenancy_items()
    del release(items, "tenant-acme/vm-instance-render")["metadata"]["labels"][
        "apps.cozystack.io/application.name"
    ]
    acme = document(reports(metered_client, requests(items))["tenant-acme"])
    assert [(a["kind"], a["name"]) for a in acme["apps"]] == [
        ("VMInstance", "vm-instance-render"),
        ("KubernetesNodes", "workers"),
    ]


def test_a_bounded_tenant_whose_namespace_is_not_made_yet_has_its_series(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    """One series per bounded tenant and key, whether or not its namespace exists yet (the
    tenant chart makes it after its release): its figures, and no report to write there."""
    items = [
        o
        for o in tenancy_items()
        if not (o["kind"] == "Namespace" and o["metadata"]["name"] == "tenant-acme-lab")
    ]
    bodies = {
        name: body
        for name, body in requests(items).items()
        if name != "tenant-acme-lab"  # no namespace, no target
    }
    for body in bodies.values():
        body["related"].get(NAMESPACES, {}).pop("tenant-acme-lab", None)
    assert "tenant-acme-lab" not in reports(metered_client, bodies)
    left = series(metrics, "cozystack_gpu_budget_left_units")
    assert left[(f'key="{TOTAL}"', 'namespace="tenant-acme-lab"', 'tenant="lab"')] == 1.0


def test_a_tenant_no_longer_bounded_loses_its_report(metered_client: FlaskClient) -> None:
    items = tenancy_items()
    release(items, "tenant-acme/tenant-lab")["spec"]["values"] = {}
    assert "tenant-acme-lab" not in reports(metered_client, requests(items))


@pytest.mark.parametrize("group", [HELMRELEASES, CONFIGMAPS, NAMESPACES])
def test_while_the_related_groups_cannot_be_trusted_the_report_is_kept_as_it_is(
    metered_client: FlaskClient, group: str
) -> None:
    body = requests()["tenant-acme"]
    kept = config_map(
        "tenant-acme", {"budget.json": "{}", "budget.txt": "as it was"}, resourceVersion="9"
    )
    body["attachments"][CONFIGMAPS] = {"tenant-acme/gpu-budget": kept}
    del body["related"][group]
    response = metered_client.post(SYNC, json=body).get_json()
    assert response["resyncAfterSeconds"] == 10.0
    assert response["attachments"] == [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "gpu-budget",
                "namespace": "tenant-acme",
                "labels": {"gpuclass.cozystack.io/budget-report": "true"},
            },
            "data": {"budget.json": "{}", "budget.txt": "as it was"},
        }
    ]


def index_of(metered_client: FlaskClient, classes: dict[str, Any]) -> dict[str, Any]:
    """The class index the index's sync writes for these GPUClasses, as Metacontroller sends it
    to the pools."""
    body = json.loads(example_of("/budget-report/sync"))
    body["related"][GPUCLASSES] = classes
    answer = metered_client.post("/budget-report/sync", json=body)
    assert answer.status_code == 200, answer.get_data()
    [index] = answer.get_json()["attachments"]
    assert set(answer.get_json()) == {"attachments", "status"}
    index: dict[str, Any]
    return index


def with_index(bodies: dict[str, dict[str, Any]], index: dict[str, Any]) -> None:
    key = f"{index['metadata']['namespace']}/{index['metadata']['name']}"
    for body in bodies.values():
        body["related"][CONFIGMAPS] = {key: index}


def example_classes() -> dict[str, Any]:
    classes: dict[str, Any] = json.loads(example_of("/budget-report/sync"))["related"][GPUCLASSES]
    return classes


def test_a_gpuclass_that_does_not_decode_leaves_every_pool_without_figures(
    metered_client: FlaskClient,
) -> None:
    """A device of that class maps to no key, so every figure could be short: the index names
    it, and every pool reading the index says so."""
    bodies = requests()
    with_index(bodies, index_of(metered_client, {**example_classes(), "broken": {"metadata": []}}))
    found = reports(metered_client, bodies)
    assert sorted(found) == ["tenant-acme", "tenant-acme-lab", "tenant-legacy"]
    assert all(document(r)["keys"] == [] for r in found.values())
    assert {document(r)["unreadable"] for r in found.values()} == {
        "GPUClass broken: does not decode"
    }


def test_the_class_index_holds_each_classs_identity_in_the_releases_namespace(
    metered_client: FlaskClient, settings: Settings
) -> None:
    index = index_of(metered_client, example_classes())
    assert index["metadata"] == {
        "name": "gpuclass-budget-classes",
        "namespace": settings.budget_classes_namespace,
        "labels": {},
    }
    assert json.loads(index["data"]["classes.json"]) == {
        "classes": [
            {
                "name": "h100",
                "created": "2026-01-02T00:00:00Z",
                "deleting": False,
                "resourceName": "nvidia.com/GH100_H100_PCIE",
            },
            {
                "name": "l40s-24q",
                "created": "2026-01-01T00:00:00Z",
                "deleting": False,
                "resourceName": L40S,
            },
        ],
        "undecodable": [],
        "instanceTypes": {"l40s.2xlarge": [L40S]},
        "undecodableInstanceTypes": {},
    }


def test_a_class_status_write_leaves_the_class_index_as_it_is(metered_client: FlaskClient) -> None:
    """A class's status changes with every pod on its nodes: were the index to change with it,
    each write would re-sync every pool's report."""
    classes = example_classes()
    before = index_of(metered_client, classes)
    for gpuclass in classes.values():
        gpuclass["status"] = {"free": 7, "observedGeneration": 3, "conditions": []}
        gpuclass["metadata"]["resourceVersion"] = "999"
    assert index_of(metered_client, classes) == before


def test_the_pools_read_the_class_index_not_the_gpuclasses(metered_client: FlaskClient) -> None:
    """What a report says of a class comes from the index: a class the index does not know
    leaves its devices unclassed, counted under the total key."""
    bodies = requests()
    with_index(bodies, index_of(metered_client, {}))
    acme = reports(metered_client, bodies)["tenant-acme"]
    assert document(acme)["unclassed"] == [
        {"resource": "nvidia.com/GH100_H100_PCIE", "devices": 1},
        {"resource": L40S, "devices": 2},
    ]


def test_without_the_class_index_a_pool_keeps_its_report_as_it_is(
    metered_client: FlaskClient,
) -> None:
    """Before the index is first written (an install, an upgrade): writing it re-syncs every
    pool, so nothing waits on a retry."""
    body = requests()["tenant-acme"]
    kept = config_map("tenant-acme", {"budget.json": "{}", "budget.txt": "as it was"})
    body["attachments"][CONFIGMAPS] = {"tenant-acme/gpu-budget": kept}
    body["related"][CONFIGMAPS] = {"tenant-acme/gpu-budget": kept}
    answer = metered_client.post(SYNC, json=body).get_json()
    assert answer == {
        "attachments": [{**kept, "metadata": {**kept["metadata"], "labels": REPORT_LABELS}}],
        "status": None,
    }


def test_an_unreadable_class_index_keeps_the_report_and_is_logged(
    metered_client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    bodies = requests()
    index = index_of(metered_client, example_classes())
    index["data"]["classes.json"] = "{not json"
    with_index(bodies, index)
    assert answered(metered_client, bodies["tenant-acme"]) == []
    skipped = [
        getattr(r, "fields", {}).get("objects")
        for r in caplog.records
        if r.getMessage() == "skipped unreadable objects"
    ]
    assert skipped == [["ConfigMap gpuclass-budget-classes: classes.json does not decode"]]


@pytest.mark.parametrize(
    "target",
    [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "a"},
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {}},
        None,
    ],
    ids=["another-kind", "no-name", "missing"],
)
def test_a_target_that_is_not_a_named_namespace_is_a_400(
    metered_client: FlaskClient, target: Any
) -> None:
    body = requests()["tenant-acme"]
    body["object"] = target
    customize = {"parent": target}
    for route, sent in ((SYNC, body), ("/budget-pools/customize", customize)):
        response = metered_client.post(route, json=sent)
        assert response.status_code == 400 and set(response.get_json()) == {"error"}


def test_a_namespace_no_tenant_could_own_relates_nothing_and_gets_no_report(
    metered_client: FlaskClient,
) -> None:
    parent = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}}
    customize = metered_client.post("/budget-pools/customize", json={"parent": parent}).get_json()
    assert customize == {"relatedResources": []}
    body = {"object": parent, "attachments": {CONFIGMAPS: {}}, "related": {}}
    assert metered_client.post(SYNC, json=body).get_json() == {"attachments": [], "status": None}


KINDS = LabelSelector(
    match_expressions=[
        Requirement(
            "apps.cozystack.io/application.kind",
            "In",
            ["Tenant", "VMInstance", "KubernetesNodes", "Kubernetes"],
        )
    ]
)


def claimed_by(name: str) -> LabelSelector:
    return LabelSelector(
        match_labels={
            "apps.cozystack.io/application.kind": "Tenant",
            "apps.cozystack.io/application.name": name,
        }
    )


def shapes(namespace: str) -> list[tuple[Any, ...]]:
    rules = budget_report.customize(namespace, "cozy-gpu").related_resources
    return [
        (r.resource, r.namespace, r.names, r.label_selector, r.namespace_selector) for r in rules
    ]


def test_a_top_level_namespaces_rules_select_its_claimants_subtree_class_index_and_reports() -> (
    None
):
    """By the namespace's name alone: Metacontroller caches the answer per generation, which a
    label change does not bump."""
    subtree = LabelSelector(
        match_labels={"gpuclass.cozystack.io/top-level-namespace": "tenant-acme"}
    )
    assert shapes("tenant-acme") == [
        ("helmreleases", "tenant-root", None, claimed_by("acme"), None),
        ("helmreleases", "tenant-root", ["tenant-acme"], None, None),
        ("helmreleases", None, None, KINDS, subtree),
        ("namespaces", None, None, subtree, None),
        ("configmaps", "cozy-gpu", ["gpuclass-budget-classes"], None, None),
        ("configmaps", None, None, LabelSelector(match_labels=REPORT_LABELS), subtree),
    ]


def test_the_roots_rules_select_the_whole_tenancy_only_through_the_roots_pool_label() -> None:
    in_root_pool = LabelSelector(match_labels={"gpuclass.cozystack.io/pool-level-0": "tenant-root"})
    assert shapes("tenant-root") == [
        ("helmreleases", "tenant-root", None, claimed_by("root"), None),
        ("helmreleases", "tenant-root", ["tenant-root"], None, None),
        ("helmreleases", None, None, KINDS, in_root_pool),
        ("namespaces", None, None, in_root_pool, None),
        ("configmaps", "cozy-gpu", ["gpuclass-budget-classes"], None, None),
        ("configmaps", "tenant-root", ["gpu-budget"], None, None),
    ]


def test_the_class_index_replaces_the_reports_of_earlier_versions(
    metered_client: FlaskClient,
) -> None:
    """The one-target report of earlier versions was attached to the release's ClusterRole too:
    the index's sync attaches the index alone, so Metacontroller deletes those reports, which the
    pool reports cannot write over."""
    body = json.loads(example_of("/budget-report/sync"))
    assert body["attachments"][CONFIGMAPS]
    answer = metered_client.post("/budget-report/sync", json=body).get_json()
    assert [a["metadata"]["name"] for a in answer["attachments"]] == ["gpuclass-budget-classes"]


def test_the_class_index_without_its_classes_attaches_nothing_and_asks_again(
    metered_client: FlaskClient,
) -> None:
    body = json.loads(example_of("/budget-report/sync"))
    del body["related"][GPUCLASSES]
    answer = metered_client.post("/budget-report/sync", json=body).get_json()
    assert answer == {"attachments": [], "status": None, "resyncAfterSeconds": 10.0}


@pytest.mark.parametrize("route", ["/budget-report/sync", "/budget-report/customize"])
def test_the_class_index_takes_the_releases_cluster_role_alone(
    metered_client: FlaskClient, route: str
) -> None:
    body = json.loads(example_of(route))
    key = "object" if "object" in body else "parent"
    body[key] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}
    assert metered_client.post(route, json=body).status_code == 400


def test_the_class_index_relates_the_gpuclasses_and_the_cluster_instance_types_alone(
    metered_client: FlaskClient,
) -> None:
    answer = metered_client.post(
        "/budget-report/customize", data=example_of("/budget-report/customize")
    )
    assert answer.get_json() == {
        "relatedResources": [
            {"apiVersion": "cozystack.io/v1alpha1", "resource": "gpuclasses"},
            {
                "apiVersion": "instancetype.kubevirt.io/v1beta1",
                "resource": "virtualmachineclusterinstancetypes",
            },
        ]
    }


def series(metrics: Metrics, family: str) -> dict[tuple[str, ...], float]:
    found = {}
    for line in metrics.exposition()[0].decode().splitlines():
        if line.startswith(family + "{"):
            labels, value = line[len(family) + 1 :].rsplit("} ", 1)
            found[tuple(sorted(labels.split(",")))] = float(value)
    return found


def test_the_metrics_hold_one_series_per_bounded_tenant_and_key(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    reports(metered_client, requests())
    left = series(metrics, "cozystack_gpu_budget_left_units")
    assert left == {
        (f'key="{TOTAL}"', 'namespace="tenant-acme"', 'tenant="acme"'): 0.0,
        (f'key="{L40S_KEY}"', 'namespace="tenant-acme"', 'tenant="acme"'): 0.0,
        (f'key="{TOTAL}"', 'namespace="tenant-acme-lab"', 'tenant="lab"'): 1.0,
        (f'key="{L40S_KEY}"', 'namespace="tenant-acme-lab"', 'tenant="lab"'): 0.0,
    }
    assert series(metrics, "cozystack_gpu_budget_pool_unreadable") == {
        ('namespace="tenant-legacy"', 'tenant="legacy"'): 1.0
    }
    items = tenancy_items()
    release(items, "tenant-acme/tenant-lab")["spec"]["values"] = {}
    reports(metered_client, requests(items))  # a namespace whose report finds no pool: gone at once
    assert not any("tenant-acme-lab" in k for k in series(metrics, "cozystack_gpu_budget_units"))


def test_a_pool_over_its_budget_shows_below_zero(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    items = tenancy_items()
    quotas = release(items, "tenant-root/tenant-acme")["spec"]["values"]
    quotas["resourceQuotas"][TOTAL] = "2"  # lowered by the operator under what is held
    reports(metered_client, requests(items))
    left = series(metrics, "cozystack_gpu_budget_left_units")
    assert left[(f'key="{TOTAL}"', 'namespace="tenant-acme"', 'tenant="acme"')] == -2.0


def test_the_report_series_go_three_report_resyncs_after_the_last_report(
    settings: Settings,
) -> None:
    """As the served metrics are made (`settings_metrics`): the report's own resync period, not
    the status's."""
    now = [1000.0]
    resyncs = settings.model_copy(update={"budget_report_resync_seconds": 20.0})
    metrics = settings_metrics(resyncs, clock=lambda: now[0])
    create_app(settings, metrics=metrics).test_client().post(SYNC, data=example_of(SYNC))
    assert series(metrics, "cozystack_gpu_budget_units")
    now[0] += 30.0
    body = requests()["tenant-legacy"]  # another subtree's reports keep none but theirs alive
    create_app(settings, metrics=metrics).test_client().post(SYNC, json=body)
    now[0] += 29.0
    assert {k[1] for k in series(metrics, "cozystack_gpu_budget_units")} == {
        'namespace="tenant-acme"',
        'namespace="tenant-acme-lab"',
    }
    now[0] += 2.0
    assert series(metrics, "cozystack_gpu_budget_units") == {}


# --- against the invariant model ----------------------------------------------------------------


def items_of(cluster: Cluster) -> list[dict[str, Any]]:
    """A model cluster's releases and classes, as the API server holds them."""
    releases = [
        helmrelease("Tenant", r, n, {"resourceQuotas": {k: str(v) for k, v in q.items()}})
        if q
        else helmrelease("Tenant", r, n, {})
        for (r, n), q in cluster.tenants.items()
    ]
    releases += [
        helmrelease(kind, namespace, name, spec)
        for (namespace, kind, name), spec in cluster.apps.items()
    ]
    instance_types = [json.loads(bytes(t)) for t in instance_type_objects(INSTANCE_TYPES)]
    return [*releases, *CLASS_OBJECTS, *instance_types]


def model_figures(cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    """Each GPU budget pool's keys as budget.json writes them, from the model alone."""
    figures: dict[str, list[dict[str, Any]]] = {}
    for namespace, declared in cluster.declarations().items():
        for key in sorted(k for k in BUDGET_KEYS if k in declared):
            carve = carved(cluster, namespace, key)
            reserved = cluster.held(namespace, key) - carve
            left = declared[key] - carve - reserved
            use = {"key": key, "budget": declared[key], "carvedOut": carve, "reserved": reserved}
            figures.setdefault(namespace, []).append({**use, "left": left})
    return figures


@hypothesis_settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(cluster=grown_then_lowered())
def test_the_reports_the_metrics_and_plan_give_the_models_figures(
    settings: Settings, tmp_path: Path, cluster: Cluster
) -> None:
    """On trees grown by admitted operations and pushed over budget: the ConfigMaps written,
    the series exported and what plan prints on the same releases."""
    metrics = Metrics(180.0, clock=lambda: 1000.0)
    items = items_of(cluster)
    written = reports(create_app(settings, metrics=metrics).test_client(), requests(items))
    model = model_figures(cluster)
    assert {namespace: document(r)["keys"] for namespace, r in written.items()} == model
    exported = series(metrics, "cozystack_gpu_budget_left_units")
    assert sorted(exported.values()) == sorted(k["left"] for keys in model.values() for k in keys)
    dump = tmp_path / f"releases-{len(list(tmp_path.iterdir()))}.json"
    dump.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    planned = run_plan(str(dump), "-o", "json")
    assert planned.returncode == 0, planned.stderr
    assert {d["namespace"]: d["keys"] for d in json.loads(planned.stdout)["budgets"]} == model


def test_devices_no_class_names_are_listed_apart_and_count_under_the_total_key(
    metered_client: FlaskClient,
) -> None:
    """A class deleted while a VM holds its devices: the devices stay in the pool's total, listed
    by the resource they were reserved under (docs/gpu-budgets.md, "Classes change")."""
    items = [o for o in tenancy_items() if o["metadata"]["name"] != "l40s-24q"]
    report = reports(metered_client, requests(items))["tenant-acme"]
    acme = document(report)
    [total] = [use for use in acme["keys"] if use["key"] == TOTAL]
    assert total["reserved"] == 3
    assert acme["unclassed"] == [{"resource": L40S, "devices": 2}]
    table = report["data"]["budget.txt"]
    assert f"devices no GPUClass names, counted under {TOTAL}: {L40S} 2" in table
