"""The tenant namespace labeller's hooks through HTTP (Flask's test client), with
Metacontroller-shaped requests (docs/gpu-budgets.md, "Reading a budget"): each tenant namespace
labelled with the bounded tenants above it, by depth; any other namespace left alone."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from hooks.cli import offline
from hooks.controllers import tenant_namespaces
from hooks.serving.app import create_app
from hooks.settings import Settings
from tests.builders import example_of, helmrelease, inventory_of, tenancy_items
from tests.profiles import examples

SYNC = "/tenant-namespaces/sync"
CUSTOMIZE = "/tenant-namespaces/customize"
TENANT_NAMESPACE = "gpuclass.cozystack.io/tenant-namespace"
LEVEL = "gpuclass.cozystack.io/pool-level-"


@pytest.fixture
def client(settings: Settings) -> FlaskClient:
    return create_app(settings).test_client()


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def labels_of(client: FlaskClient, items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The labels the sync answers for a namespace, given what its rules select of the items."""
    inventory = inventory_of(items)
    rules = tenant_namespaces.customize(name).related_resources
    body = {"object": namespace(name), "related": offline.select_related(rules, inventory)}
    response = client.post(SYNC, json=body)
    assert response.status_code == 200, response.get_data()
    answer = response.get_json()
    assert set(answer) == {"labels", "attachments", "status"}
    assert (answer["attachments"], answer["status"]) == ([], None)
    labels: dict[str, Any] = answer["labels"]
    return labels


def test_a_tenant_namespace_names_each_bounded_tenant_above_it_by_depth(
    client: FlaskClient,
) -> None:
    """acme (depth 1) and lab (depth 2) are bounded; root is not: its depth's label goes."""
    assert labels_of(client, tenancy_items(), "tenant-acme-lab") == {
        TENANT_NAMESPACE: "true",
        f"{LEVEL}0": None,
        f"{LEVEL}1": "tenant-acme",
        f"{LEVEL}2": "tenant-acme-lab",
    }
    assert labels_of(client, tenancy_items(), "tenant-root") == {
        TENANT_NAMESPACE: "true",
        f"{LEVEL}0": None,
    }


def test_a_tenant_no_longer_bounded_has_its_label_removed_below_it(client: FlaskClient) -> None:
    items = tenancy_items()
    for o in items:
        if o["metadata"]["name"] == "tenant-acme" and o["kind"] == "HelmRelease":
            o["spec"]["values"] = {}
    assert labels_of(client, items, "tenant-acme-team")[f"{LEVEL}1"] is None


def test_a_namespace_no_tenant_could_own_is_left_alone(client: FlaskClient) -> None:
    customize = client.post(CUSTOMIZE, json={"parent": namespace("kube-system")}).get_json()
    assert customize == {"relatedResources": []}
    assert labels_of(client, tenancy_items(), "kube-system") == {}


def test_while_the_releases_cannot_be_trusted_the_labels_are_left_as_they_are(
    client: FlaskClient,
) -> None:
    body = json.loads(example_of(SYNC))
    del body["related"]["HelmRelease.helm.toolkit.fluxcd.io/v2"]
    answer = client.post(SYNC, json=body).get_json()
    assert answer == {"labels": {}, "attachments": [], "status": None, "resyncAfterSeconds": 10.0}


def test_the_rules_select_the_claimants_of_each_namespace_on_the_way_up() -> None:
    """By the namespace's name alone: in each parent namespace, the Tenant release by its name
    label and by the release name that names it where the label is missing."""
    rules = tenant_namespaces.customize("tenant-acme-team").related_resources
    assert [(r.namespace, r.names, r.label_selector is not None) for r in rules] == [
        ("tenant-root", None, True),
        ("tenant-root", ["tenant-root"], False),
        ("tenant-root", None, True),
        ("tenant-root", ["tenant-acme"], False),
        ("tenant-acme", None, True),
        ("tenant-acme", ["tenant-team"], False),
    ]
    assert rules[2].label_selector is not None
    assert rules[2].label_selector.match_labels == {
        "apps.cozystack.io/application.kind": "Tenant",
        "apps.cozystack.io/application.name": "acme",
    }


@pytest.mark.parametrize("target", [namespace(""), {"kind": "Namespace"}, None])
def test_a_target_that_is_not_a_named_namespace_is_a_400(client: FlaskClient, target: Any) -> None:
    body = json.loads(example_of(SYNC))
    body["object"] = target
    for route, sent in ((SYNC, body), (CUSTOMIZE, {"parent": target})):
        response = client.post(route, json=sent)
        assert response.status_code == 400 and set(response.get_json()) == {"error"}


# --- against an independent model -----------------------------------------------------------


@st.composite
def trees(draw: st.DrawFn) -> tuple[dict[str, list[str | None]], list[dict[str, Any]]]:
    """Tenants several levels deep, each bounded (some quota, any key) or not, as their releases;
    and by namespace, the bounded tenants' namespaces from the root down to it (None where the
    tenant there is not bounded)."""
    declared: dict[str, dict[str, int] | None] = {"tenant-root": None}
    parents: dict[str, str] = {}
    releases = [helmrelease("Tenant", "tenant-root", "root", {})]
    for name in draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True)):
        where = draw(st.sampled_from(sorted(declared)))
        quotas = draw(
            st.none()
            | st.dictionaries(st.sampled_from(("cpu", "x/devices")), st.just(1), min_size=1)
        )
        releases.append(
            helmrelease("Tenant", where, name, {"resourceQuotas": quotas} if quotas else {})
        )
        owned = f"tenant-{name}" if where == "tenant-root" else f"{where}-{name}"
        declared[owned] = quotas or None
        parents[owned] = where
    chains = {}
    for name in declared:
        chain: list[str | None] = []
        current = name
        while True:
            chain.insert(0, current if declared[current] else None)
            if current not in parents:
                break
            current = parents[current]
        chains[name] = chain
    return chains, releases


@hypothesis_settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(tree=trees())
def test_a_namespaces_labels_name_exactly_the_bounded_tenants_above_it(
    settings: Settings, tree: tuple[dict[str, list[str | None]], list[dict[str, Any]]]
) -> None:
    chains, releases = tree
    client = create_app(settings).test_client()
    for name, chain in chains.items():
        expected = {f"{LEVEL}{depth}": bounded for depth, bounded in enumerate(chain)}
        labels = labels_of(client, releases, name)
        assert labels == {TENANT_NAMESPACE: "true", **expected}, name
