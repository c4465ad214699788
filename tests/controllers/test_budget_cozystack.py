"""GPU budgets on Cozystack's own objects (docs/gpu-budgets.md, "Cozystack's objects"): every
release as its API writes it (`valuesFrom` the platform's values Secret, values as sent, no
defaults stored), devices from cluster instance types, the Kubernetes app's node groups. Through
the webhook's route with a local API server, and through the report's syncs on the same objects.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient

from hooks.cli import offline
from hooks.controllers import budget_report
from hooks.kubeapi.budget import GPUCLASSES, HELMRELEASES
from hooks.rules.budget.instance_types import INSTANCE_TYPES_API
from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.usage import PoolUse
from hooks.serving.app import create_app
from hooks.settings import Settings
from hooks.wire.cozystack import (
    DEFAULT_INSTANCE_TYPE,
    DEFAULT_MAX_REPLICAS,
    DEFAULT_MIN_REPLICAS,
    DEFAULT_NODE_GROUP,
    ValuesReference,
    contributes_nothing_read,
)
from hooks.wire.metacontroller import decode_report_sync
from tests import cozystack
from tests.builders import admission_review, gpuclass, gpus, inventory_of
from tests.fake_apiserver import FakeApiServer, list_of

HTTPS = "https://localhost"
A400 = "nvidia.com/A400"  # what Cozystack's gn1.* instance types attach
L40S = "nvidia.com/NVIDIA_L40S-24Q"
A400_KEY, L40S_KEY = class_key("a400"), class_key("l40s")
CLASSES = [gpuclass("a400", resource=A400), gpuclass("l40s", resource=L40S)]


def tenant_helmrelease(
    release_namespace: str, name: str, quotas: dict[str, Any] | None = None
) -> Any:
    return cozystack.helmrelease(
        "Tenant", release_namespace, name, {"resourceQuotas": quotas} if quotas else {}
    )


def releases_of_a_real_install() -> list[dict[str, Any]]:
    """The root, tenant a (4 devices, 2 of them A400) holding a VM of gn1.xlarge (one A400)
    whose values name no gpus, tenant b with no budget anywhere above it, and every release
    written by Cozystack's API."""
    return [
        tenant_helmrelease("tenant-root", "root"),
        tenant_helmrelease("tenant-root", "a", {TOTAL_KEY: 4, A400_KEY: 2}),
        tenant_helmrelease("tenant-root", "b"),
        cozystack.helmrelease("VMInstance", "tenant-a", "typed", {"instanceType": "gn1.xlarge"}),
    ]


@pytest.fixture(autouse=True)
def api(apiserver: FakeApiServer) -> FakeApiServer:
    apiserver.serve(GPUCLASSES, 200, list_of(CLASSES))
    apiserver.serve(INSTANCE_TYPES_API, 200, list_of(list(cozystack.instance_types())))
    apiserver.serve(HELMRELEASES, 200, list_of(releases_of_a_real_install()))
    return apiserver


def verdict(client: FlaskClient, body: dict[str, Any]) -> tuple[bool, str]:
    route = "/admit/tenant-gpu-keys" if body["request"]["kind"]["kind"] == "Tenant" else None
    answer = client.post(route or "/admit/gpu-budget", json=body, base_url=HTTPS)
    assert answer.status_code == 200, answer.get_data()
    response = answer.get_json()["response"]
    return response["allowed"], response.get("status", {}).get("message", "")


def serve(api: FakeApiServer, *extra: dict[str, Any]) -> None:
    api.serve(HELMRELEASES, 200, list_of([*releases_of_a_real_install(), *extra]))


# --- the platform's values Secret -------------------------------------------------------------


def test_every_gpu_verdict_on_releases_as_cozystacks_api_writes_them_is_reached(
    client: FlaskClient,
) -> None:
    """Every release carries `valuesFrom` the platform's values Secret: a VM within its pool's
    room, a new sub-tenant, a lowered budget and a VM where no budget lies above all pass; one
    past the pool is denied by the budget, not failed closed."""
    assert all("valuesFrom" in r["spec"] for r in releases_of_a_real_install())
    within = admission_review("VMInstance", "tenant-a", "v", {"gpus": gpus(A400)})
    assert verdict(client, within) == (True, "")
    unbounded = admission_review("VMInstance", "tenant-b", "v", {"gpus": gpus(A400)})
    assert verdict(client, unbounded) == (True, "")
    sub = admission_review(
        "Tenant", "tenant-a", "dev", {"resourceQuotas": {TOTAL_KEY: 1, A400_KEY: 0}}
    )
    assert verdict(client, sub) == (True, "")
    lowered = admission_review(
        "Tenant", "tenant-root", "a", {"resourceQuotas": {TOTAL_KEY: 3, A400_KEY: 1}},
        operation="UPDATE", old_spec={"resourceQuotas": {TOTAL_KEY: 4, A400_KEY: 2}},
    )  # fmt: skip
    assert verdict(client, lowered) == (True, "")
    allowed, message = verdict(
        client, admission_review("VMInstance", "tenant-a", "v", {"gpus": gpus(A400, A400)})
    )
    assert not allowed and message.startswith(f"{A400_KEY}: this VMInstance needs 2, the pool")


@pytest.mark.parametrize(
    ("reference", "kind", "contributes"),
    [
        ({"kind": "Secret", "name": "cozystack-values"}, "VMInstance", False),
        ({"kind": "Secret", "name": "cozystack-values", "targetPath": "_cluster"}, "Tenant", False),
        ({"kind": "Secret", "name": "cozystack-values", "targetPath": "gpus"}, "VMInstance", True),
        (
            {"kind": "Secret", "name": "cozystack-values", "targetPath": r"nodeGroups.md0"},
            "Kubernetes",
            True,
        ),
        (
            {"kind": "Secret", "name": "cozystack-values", "targetPath": "resourceQuotas[0]"},
            "Tenant",
            True,
        ),
        ({"kind": "Secret", "name": "cozystack-values", "targetPath": ".gpus"}, "VMInstance", True),
        ({"kind": "ConfigMap", "name": "cozystack-values"}, "VMInstance", True),
        ({"kind": "Secret", "name": "vm-values"}, "VMInstance", True),
    ],
)
def test_only_the_platforms_values_secret_outside_what_the_budgets_read_contributes_nothing(
    reference: dict[str, str], kind: str, contributes: bool
) -> None:
    """The platform's Secret merged at the top, or at a path the budgets do not read, sets nothing
    read (it holds only `_`-prefixed keys, which a spec cannot set); any other reference, or the
    platform's at a read path (or one that does not say), keeps the rule for values from
    elsewhere."""
    ref = ValuesReference(
        **{k if k != "targetPath" else "target_path": v for k, v in reference.items()}
    )
    assert contributes_nothing_read(ref, kind, "cozystack-values") is not contributes


def test_cozystacks_api_writes_the_platforms_secret_the_chart_names_by_default() -> None:
    """The reference `rest.go` writes on every release is the Secret `admission.platformValues
    Secret` names by default, and the Secret Cozystack renders holds only `_`-prefixed keys."""
    assert cozystack.platform_values() == {
        "kind": "Secret",
        "name": Settings().platform_values_secret,
    }
    secret = cozystack.text(
        "packages/system/cozystack-basics/templates/cozystack-values-secret.yaml"
    )
    top_level = [line.split(":")[0] for line in secret.split("values.yaml: |")[1].splitlines()]
    assert {key.strip() for key in top_level if key.startswith("    _")} == {
        "_cluster",
        "_namespace",
    }
    assert not [key for key in top_level if key.startswith("    ") and key[4:5].isalpha()]


def test_a_platform_secret_of_another_name_is_the_one_the_setting_names(
    settings: Settings, api: FakeApiServer
) -> None:
    """A platform that names its values Secret otherwise: the default name is then a Secret of
    values from elsewhere, and only the configured one contributes nothing."""
    renamed = settings.model_copy(
        update={"admission_cache_seconds": 0, "platform_values_secret": "platform-values"}
    )
    client = create_app(renamed).test_client()
    allowed, message = verdict(
        client, admission_review("VMInstance", "tenant-a", "v", {"gpus": gpus(A400)})
    )
    assert not allowed and "spec.valuesFrom: values from Secret cozystack-values" in message


# --- values as sent: the schema's defaults ------------------------------------------------------


def test_the_defaults_the_budgets_read_are_cozystacks_application_definitions() -> None:
    """A value the spec leaves out is the default of the app's schema, never unreadable."""
    vm = cozystack.schema("VMInstance")["properties"]
    assert vm["instanceType"]["default"] == DEFAULT_INSTANCE_TYPE
    assert vm["gpus"]["default"] == []
    group = cozystack.node_group_schema()["properties"]
    assert group["instanceType"]["default"] == DEFAULT_INSTANCE_TYPE
    assert group["maxReplicas"]["default"] == DEFAULT_MAX_REPLICAS
    assert group["minReplicas"]["default"] == DEFAULT_MIN_REPLICAS
    assert cozystack.schema("Kubernetes")["properties"]["nodeGroups"]["default"] == {}
    # the chart the Kubernetes app installs runs `md0` when nodeGroups is empty
    helpers = cozystack.text("packages/apps/kubernetes/templates/_helpers.tpl")
    assert f"\n{DEFAULT_NODE_GROUP}:\n  minReplicas: 0\n  maxReplicas: 10\n" in helpers
    assert (
        f'instanceType: "{DEFAULT_INSTANCE_TYPE}"' in helpers.split(f"\n{DEFAULT_NODE_GROUP}:")[1]
    )


def test_stored_values_without_defaults_are_read_as_the_defaults(
    client: FlaskClient, api: FakeApiServer
) -> None:
    """A stored VM with no `gpus` key and a worker pool that leaves its size to the defaults are
    read, not unreadable: the pool's 10 replicas of one A400 are what a pool of 4 can never
    hold, so a new VM is denied by the budget, saying so."""
    serve(
        api,
        cozystack.helmrelease("VMInstance", "tenant-a", "bare", {"running": True}),
        cozystack.helmrelease("KubernetesNodes", "tenant-a", "workers", {"gpus": gpus(L40S)}),
    )
    allowed, message = verdict(
        client, admission_review("VMInstance", "tenant-a", "v", {"gpus": gpus(L40S)})
    )
    assert not allowed and message.startswith(f"{TOTAL_KEY}: this VMInstance needs 1, the pool")
    assert "failed closed" not in message


# --- instance types -----------------------------------------------------------------------------


def test_a_vm_gets_the_gpus_of_its_instance_type_and_is_denied_past_its_pool(
    client: FlaskClient, api: FakeApiServer
) -> None:
    """gn1.xlarge attaches an A400 to a VM that lists no gpus: the pool of 2 A400 holds one
    already (the stored VM `typed`), so a second passes and a third is denied."""
    one_more = admission_review("VMInstance", "tenant-a", "v", {"instanceType": "gn1.xlarge"})
    assert verdict(client, one_more) == (True, "")
    serve(
        api,
        cozystack.helmrelease("VMInstance", "tenant-a", "v", {"instanceType": "gn1.2xlarge"}),
    )
    allowed, message = verdict(
        client, admission_review("VMInstance", "tenant-a", "w", {"instanceType": "gn1.4xlarge"})
    )
    assert not allowed and message.startswith(f"{A400_KEY}: this VMInstance needs 1, the pool")
    assert "0 left (budget 2, 0 carved out for sub-tenants, 2 reserved by other apps)" in message


def test_an_instance_type_that_cannot_be_read_fails_closed_only_where_a_pool_applies(
    client: FlaskClient, api: FakeApiServer
) -> None:
    api.serve(INSTANCE_TYPES_API, 503, {"kind": "Status"})
    typed = {"instanceType": "gn1.xlarge"}
    allowed, message = verdict(client, admission_review("VMInstance", "tenant-a", "v", typed))
    assert not allowed and "could not list VirtualMachineClusterInstancetypes" in message
    assert verdict(client, admission_review("VMInstance", "tenant-b", "v", typed)) == (True, "")
    broken = {"metadata": {"name": "gn1.xlarge"}, "spec": {"gpus": "one"}}
    api.serve(INSTANCE_TYPES_API, 200, list_of([broken]))
    allowed, message = verdict(client, admission_review("VMInstance", "tenant-a", "v", typed))
    assert not allowed and message.endswith(
        "VirtualMachineClusterInstancetype gn1.xlarge: spec.gpus: expected a list, got a string"
    )
    assert verdict(client, admission_review("VMInstance", "tenant-b", "v", typed)) == (True, "")


def test_an_update_that_keeps_its_instance_type_and_grows_nothing_reads_nothing(
    client: FlaskClient, api: FakeApiServer
) -> None:
    api.serve(HELMRELEASES, 503, {"kind": "Status"})
    spec = {"instanceType": "gn1.xlarge", "running": True}
    edit = admission_review(
        "VMInstance", "tenant-a", "typed", {**spec, "running": False},
        operation="UPDATE", old_spec=spec,
    )  # fmt: skip
    assert verdict(client, edit) == (True, "")


# --- the Kubernetes app's node groups -----------------------------------------------------------


def test_each_node_group_reserves_its_devices_times_its_size(
    client: FlaskClient, api: FakeApiServer
) -> None:
    """A tenant cluster's node groups are pools: gpus and the instance type's devices, times
    max(maxReplicas, minReplicas); the total over its groups is checked, growth only on update."""
    groups = {
        "cpu": {"instanceType": "u1.medium", "minReplicas": 1, "maxReplicas": 3},
        "gpu": {"instanceType": "gn1.xlarge", "minReplicas": 0, "maxReplicas": 1},
    }
    fits = admission_review("Kubernetes", "tenant-a", "k", {"nodeGroups": groups})
    assert verdict(client, fits) == (True, "")
    grown = {**groups, "gpu": {**groups["gpu"], "maxReplicas": 2}}
    allowed, message = verdict(
        client, admission_review("Kubernetes", "tenant-a", "k", {"nodeGroups": grown})
    )
    assert not allowed and message.startswith(f"{A400_KEY}: this Kubernetes needs 2, the pool")
    entries = {"gpu": {"gpus": gpus(L40S), "instanceType": "", "maxReplicas": 4}}
    allowed, message = verdict(
        client, admission_review("Kubernetes", "tenant-a", "k", {"nodeGroups": entries})
    )
    assert not allowed and message.startswith(f"{TOTAL_KEY}: this Kubernetes needs 4, the pool")
    serve(api, cozystack.helmrelease("Kubernetes", "tenant-a", "k", {"nodeGroups": grown}))
    shrink = admission_review(
        "Kubernetes", "tenant-a", "k", {"nodeGroups": groups},
        operation="UPDATE", old_spec={"nodeGroups": grown},
    )  # fmt: skip
    assert verdict(client, shrink) == (True, "")


def test_a_kubernetes_app_without_node_groups_runs_the_default_group_which_attaches_nothing(
    client: FlaskClient,
) -> None:
    assert verdict(client, admission_review("Kubernetes", "tenant-a", "k", {})) == (True, "")


# --- the report on the same objects -------------------------------------------------------------


def report_pools(items: list[dict[str, Any]]) -> dict[str, PoolUse]:
    settings = Settings()
    found: dict[str, PoolUse] = {}
    for body in offline.pool_requests(inventory_of(items), settings).values():
        outcome = budget_report.sync(
            decode_report_sync(json.dumps(body).encode()),
            settings.platform_values_secret,
            settings.budget_classes_namespace,
        )
        found.update({pool.namespace: pool for pool in outcome.pools or ()})
    return found


def test_the_report_counts_instance_types_and_node_groups_as_the_webhook_does() -> None:
    items = [
        *releases_of_a_real_install(),
        cozystack.helmrelease(
            "Kubernetes",
            "tenant-a",
            "k",
            {"nodeGroups": {"gpu": {"instanceType": "gn1.xlarge", "maxReplicas": 1}}},
        ),
        *CLASSES,
        *cozystack.instance_types(),
    ]
    [pool] = report_pools(items).values()
    assert {use.key: (use.reserved, use.left) for use in pool.keys} == {
        TOTAL_KEY: (2, 2),
        A400_KEY: (2, 0),
    }
    assert pool.unreadable is None
    assert [(a.kind, a.name, dict(a.units)) for a in pool.apps] == [
        ("Kubernetes", "k", {TOTAL_KEY: 1, A400_KEY: 1}),
        ("VMInstance", "typed", {TOTAL_KEY: 1, A400_KEY: 1}),
    ]
