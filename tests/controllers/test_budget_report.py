"""The budget report's hooks through HTTP (Flask's test client), with Metacontroller-shaped
requests: one ConfigMap `gpu-budget` per GPU budget pool, holding its own figures only, never
written over a tenant's own, kept while the request cannot be trusted; and its metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings

from hooks.serving.app import create_app
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from tests.builders import example_of, helmrelease
from tests.cli.test_plan import run_plan
from tests.profiles import examples
from tests.rules.budget.test_invariant import BUDGET_KEYS, CLASSES, Cluster, app_body, own_namespace
from tests.rules.budget.test_usage import carved, grown_then_lowered

SYNC = "/budget-report/sync"
HELMRELEASES = "HelmRelease.helm.toolkit.fluxcd.io/v2"
CONFIGMAPS = "ConfigMap.v1"
NAMESPACES = "Namespace.v1"
TOTAL = "gpuclass.cozystack.io/devices"
L40S_KEY = "l40s-24q.gpuclass.cozystack.io/devices"
L40S = "nvidia.com/NVIDIA_L40S-24Q"
GPUCLASSES = "GPUClass.cozystack.io/v1alpha1"


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(180.0, clock=lambda: 1000.0)


@pytest.fixture
def client(settings: Settings, metrics: Metrics) -> FlaskClient:
    return create_app(settings, metrics=metrics).test_client()


def example() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(example_of(SYNC))
    return body


def reports(client: FlaskClient, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    response = client.post(SYNC, json=body)
    assert response.status_code == 200, response.get_data()
    answer = response.get_json()
    assert set(answer) == {"attachments", "status"} and answer["status"] is None
    return {a["metadata"]["namespace"]: a for a in answer["attachments"]}


def document(report: dict[str, Any]) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(report["data"]["budget.json"])
    return parsed


def config_map(namespace: str, data: dict[str, str], **metadata: Any) -> dict[str, Any]:
    """A ConfigMap gpu-budget as Metacontroller sends one, attached or related."""
    meta = {"name": "gpu-budget", "namespace": namespace, **metadata}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def test_each_gpu_budget_pool_gets_a_report_of_its_own_figures(client: FlaskClient) -> None:
    found = reports(client, example())
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


def test_a_report_holds_no_other_tenants_data(client: FlaskClient) -> None:
    """The sub-tenant lab sees its own pool: none of acme's apps, nor acme's figures."""
    lab = reports(client, example())["tenant-acme-lab"]
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


def test_a_pool_whose_figures_cannot_be_known_says_why_and_gives_none(client: FlaskClient) -> None:
    legacy = reports(client, example())["tenant-legacy"]
    assert document(legacy)["keys"] == [] and document(legacy)["unreadable"].startswith(
        "HelmRelease tenant-legacy/vm-instance-old: spec.values.gpus"
    )
    assert legacy["data"]["budget.txt"].startswith("the figures of this pool cannot be known: ")


def test_a_tenants_own_configmap_of_that_name_is_never_written_over(client: FlaskClient) -> None:
    body = example()
    tenants_own = config_map("tenant-acme", {"notes": "mine"}, uid="theirs")
    body["related"][CONFIGMAPS] = {"tenant-acme/gpu-budget": tenants_own}
    assert "tenant-acme" not in reports(client, body)


def test_the_reports_own_configmap_is_rewritten_with_the_current_figures(
    client: FlaskClient,
) -> None:
    body = example()
    ours = config_map(
        "tenant-acme",
        {"budget.json": "{}", "budget.txt": "old"},
        annotations={"metacontroller.k8s.io/decorator-controller": "gpuclass-budget-report"},
    )
    body["attachments"][CONFIGMAPS] = {"tenant-acme/gpu-budget": ours}
    body["related"][CONFIGMAPS] = {"tenant-acme/gpu-budget": ours}
    assert document(reports(client, body)["tenant-acme"])["keys"][0]["reserved"] == 3


@pytest.mark.parametrize("state", ["missing", "terminating"])
def test_a_report_goes_only_where_its_namespace_exists_and_is_not_terminating(
    client: FlaskClient, state: str
) -> None:
    """A tenant's namespace is made a moment after its release, and goes before it: a ConfigMap
    there would fail the whole sync, every other pool's report with it."""
    body = example()
    if state == "missing":
        del body["related"][NAMESPACES]["tenant-acme-lab"]
    else:
        body["related"][NAMESPACES]["tenant-acme-lab"]["status"] = {"phase": "Terminating"}
    assert sorted(reports(client, body)) == ["tenant-acme", "tenant-legacy"]


def test_a_tenant_no_longer_bounded_loses_its_report(client: FlaskClient) -> None:
    body = example()
    releases = body["related"][HELMRELEASES]
    releases["tenant-acme/tenant-lab"]["spec"]["values"] = {}
    assert "tenant-acme-lab" not in reports(client, body)


@pytest.mark.parametrize("state", ["releases", "namespaces"])
def test_while_the_related_groups_cannot_be_trusted_the_reports_are_kept_as_they_are(
    client: FlaskClient, state: str
) -> None:
    body = example()
    kept = config_map(
        "tenant-acme", {"budget.json": "{}", "budget.txt": "as it was"}, resourceVersion="9"
    )
    body["attachments"][CONFIGMAPS] = {"tenant-acme/gpu-budget": kept}
    del body["related"][HELMRELEASES if state == "releases" else NAMESPACES]
    response = client.post(SYNC, json=body).get_json()
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


def test_a_gpuclass_that_does_not_decode_leaves_every_pool_without_figures(
    client: FlaskClient,
) -> None:
    """A device of that class maps to no key, so every figure could be short."""
    body = example()
    body["related"]["GPUClass.cozystack.io/v1alpha1"]["broken"] = {"metadata": []}
    found = reports(client, body)
    assert all(document(r)["keys"] == [] for r in found.values())
    assert {document(r)["unreadable"] for r in found.values()} == {
        "GPUClass broken: does not decode"
    }


@pytest.mark.parametrize(
    "target",
    [
        {"apiVersion": "cozystack.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "a"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {}},
        None,
    ],
    ids=["another-kind", "no-name", "missing"],
)
def test_a_target_that_is_not_a_named_cluster_role_is_a_400(
    client: FlaskClient, target: Any
) -> None:
    body = example()
    body["object"] = target
    customize = {"parent": target}
    for route, sent in ((SYNC, body), ("/budget-report/customize", customize)):
        response = client.post(route, json=sent)
        assert response.status_code == 400 and set(response.get_json()) == {"error"}


def series(metrics: Metrics, family: str) -> dict[tuple[str, ...], float]:
    found = {}
    for line in metrics.exposition()[0].decode().splitlines():
        if line.startswith(family + "{"):
            labels, value = line[len(family) + 1 :].rsplit("} ", 1)
            found[tuple(sorted(labels.split(",")))] = float(value)
    return found


def test_the_metrics_hold_one_series_per_bounded_tenant_and_key(
    client: FlaskClient, metrics: Metrics
) -> None:
    reports(client, example())
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
    body = example()
    body["related"][HELMRELEASES]["tenant-acme/tenant-lab"]["spec"]["values"] = {}
    reports(client, body)  # a pool left out of the report is gone at once
    assert not any("tenant-acme-lab" in k for k in series(metrics, "cozystack_gpu_budget_units"))


def test_a_pool_over_its_budget_shows_below_zero(client: FlaskClient, metrics: Metrics) -> None:
    body = example()
    quotas = body["related"][HELMRELEASES]["tenant-root/tenant-acme"]["spec"]["values"]
    quotas["resourceQuotas"][TOTAL] = "2"  # lowered by the operator under what is held
    reports(client, body)
    left = series(metrics, "cozystack_gpu_budget_left_units")
    assert left[(f'key="{TOTAL}"', 'namespace="tenant-acme"', 'tenant="acme"')] == -2.0


def test_the_report_series_go_three_status_resyncs_after_the_last_report(
    settings: Settings,
) -> None:
    now = [1000.0]
    metrics = Metrics(180.0, clock=lambda: now[0])
    create_app(settings, metrics=metrics).test_client().post(SYNC, data=example_of(SYNC))
    now[0] += 179.0
    assert series(metrics, "cozystack_gpu_budget_units")
    now[0] += 2.0
    assert series(metrics, "cozystack_gpu_budget_units") == {}


# --- against the invariant model ----------------------------------------------------------------

CLASS_GROUP = "GPUClass.cozystack.io/v1alpha1"


def request_of(cluster: Cluster) -> dict[str, Any]:
    """The report's sync request for a model cluster, as Metacontroller would send it."""
    releases = [
        helmrelease("Tenant", r, n, {"resourceQuotas": {k: str(v) for k, v in q.items()}})
        if q
        else helmrelease("Tenant", r, n, {})
        for (r, n), q in cluster.tenants.items()
    ]
    releases += [
        helmrelease(kind, namespace, name, app_body(gpus, most))
        for (namespace, kind, name), (gpus, most) in cluster.apps.items()
    ]
    classes = {
        c.name: {
            "apiVersion": "cozystack.io/v1alpha1",
            "kind": "GPUClass",
            "metadata": {"name": c.name, "creationTimestamp": c.created},
            "spec": {"resourceName": c.resource_name},
        }
        for c in CLASSES
    }
    body = example()
    keyed = {f"{r['metadata']['namespace']}/{r['metadata']['name']}": r for r in releases}
    owned = sorted({own_namespace(r, n) for r, n in cluster.tenants})
    namespaces = {
        n: {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in owned
    }
    body["related"] = {
        HELMRELEASES: keyed,
        CLASS_GROUP: classes,
        CONFIGMAPS: {},
        NAMESPACES: namespaces,
    }
    return body


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
    body = request_of(cluster)
    written = reports(create_app(settings, metrics=metrics).test_client(), body)
    model = model_figures(cluster)
    assert {namespace: document(r)["keys"] for namespace, r in written.items()} == model
    exported = series(metrics, "cozystack_gpu_budget_left_units")
    assert sorted(exported.values()) == sorted(k["left"] for keys in model.values() for k in keys)
    dump = tmp_path / f"releases-{len(list(tmp_path.iterdir()))}.json"
    items = [*body["related"][HELMRELEASES].values(), *body["related"][CLASS_GROUP].values()]
    dump.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    planned = run_plan(str(dump), "-o", "json")
    assert planned.returncode == 0, planned.stderr
    assert {d["namespace"]: d["keys"] for d in json.loads(planned.stdout)["budgets"]} == model


def test_devices_no_class_names_are_listed_apart_and_count_under_the_total_key(
    client: FlaskClient,
) -> None:
    """A class deleted while a VM holds its devices: the devices stay in the pool's total, listed
    by the resource they were reserved under (docs/gpu-budgets.md, "Classes change")."""
    body = example()
    classes = body["related"][GPUCLASSES]
    body["related"][GPUCLASSES] = {k: v for k, v in classes.items() if k != "l40s-24q"}
    acme = document(reports(client, body)["tenant-acme"])
    [total] = [use for use in acme["keys"] if use["key"] == TOTAL]
    assert total["reserved"] == 3
    assert acme["unclassed"] == [{"resource": L40S, "devices": 2}]
    table = reports(client, body)["tenant-acme"]["data"]["budget.txt"]
    assert f"devices no GPUClass names, counted under {TOTAL}: {L40S} 2" in table
