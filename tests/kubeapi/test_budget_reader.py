"""Reading the budget inputs from a local API server that serves the list endpoints."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

from hooks.kubeapi.budget import (
    GPUCLASSES,
    HELM_API,
    HELMRELEASES,
    BudgetReader,
    releases_in,
)
from hooks.kubeapi.client import PAGE_SIZE
from hooks.rules.budget.instance_types import INSTANCE_TYPES_API
from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.reservations import Catalog, FailedClosed, Reservation, reservation
from hooks.rules.budget.tenancy import App, Group, Tenant
from hooks.settings import Settings
from hooks.wire.problems import Unreadable
from tests import cozystack
from tests.builders import GPU, gpuclass, gpus, helmrelease
from tests.fake_apiserver import FakeApiServer, list_of


@pytest.fixture
def budget_api(apiserver: FakeApiServer) -> FakeApiServer:
    apiserver.serve(GPUCLASSES, 200, list_of([gpuclass("l40s"), gpuclass("broken", resource=None)]))
    apiserver.serve(
        HELMRELEASES,
        200,
        list_of(
            [
                helmrelease(
                    "Tenant",
                    "tenant-root",
                    "a",
                    {"resourceQuotas": {TOTAL_KEY: "4", "requests.cpu": "500m"}},
                ),
                helmrelease("Tenant", "tenant-root", "b", {"host": "b.example.org"}),
                helmrelease("VMInstance", "tenant-a", "vm1", {"gpus": gpus(GPU), "running": False}),
                helmrelease(
                    "KubernetesNodes", "tenant-a", "pool", {"gpus": gpus(GPU), "maxReplicas": 3}
                ),
                helmrelease("KubernetesNodes", "tenant-a", "pool2", {"gpus": gpus(GPU)}),
            ]
        ),
    )
    return apiserver


def reader(settings: Settings, now: list[float] | None = None) -> BudgetReader:
    clock = now or [0.0]
    return BudgetReader(
        settings.model_copy(update={"admission_cache_seconds": 5}), clock=lambda: clock[0]
    )


def releases_read(api: FakeApiServer) -> list[str]:
    """The release LISTs made, as namespace and selector, first pages only."""
    reads = []
    for path, _ in api.requests:
        parts = urlsplit(path)
        if parts.path.startswith(HELM_API) and "continue" not in parts.query:
            namespace = parts.path.removeprefix(f"{HELM_API}/namespaces/").split("/")[0]
            reads.append(f"{namespace}: {parse_qs(parts.query)['labelSelector'][0]}")
    return reads


KINDS = "apps.cozystack.io/application.kind"
NAME = "apps.cozystack.io/application.name"


def test_reads_classes_tenants_and_apps_by_label_across_pages(
    settings: Settings, budget_api: FakeApiServer
) -> None:
    budgets = reader(settings)
    assert [(c.name, c.resource_name) for c in budgets.catalog().classes] == [
        ("l40s", GPU),
        ("broken", None),
    ]
    tenancy = budgets.tenancy(["tenant-a"])
    tenants = {t.name: t for t in tenancy.tenants}
    assert set(tenants) == {"a"}  # b is another pool: not read
    assert tenants["a"].declaration == {TOTAL_KEY: 4, "requests.cpu": 0}
    assert tenants["a"].owned_namespace == "tenant-a"
    apps = {a.name: a for a in tenancy.apps}
    assert set(apps) == {"vm1", "pool", "pool2"}
    # what the values leave out is the schema's default: 10 replicas, the instance type u1.medium
    assert (apps["pool"].kind, apps["pool"].groups, apps["pool2"].groups) == (
        "KubernetesNodes",
        (Group((GPU,), "u1.medium", 3),),
        (Group((GPU,), "u1.medium", 10),),
    )
    assert apps["vm1"].groups == (Group((GPU,), "u1.medium"),)
    # the owners of tenant-a and tenant-root, then tenant-a's pool: namespaced, by label
    assert releases_read(budget_api) == [
        f"tenant-root: {KINDS}=Tenant,{NAME} in (a,root)",
        f"tenant-root: {KINDS}=Tenant,!{NAME}",  # no release of the root tenant at all
        f"tenant-root: {KINDS}=Tenant,{NAME}=",
        f"tenant-a: {KINDS} in (Tenant,VMInstance,KubernetesNodes,Kubernetes)",
    ]
    assert any("continue=2" in path for path, _ in budget_api.requests)
    assert all(auth == "Bearer sa-token-1" for _, auth in budget_api.requests)


def test_an_unbounded_namespace_reads_no_pool(
    settings: Settings, budget_api: FakeApiServer
) -> None:
    tenancy = reader(settings).tenancy(["tenant-b"])
    assert [t.name for t in tenancy.tenants] == ["b"] and not tenancy.tenants[0].bounded
    assert releases_read(budget_api) == [
        f"tenant-root: {KINDS}=Tenant,{NAME} in (b,root)",
        f"tenant-root: {KINDS}=Tenant,!{NAME}",  # no release of the root tenant at all
        f"tenant-root: {KINDS}=Tenant,{NAME}=",
    ]  # and none of tenant-b's own releases: no verdict about it reads them


def test_classes_are_cached_briefly_tenants_and_apps_never(
    settings: Settings, budget_api: FakeApiServer
) -> None:
    now = [100.0]
    budgets = reader(settings, now)

    def reads(path: str) -> int:
        return sum(1 for p, _ in budget_api.requests if p.startswith(path) and "continue" not in p)

    budgets.catalog(), budgets.tenancy(["tenant-a"])
    now[0] = 104.9
    budgets.catalog(), budgets.tenancy(["tenant-a"])
    assert reads(GPUCLASSES) == 1
    assert reads(releases_in("tenant-a")) == 2
    now[0] = 105.0  # the cache's five seconds are over
    budgets.catalog()
    assert reads(GPUCLASSES) == 2


def test_an_expired_class_cache_is_never_served_while_the_list_fails(
    settings: Settings, budget_api: FakeApiServer
) -> None:
    """Within its seconds the cache answers whatever the API server does; past them, a failed
    list fails closed, however long it lasts, and the next list that succeeds is served."""
    now = [100.0]
    budgets = reader(settings, now)
    listed = budgets.catalog().classes
    budget_api.serve(GPUCLASSES, 500, {"kind": "Status"})
    now[0] = 104.0
    assert budgets.catalog().classes == listed
    for later in (105.0, 200.0, 10_000.0):
        now[0] = later
        with pytest.raises(Unreadable, match=r"^could not list GPUClasses .*HTTP 500"):
            budgets.catalog()
    budget_api.serve(GPUCLASSES, 200, list_of([gpuclass("a10")]))
    assert [c.name for c in budgets.catalog().classes] == ["a10"]


@pytest.mark.parametrize("code", [403, 500])
def test_unreadable_lists_fail_closed_with_what_could_not_be_read(
    settings: Settings, apiserver: FakeApiServer, code: int
) -> None:
    apiserver.serve(HELMRELEASES, code, {"kind": "Status"})
    with pytest.raises(Unreadable, match=f"could not list HelmReleases .*HTTP {code}"):
        reader(settings).tenancy(["tenant-a"])
    with pytest.raises(Unreadable, match=r"^could not list GPUClasses \(not found\)$"):
        reader(settings).catalog()  # not served at all: 404


def test_instance_types_are_read_fresh_on_every_review_and_an_unserved_api_has_none(
    settings: Settings, budget_api: FakeApiServer
) -> None:
    """What a VM attaches through an instance type is what the API server holds when the review
    arrives; where KubeVirt's instance type API is not served, none exists."""
    budgets = reader(settings)
    assert budgets.catalog().instance_types == {}  # not served: 404
    budget_api.serve(INSTANCE_TYPES_API, 200, list_of(list(cozystack.instance_types())))
    assert budgets.catalog().instance_types == {
        name: tuple(devices) for name, devices in cozystack.gpu_instance_types().items()
    }
    first_pages = [p for p, _ in budget_api.requests if "continue" not in p]
    assert sum(1 for p in first_pages if p.startswith(INSTANCE_TYPES_API)) == 2
    broken = {"metadata": {"name": "gn1.broken"}, "spec": {"gpus": [{"name": "gpu1"}]}}
    budget_api.serve(INSTANCE_TYPES_API, 200, list_of([broken]))
    assert budgets.catalog().unreadable_types == {
        "gn1.broken": "spec.gpus[0]: object missing required field deviceName"
    }
    budget_api.serve(INSTANCE_TYPES_API, 503, {"kind": "Status"})
    with pytest.raises(Unreadable, match=r"^could not list VirtualMachineClusterInstancetypes"):
        budgets.catalog()


def test_an_app_without_gpus_entries_reserves_nothing_whatever_else_it_holds(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    """Such apps pass the webhook's match conditions unjudged: stored, a field that multiplies
    nothing must not make their pool fail closed. A Tenant reads only its quotas."""
    apiserver.serve(
        HELMRELEASES,
        200,
        list_of(
            [
                helmrelease("KubernetesNodes", "tenant-x", "neg", {"gpus": [], "maxReplicas": -1}),
                helmrelease("VMInstance", "tenant-x", "odd", {"resourceQuotas": "x", "gpus": []}),
                helmrelease("VMInstance", "tenant-x", "none", {"maxReplicas": "many"}),
                helmrelease("Tenant", "tenant-root", "x", {"gpus": None, "resourceQuotas": {}}),
            ]
        ),
    )
    tenancy = reader(settings).tenancy(["tenant-x"], subtrees=["tenant-x"])
    assert [(a.name, a.unreadable) for a in tenancy.apps] == [
        ("neg", None),
        ("odd", None),
        ("none", None),
    ]
    catalog = Catalog()
    assert all(reservation(app, catalog) == Reservation() for app in tenancy.apps)
    assert [(t.name, t.unreadable) for t in tenancy.tenants] == [("x", None)]


def test_objects_that_do_not_decode_are_kept_and_named(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    legacy = helmrelease("VMInstance", "tenant-x", "legacy", {"gpus": None})
    negative = helmrelease(
        "KubernetesNodes", "tenant-x", "neg", {"gpus": [{"name": "x"}], "maxReplicas": -1}
    )
    nameless = helmrelease("Tenant", "tenant-root", "n", {})
    del nameless["metadata"]["labels"]["apps.cozystack.io/application.name"]
    nameless["metadata"]["name"] = "legacy-n"  # a release name that names no tenant
    apiserver.serve(
        HELMRELEASES,
        200,
        list_of(
            [
                helmrelease(
                    "Tenant", "tenant-root", "a", {"resourceQuotas": {class_key("l40s"): "1500m"}}
                ),
                helmrelease("Tenant", "tenant-root", "b", {"resourceQuotas": "lots"}),
                legacy,
                negative,
                nameless,
            ]
        ),
    )
    tenancy = reader(settings).tenancy(["tenant-x", "tenant-a", "tenant-b"], subtrees=["tenant-x"])
    assert [(t.name, t.unreadable) for t in tenancy.tenants] == [
        (
            "a",
            "HelmRelease tenant-root/tenant-a: spec.values.resourceQuotas."
            "l40s.gpuclass.cozystack.io/devices: extended resources are whole units",
        ),
        (
            "b",
            "HelmRelease tenant-root/tenant-b: spec.values.resourceQuotas: "
            "expected a map, got a string",
        ),
        (
            None,
            "HelmRelease tenant-root/legacy-n: metadata.labels: no "
            "apps.cozystack.io/application.name, and the release name names no tenant",
        ),
    ]
    assert all(t.bounded for t in tenancy.tenants)  # what cannot be read is never passed by
    legacy_app, negative_app = tenancy.apps
    assert (legacy_app.name, legacy_app.unreadable) == (
        "legacy",
        "HelmRelease tenant-x/vm-instance-legacy: spec.values.gpus: expected a list, got null",
    )
    # a size that does not decode fails closed where its group attaches a device
    with pytest.raises(FailedClosed) as failed:
        reservation(negative_app, Catalog())
    assert str(failed.value) == (
        "HelmRelease tenant-x/kubernetes-nodes-neg: spec.values.maxReplicas: expected an integer "
        ">= 0"
    )


def test_timeout_fails_closed(settings: Settings, apiserver: FakeApiServer) -> None:
    apiserver.serve(HELMRELEASES, 200, list_of([]), delay=1.0)
    fast = settings.model_copy(update={"kube_timeout_seconds": 0.2})
    with pytest.raises(Unreadable, match="timed out"):
        BudgetReader(fast).tenancy(["tenant-a"])


def test_no_api_configured_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(Unreadable, match="no Kubernetes API configured"):
        BudgetReader(Settings(kube_token_file=tmp_path / "none")).tenancy(["tenant-a"])


# The cost contract: a review reads the owners of its namespace and its own pool, which stops at
# bounded sub-tenants (each its own pool) and goes through unbounded ones.
TREE = [
    helmrelease("Tenant", "tenant-root", "a", {"resourceQuotas": {TOTAL_KEY: "4"}}),
    helmrelease("Tenant", "tenant-a", "u", {}),  # unbounded: inside a's pool
    helmrelease("Tenant", "tenant-a", "b", {"resourceQuotas": {TOTAL_KEY: "1"}}),  # bounded
    helmrelease("Tenant", "tenant-a-b", "c", {}),
    helmrelease("Tenant", "tenant-a-u", "w", {}),
    helmrelease("VMInstance", "tenant-a-u", "vm-u", {"gpus": gpus(GPU)}),
    helmrelease("VMInstance", "tenant-a-b", "vm-b", {"gpus": gpus(GPU)}),
    helmrelease("VMInstance", "tenant-a-b-c", "vm-c", {"gpus": gpus(GPU)}),
    helmrelease("VMInstance", "tenant-a-u-w", "vm-w", {"gpus": gpus(GPU)}),
]
ROOT_OWNERS = [
    f"tenant-root: {KINDS}=Tenant,{NAME} in (a,root)",
    f"tenant-root: {KINDS}=Tenant,!{NAME}",
    f"tenant-root: {KINDS}=Tenant,{NAME}=",
]


def pool(*namespaces: str) -> list[str]:
    return [f"{n}: {KINDS} in (Tenant,VMInstance,KubernetesNodes,Kubernetes)" for n in namespaces]


@pytest.mark.parametrize(
    ("namespace", "lists", "apps"),
    [
        (
            "tenant-a",
            [*ROOT_OWNERS, *pool("tenant-a", "tenant-a-u", "tenant-a-u-w")],
            {"vm-u", "vm-w"},
        ),
        (
            "tenant-a-u-w",
            [
                f"tenant-a: {KINDS}=Tenant,{NAME} in (u)",
                f"tenant-a-u: {KINDS}=Tenant,{NAME} in (w)",
                *ROOT_OWNERS,
                *pool("tenant-a", "tenant-a-u", "tenant-a-u-w"),
            ],
            {"vm-u", "vm-w"},
        ),
        (
            "tenant-a-b-c",
            [
                f"tenant-a: {KINDS}=Tenant,{NAME} in (b)",
                f"tenant-a-b: {KINDS}=Tenant,{NAME} in (c)",
                *ROOT_OWNERS,
                *pool("tenant-a-b", "tenant-a-b-c"),
            ],
            {"vm-b", "vm-c"},
        ),
    ],
)
def test_a_review_lists_its_owners_and_its_pool_and_stops_at_bounded_sub_tenants(
    settings: Settings, apiserver: FakeApiServer, namespace: str, lists: list[str], apps: set[str]
) -> None:
    apiserver.serve(HELMRELEASES, 200, list_of(TREE))
    tenancy = reader(settings).tenancy([namespace])
    assert sorted(releases_read(apiserver)) == sorted(lists)
    assert {app.name for app in tenancy.apps} == apps


def test_a_vm_and_a_worker_pool_of_one_name_are_two_releases(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    """Releases are told apart by their own names (Cozystack prefixes the kind), not by the app
    names they carry: neither hides the other's reservation."""
    apiserver.serve(
        HELMRELEASES,
        200,
        list_of(
            [
                helmrelease("Tenant", "tenant-root", "a", {"resourceQuotas": {TOTAL_KEY: "4"}}),
                helmrelease("VMInstance", "tenant-a", "x", {"gpus": gpus(GPU, GPU)}),
                helmrelease(
                    "KubernetesNodes", "tenant-a", "x", {"gpus": gpus(GPU), "maxReplicas": 2}
                ),
            ]
        ),
    )
    apps = reader(settings).tenancy(["tenant-a"]).apps
    assert sorted((app.kind, app.name) for app in apps) == [
        ("KubernetesNodes", "x"),
        ("VMInstance", "x"),
    ]


def test_every_list_is_read_in_pages_of_the_api_servers_usual_size(
    settings: Settings, budget_api: FakeApiServer
) -> None:
    reader(settings).catalog()
    queries = [parse_qs(urlsplit(p).query) for p, _ in budget_api.requests]
    assert queries and all(query["limit"] == [str(PAGE_SIZE)] for query in queries)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"items": "not a list"}', "could not list GPUClasses (the list is not valid: "),
        (b'{"items": [{"metadata": []}]}', "GPUClass: "),
    ],
)
def test_a_class_list_that_does_not_decode_fails_closed_saying_what(
    settings: Settings, apiserver: FakeApiServer, body: bytes, message: str
) -> None:
    apiserver.serve(GPUCLASSES, 200, body)
    with pytest.raises(Unreadable) as failed:
        reader(settings).catalog()
    assert str(failed.value).startswith(message)


def test_a_list_whose_continue_token_never_advances_fails_closed(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    def stuck(query: dict[str, str]) -> dict[str, Any]:
        return {"kind": "List", "metadata": {"continue": "again"}, "items": [gpuclass("l40s")]}

    apiserver.serve(GPUCLASSES, 200, stuck)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            reader(settings).catalog()
        except BaseException as error:
            raised.append(error)

    reading = threading.Thread(target=read, daemon=True)  # a loop must fail the test, not hang it
    reading.start()
    reading.join(10)
    assert not reading.is_alive(), "still reading the same page"
    [error] = raised
    assert isinstance(error, Unreadable)
    assert "the list's continue token did not advance" in str(error)
    assert len(apiserver.requests) == 2


def test_a_release_that_says_not_even_where_it_lives_is_an_unreadable_tenant_of_nowhere() -> None:
    release = release_object(msgspec.Raw(b'{"metadata": []}'), "cozystack-values")
    assert isinstance(release, Tenant)
    assert (release.release_namespace, release.name) == ("", None)
    assert release.unreadable is not None
    assert release.unreadable.startswith("HelmRelease (unnamed): ")


def test_a_release_without_kind_or_name_labels_is_an_app_of_no_kind_and_no_name() -> None:
    body = {"metadata": {"namespace": "tenant-a", "name": "vm-x", "labels": {}}, "spec": {}}
    release = release_object(msgspec.Raw(json.dumps(body).encode()), "cozystack-values")
    assert isinstance(release, App)
    assert (release.namespace, release.kind, release.name, release.release) == (
        "tenant-a",
        "",
        "",
        "vm-x",
    )
    assert release.unreadable is None
