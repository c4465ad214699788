"""The tenant namespace labeller's hooks through HTTP (Flask's test client), with
Metacontroller-shaped requests (docs/gpu-budgets.md, "Reading a budget"): each tenant namespace
labelled with its top-level namespace, and with the root's pool while the root tenant is bounded;
the deeper pool labels of earlier versions removed; any other namespace left alone."""

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
from tests.builders import example_of, helmrelease, inventory_of, labels_answered, tenancy_items
from tests.profiles import examples

SYNC = "/tenant-namespaces/sync"
CUSTOMIZE = "/tenant-namespaces/customize"
TENANT_NAMESPACE = "gpuclass.cozystack.io/tenant-namespace"
LEVEL = "gpuclass.cozystack.io/pool-level-"
TOP_LEVEL = "gpuclass.cozystack.io/top-level-namespace"


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def labels_of(client: FlaskClient, items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The labels the sync answers for a namespace, given what its rules select of the items
    and of `tenant-root` as its own sync labelled it."""
    if name != "tenant-root" and name.startswith("tenant-"):
        labelled = labels_of(client, items, "tenant-root")
        root = namespace("tenant-root")
        root["metadata"]["labels"] = {k: v for k, v in labelled.items() if v is not None}
        items = [*items, root]
    inventory = inventory_of(items)
    rules = tenant_namespaces.customize(name).related_resources
    body = {"object": namespace(name), "related": offline.select_related(rules, inventory)}
    return labels_answered(client, SYNC, body)


def test_a_tenant_namespace_names_its_top_level_namespace_and_drops_deeper_pool_labels(
    client: FlaskClient,
) -> None:
    """A name's alone: lab is below acme, acme is top-level; root is not bounded, so its pool's
    label goes, and so do the per-depth labels of earlier versions."""
    assert labels_of(client, tenancy_items(), "tenant-acme-lab") == {
        TENANT_NAMESPACE: "true",
        TOP_LEVEL: "tenant-acme",
        f"{LEVEL}0": None,
        f"{LEVEL}1": None,
        f"{LEVEL}2": None,
    }
    assert labels_of(client, tenancy_items(), "tenant-acme")[TOP_LEVEL] == "tenant-acme"
    assert labels_of(client, tenancy_items(), "tenant-root") == {
        TENANT_NAMESPACE: "true",
        TOP_LEVEL: None,
        f"{LEVEL}0": None,
    }


def test_while_the_root_tenant_is_bounded_every_tenant_namespace_is_in_the_roots_pool(
    client: FlaskClient,
) -> None:
    items = [
        *[o for o in tenancy_items() if o["metadata"]["name"] != "tenant-root"],
        helmrelease("Tenant", "tenant-root", "root", {"resourceQuotas": {"x/devices": "4"}}),
    ]
    for name in ("tenant-root", "tenant-acme", "tenant-acme-lab"):
        assert labels_of(client, items, name)[f"{LEVEL}0"] == "tenant-root", name


def test_a_namespace_no_tenant_could_own_is_left_alone(client: FlaskClient) -> None:
    customize = client.post(CUSTOMIZE, json={"parent": namespace("kube-system")}).get_json()
    assert customize == {"relatedResources": []}
    assert labels_of(client, tenancy_items(), "kube-system") == {}


def test_while_the_roots_releases_cannot_be_trusted_tenant_roots_labels_are_left_as_they_are(
    client: FlaskClient,
) -> None:
    body = {"object": namespace("tenant-root"), "related": {}}
    answer = client.post(SYNC, json=body).get_json()
    assert answer == {"labels": {}, "attachments": [], "status": None, "resyncAfterSeconds": 10.0}


def test_tenant_root_relates_the_root_tenants_claimants_and_the_others_tenant_root() -> None:
    """By the namespace's name alone: `tenant-root` relates, in itself, the root's Tenant release
    by its name label and by the release name where the label is missing; every other tenant
    namespace relates the `tenant-root` Namespace by name, whose label it copies (a Namespace
    rule by name costs Metacontroller a comparison per release it lists; a release rule, a
    selector match)."""
    rules = tenant_namespaces.customize("tenant-root").related_resources
    assert [(r.resource, r.namespace, r.names, r.label_selector is not None) for r in rules] == [
        ("helmreleases", "tenant-root", None, True),
        ("helmreleases", "tenant-root", ["tenant-root"], False),
    ]
    assert rules[0].label_selector is not None
    assert rules[0].label_selector.match_labels == {
        "apps.cozystack.io/application.kind": "Tenant",
        "apps.cozystack.io/application.name": "root",
    }
    for name in ("tenant-acme", "tenant-acme-team"):
        [rule] = tenant_namespaces.customize(name).related_resources
        assert (rule.resource, rule.namespace, rule.names, rule.label_selector) == (
            "namespaces",
            None,
            ["tenant-root"],
            None,
        )


def test_while_tenant_roots_namespace_cannot_be_read_the_labels_are_left_as_they_are(
    client: FlaskClient,
) -> None:
    broken = {"Namespace.v1": {"tenant-root": {"metadata": {"labels": []}}}}
    for related in ({}, broken):
        body = {"object": namespace("tenant-acme"), "related": related}
        answer = client.post(SYNC, json=body).get_json()
        assert answer == {
            "labels": {},
            "attachments": [],
            "status": None,
            "resyncAfterSeconds": 10.0,
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
def trees(draw: st.DrawFn) -> tuple[dict[str, str | None], bool, list[dict[str, Any]]]:
    """Tenants several levels deep, the root bounded or not, as their releases; and by namespace,
    the top-level tenant's namespace it is in (None for the root's)."""
    top: dict[str, str | None] = {"tenant-root": None}
    root_quotas = draw(st.none() | st.just({"x/devices": "1"}))
    releases = [
        helmrelease(
            "Tenant", "tenant-root", "root", {"resourceQuotas": root_quotas} if root_quotas else {}
        )
    ]
    for name in draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True)):
        where = draw(st.sampled_from(sorted(top)))
        quotas = draw(st.none() | st.just({"cpu": "1"}))
        releases.append(
            helmrelease("Tenant", where, name, {"resourceQuotas": quotas} if quotas else {})
        )
        owned = f"tenant-{name}" if where == "tenant-root" else f"{where}-{name}"
        top[owned] = owned if where == "tenant-root" else top[where]
    return top, root_quotas is not None, releases


@hypothesis_settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(tree=trees())
def test_a_namespaces_labels_name_its_top_level_namespace_and_the_roots_pool_exactly(
    settings: Settings, tree: tuple[dict[str, str | None], bool, list[dict[str, Any]]]
) -> None:
    top, root_bounded, releases = tree
    client = create_app(settings).test_client()
    for name, top_level in top.items():
        labels = labels_of(client, releases, name)
        depth = 0 if name == "tenant-root" else name.count("-")
        assert labels == {
            TENANT_NAMESPACE: "true",
            TOP_LEVEL: top_level,
            f"{LEVEL}0": "tenant-root" if root_bounded else None,
            **{f"{LEVEL}{d}": None for d in range(1, depth + 1)},
        }, name
