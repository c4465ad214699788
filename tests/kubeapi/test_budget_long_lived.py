"""GPU budgets over the releases a long-lived cluster holds: unlabelled, duplicated and oddly placed
(docs/gpu-budgets.md: "Releases as a long-lived cluster holds them", the declaration gate,
"Failing closed, narrowly").

Each review goes the whole way a production review goes: the AdmissionReview through the budget
controller, the releases read through `BudgetReader` from a local API server that filters by label
and namespace the way the API server does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from hooks.controllers.budget import BudgetInputs, review_app, review_tenant
from hooks.kubeapi.budget import (
    GPUCLASSES,
    HELMRELEASES,
    BudgetReader,
    releases_in,
)
from hooks.rules.budget.keys import TOTAL_KEY, parse_budget
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.tenancy import Tenant, tenant_from_release
from hooks.rules.budget.verdicts import Verdict
from hooks.rules.quantity import QuantityError, parse_units
from hooks.settings import Settings
from hooks.wire.admission import decode_review
from hooks.wire.problems import Unreadable
from tests.builders import (
    GPU,
    admission_review,
    gpuclass,
    gpus,
    helmrelease,
    review_request,
    tenant_request,
)
from tests.fake_apiserver import FakeApiServer, Route, list_of

NAME_LABEL = "apps.cozystack.io/application.name"
L40S_KEY = "l40s.gpuclass.cozystack.io/devices"


def unlabelled(release: dict[str, Any], *, empty: bool = False) -> dict[str, Any]:
    """A release as migrations left it: without its name label, or with an empty one."""
    labels = release["metadata"]["labels"]
    if empty:
        labels[NAME_LABEL] = ""
    else:
        del labels[NAME_LABEL]
    return release


def renamed(release: dict[str, Any], name: str) -> dict[str, Any]:
    release["metadata"]["name"] = name
    return release


def cluster(api: FakeApiServer, *releases: dict[str, Any]) -> BudgetReader:
    api.serve(GPUCLASSES, 200, list_of([gpuclass("l40s")]))
    api.serve(HELMRELEASES, 200, list_of(list(releases)))
    return BudgetReader(api_settings(api))


def api_settings(api: FakeApiServer) -> Settings:
    return Settings(kube_api=api.url, kube_ca_file="/nonexistent", admission_cache_seconds=0)


def vm_review(namespace: str, name: str, *devices: str, spec: Any = None, **review: Any) -> Any:
    spec = spec if spec is not None else {"gpus": gpus(*devices)}
    return review_request("VMInstance", namespace, name, spec, **review)


def worker_pool(namespace: str, name: str, spec: dict[str, Any]) -> Any:
    return review_request("KubernetesNodes", namespace, name, spec)


def verdict_of(review: Any, inputs: BudgetInputs) -> Verdict:
    if review.kind.kind == "Tenant":
        return review_tenant(review, inputs).verdict
    return review_app(review, inputs).verdict


ROOT_TWO = helmrelease("Tenant", "tenant-root", "root", {"resourceQuotas": {TOTAL_KEY: "2"}})
TENANT_A = helmrelease("Tenant", "tenant-root", "a", {})


# --- escapes -----------------------------------------------------------------------------------


def test_a_tenant_release_without_a_name_label_is_named_by_its_release_name(
    apiserver: FakeApiServer,
) -> None:
    """Escape 1: the root's release with no name label declared 2 devices, could not be placed,
    and a VM with 5 devices under it was admitted."""
    budgets = cluster(apiserver, unlabelled(ROOT_TWO), TENANT_A)
    verdict = verdict_of(vm_review("tenant-a", "big", *[GPU] * 5), budgets)
    assert verdict.allowed is False
    assert verdict.message.startswith(f"{TOTAL_KEY}: this VMInstance needs 5, the pool of tenant ")


def test_an_empty_name_label_counts_as_missing(apiserver: FakeApiServer) -> None:
    budgets = cluster(apiserver, unlabelled(ROOT_TWO, empty=True), TENANT_A)
    assert verdict_of(vm_review("tenant-a", "big", *[GPU] * 3), budgets).allowed is False
    assert verdict_of(vm_review("tenant-a", "fits", *[GPU] * 2), budgets).allowed is True


def test_a_release_name_names_a_tenant_only_as_tenant_and_a_dashless_name() -> None:
    assert tenant_from_release("tenant-root") == "root"
    assert tenant_from_release("tenant-x") == "x"
    assert tenant_from_release("tenant-a-b") is None  # tenant names have no dashes
    assert tenant_from_release("legacy") is None
    assert tenant_from_release("tenant-") is None
    assert tenant_from_release("tenant-UPPER") is None


@pytest.mark.parametrize("key", ["gpuclass.cozystack.io", "a10.gpuclass.cozystack.io"])
def test_a_gpu_domain_key_without_a_slash_is_refused(apiserver: FakeApiServer, key: str) -> None:
    """Escape 2: accepted silently, the operator believed a budget was set."""
    budgets = cluster(apiserver, ROOT_TWO)
    verdict = verdict_of(tenant_request("tenant-root", "x", {key: 8}), budgets)
    assert (verdict.allowed, verdict.message) == (
        False,
        f"{key}: not a GPU budget key; use {TOTAL_KEY} or <class>.gpuclass.cozystack.io/devices",
    )


def test_every_app_release_reserves_on_its_own_even_without_its_name_label(
    apiserver: FakeApiServer,
) -> None:
    """Escape 3, apps: two VM releases without a name label were merged and counted once."""
    first = unlabelled(helmrelease("VMInstance", "tenant-a", "one", {"gpus": gpus(GPU)}))
    second = unlabelled(helmrelease("VMInstance", "tenant-a", "two", {"gpus": gpus(GPU)}))
    budgets = cluster(apiserver, ROOT_TWO, TENANT_A, first, second)
    verdict = verdict_of(vm_review("tenant-a", "three", GPU), budgets)
    assert verdict.allowed is False
    assert "2 reserved by other apps" in verdict.message


def test_two_tenant_releases_claiming_one_namespace_deny_the_verdicts_that_need_it(
    apiserver: FakeApiServer,
) -> None:
    """Escape 3, tenants: two releases labelled x counted one carve-out. Neither can be trusted,
    so every verdict that needs tenant x denies, naming both; others go on."""
    x = helmrelease("Tenant", "tenant-root", "x", {"resourceQuotas": {TOTAL_KEY: "1"}})
    twin = renamed(
        helmrelease("Tenant", "tenant-root", "x", {"resourceQuotas": {TOTAL_KEY: "1"}}), "x-old"
    )
    budgets = cluster(apiserver, ROOT_TWO, TENANT_A, x, twin)
    both = (
        "HelmRelease tenant-root/tenant-x and HelmRelease tenant-root/x-old both claim tenant "
        "namespace tenant-x"
    )
    edit = {"operation": "UPDATE", "old_spec": {"resourceQuotas": {TOTAL_KEY: "1"}}}
    for review in (
        vm_review("tenant-a", "v", GPU),
        vm_review("tenant-x", "v", GPU),
        tenant_request("tenant-root", "x", {TOTAL_KEY: "1"}, **edit),
    ):
        verdict = verdict_of(review, budgets)
        assert (verdict.allowed, verdict.message) == (
            False,
            f"GPU budget check failed closed: {both}",
        )
    # Outside the root's pool nothing needs tenant x.
    assert verdict_of(vm_review("default", "v", GPU), budgets).allowed is True


def test_two_releases_storing_the_app_under_review_deny_when_a_pool_applies(
    apiserver: FakeApiServer,
) -> None:
    stored = helmrelease("VMInstance", "tenant-a", "v", {"gpus": gpus(GPU)})
    copy = renamed(helmrelease("VMInstance", "tenant-a", "v", {"gpus": gpus(GPU)}), "v-copy")
    budgets = cluster(apiserver, ROOT_TWO, TENANT_A, stored, copy)
    edit = vm_review("tenant-a", "v", GPU, operation="UPDATE", old_spec={"gpus": []})
    verdict = verdict_of(edit, budgets)
    assert (verdict.allowed, verdict.message) == (
        False,
        "GPU budget check failed closed: HelmRelease tenant-a/v-copy and HelmRelease "
        "tenant-a/vm-instance-v both store VMInstance v",
    )


def test_a_worker_pool_reserves_for_the_larger_of_max_and_min_replicas(
    apiserver: FakeApiServer,
) -> None:
    """Escape 5: minReplicas above maxReplicas reserved only maxReplicas nodes' devices."""
    budgets = cluster(apiserver, ROOT_TWO, TENANT_A)
    spec = {"gpus": gpus(GPU), "maxReplicas": 1, "minReplicas": 3}
    verdict = verdict_of(worker_pool("tenant-a", "p", spec), budgets)
    assert verdict.allowed is False
    assert "this KubernetesNodes needs 3" in verdict.message


def test_a_quantity_is_matched_whole_and_a_json_number_has_the_same_bounds() -> None:
    """Escape 6: "1\\n" was read as 1, and the JSON number 2**64 was accepted where the string
    was refused."""
    with pytest.raises(QuantityError):
        parse_units("1\n")
    for value in (2**64, "18446744073709551616", 2**63, float(2**64)):
        with pytest.raises(QuantityError, match="out of range"):
            parse_budget(value)
    assert parse_budget(2**63 - 1) == parse_budget(str(2**63 - 1)) == 2**63 - 1


def test_a_quota_with_a_trailing_newline_is_refused_at_the_gate(apiserver: FakeApiServer) -> None:
    budgets = cluster(apiserver, ROOT_TWO)
    verdict = verdict_of(tenant_request("tenant-root", "x", {TOTAL_KEY: "1\n"}), budgets)
    assert verdict.allowed is False
    assert verdict.message.endswith(f"spec.resourceQuotas.{TOTAL_KEY}: not a quantity")


# --- failing closed, narrowly ----------------------------------------------------------------


def test_an_undecodable_object_is_denied_only_where_a_pool_applies(
    apiserver: FakeApiServer,
) -> None:
    """Fail-closed 7: a legacy VM with `gpus: null` outside every pool could not be edited."""
    budgets = cluster(
        apiserver, ROOT_TWO, TENANT_A, helmrelease("Tenant", "tenant-root", "free", {})
    )
    outside = verdict_of(vm_review("default", "legacy", spec={"gpus": None}), budgets)
    assert outside.allowed is True
    inside = verdict_of(vm_review("tenant-a", "legacy", spec={"gpus": None}), budgets)
    assert (inside.allowed, inside.message) == (
        False,
        "object is not a valid app: spec.gpus: expected a list, got null",
    )


def test_an_unbounded_tree_allows_an_undecodable_object(apiserver: FakeApiServer) -> None:
    root = helmrelease("Tenant", "tenant-root", "root", {})
    budgets = cluster(apiserver, root, TENANT_A)
    assert verdict_of(vm_review("tenant-a", "legacy", spec={"gpus": None}), budgets).allowed is True


def test_an_unplaceable_release_in_tenant_root_spares_a_bounded_tenants_own_pool(
    apiserver: FakeApiServer,
) -> None:
    """Fail-closed 8: one unlabelled Tenant release in tenant-root denied every GPU review in the
    cluster, even in a bounded tenant's pool whose owner chain is fully labelled."""
    legacy = renamed(unlabelled(helmrelease("Tenant", "tenant-root", "q", {})), "legacy")
    bounded = helmrelease("Tenant", "tenant-root", "b", {"resourceQuotas": {TOTAL_KEY: "2"}})
    lab = helmrelease("Tenant", "tenant-b", "lab", {})
    # the root's release without its label: the unlabelled releases of tenant-root are read, the
    # legacy one among them
    root = unlabelled(helmrelease("Tenant", "tenant-root", "root", {}))
    budgets = cluster(apiserver, root, legacy, bounded, lab)
    assert verdict_of(vm_review("tenant-b", "v", GPU), budgets).allowed is True
    assert verdict_of(vm_review("tenant-b-lab", "v", GPU, GPU), budgets).allowed is True
    assert verdict_of(vm_review("tenant-b-lab", "v", GPU, GPU, GPU), budgets).allowed is False
    # Where no placed tenant owns a namespace on the way up, the legacy release could be its
    # (bounded) tenant: that review fails closed, naming it.
    unsettled = verdict_of(vm_review("tenant-c", "v", GPU), budgets)
    assert (unsettled.allowed, unsettled.message) == (
        False,
        "GPU budget check failed closed: HelmRelease tenant-root/legacy: metadata.labels: no "
        f"{NAME_LABEL}, and the release name names no tenant",
    )


def test_gpuclasses_are_read_only_when_a_pool_applies(apiserver: FakeApiServer) -> None:
    """Fail-closed 9: a GPUClass LIST answering 500 denied a VM where no budget applies."""
    root = helmrelease("Tenant", "tenant-root", "root", {})
    bounded = helmrelease("Tenant", "tenant-root", "b", {"resourceQuotas": {TOTAL_KEY: "2"}})
    budgets = cluster(apiserver, root, TENANT_A, bounded)
    apiserver.serve(GPUCLASSES, 500, {"kind": "Status"})
    assert verdict_of(vm_review("tenant-a", "v", GPU), budgets).allowed is True
    inside = verdict_of(vm_review("tenant-b", "v", GPU), budgets)
    assert (inside.allowed, inside.message) == (
        False,
        "GPU budget check failed closed: could not list GPUClasses (HTTP 500)",
    )


# --- concurrency -------------------------------------------------------------------------------


@pytest.fixture
def slow_pool(apiserver: FakeApiServer) -> Iterator[BudgetReader]:
    """Twenty bounded tenants, and one more whose namespace's LIST takes ten seconds."""
    tenants = [
        helmrelease("Tenant", "tenant-root", f"t{i}", {"resourceQuotas": {TOTAL_KEY: "4"}})
        for i in range(20)
    ]
    slow = helmrelease("Tenant", "tenant-root", "slow", {"resourceQuotas": {TOTAL_KEY: "4"}})
    budgets = cluster(apiserver, helmrelease("Tenant", "tenant-root", "root", {}), *tenants, slow)
    apiserver.routes[releases_in("tenant-slow")] = Route(200, list_of([slow]), delay=10.0)
    yield budgets


def test_a_slow_list_delays_only_its_own_review(slow_pool: BudgetReader) -> None:
    """No lock is held across a read: twenty reviews of other pools are answered while one LIST
    is pending (a lock across reads queued them all behind it, into the webhook's timeout)."""
    slow_done = threading.Event()

    def slow_review() -> None:
        verdict_of(vm_review("tenant-slow", "v", GPU), slow_pool)
        slow_done.set()

    threading.Thread(target=slow_review, daemon=True).start()
    time.sleep(0.2)  # the slow review is waiting for its LIST
    verdicts: list[bool] = []

    def review(index: int) -> None:
        verdicts.append(verdict_of(vm_review(f"tenant-t{index}", "v", GPU), slow_pool).allowed)

    threads = [threading.Thread(target=review, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(9)
    # every other review answered while the slow LIST was still pending: none waited behind it
    assert not slow_done.is_set(), "the slow LIST answered before the others"
    assert verdicts == [True] * 20
    assert slow_done.wait(20)


def test_the_api_client_gives_each_thread_its_own_session(apiserver: FakeApiServer) -> None:
    from hooks.kubeapi.client import ApiClient

    client = ApiClient(api_settings(apiserver))
    sessions: list[object] = []
    threads = [
        threading.Thread(target=lambda: sessions.append(client._session())) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(s) for s in sessions}) == 3
    assert client._session() is client._session()


def test_an_unreadable_list_still_fails_closed(apiserver: FakeApiServer) -> None:
    budgets = cluster(apiserver, ROOT_TWO)
    apiserver.serve(HELMRELEASES, 500, {"kind": "Status"})
    verdict = verdict_of(vm_review("tenant-a", "v", GPU), budgets)
    assert (verdict.allowed, verdict.message) == (
        False,
        "GPU budget check failed closed: could not list HelmReleases (HTTP 500)",
    )
    with pytest.raises(Unreadable):
        budgets.tenancy(["tenant-a"])


def test_an_unplaceable_release_fails_closed_a_pool_whose_walk_passes_an_unowned_namespace(
    apiserver: FakeApiServer,
) -> None:
    """The root's pool applies to tenant-c, but no placed tenant owns tenant-c: the nameless
    release could be c, bounded, a pool of its own with another budget. Fail closed there."""
    legacy = renamed(unlabelled(helmrelease("Tenant", "tenant-root", "q", {})), "legacy")
    budgets = cluster(apiserver, ROOT_TWO, legacy)
    unsettled = verdict_of(vm_review("tenant-c", "v", GPU), budgets)
    assert (unsettled.allowed, unsettled.message) == (
        False,
        "GPU budget check failed closed: HelmRelease tenant-root/legacy: metadata.labels: no "
        f"{NAME_LABEL}, and the release name names no tenant",
    )


@pytest.mark.parametrize(
    ("release", "name", "unreadable"),
    [("tenant-x", "x", False), ("legacy", None, True)],
)
def test_an_empty_name_label_on_a_tenant_release_names_no_tenant(
    release: str, name: str | None, unreadable: bool
) -> None:
    document = renamed(helmrelease("Tenant", "tenant-root", "x", {}), release)
    document["metadata"]["labels"][NAME_LABEL] = ""
    tenant = release_object(msgspec.Raw(msgspec.json.encode(document)), "cozystack-values")
    assert isinstance(tenant, Tenant)
    assert tenant.name == name and (tenant.unreadable is not None) == unreadable


def with_values_from(release: dict[str, Any]) -> dict[str, Any]:
    """A release whose values Flux also takes from a ConfigMap (`spec.valuesFrom`), beside the
    platform's values Secret every release takes values from."""
    release["spec"]["valuesFrom"].append({"kind": "ConfigMap", "name": "vm-values"})
    return release


def test_a_release_with_values_from_fails_closed_for_the_verdicts_that_need_it(
    apiserver: FakeApiServer,
) -> None:
    """Its gpus may come from the ConfigMap, which the webhook does not read: never counted as
    holding nothing. Verdicts that do not read the pool's members go on."""
    hidden = with_values_from(helmrelease("VMInstance", "tenant-a", "hidden", {}))
    budgets = cluster(apiserver, ROOT_TWO, TENANT_A, hidden)
    grows = verdict_of(vm_review("tenant-a", "v", GPU), budgets)
    assert (grows.allowed, grows.message) == (
        False,
        "GPU budget check failed closed: HelmRelease tenant-a/vm-instance-hidden: "
        "spec.valuesFrom: values from ConfigMap vm-values, which the webhook does not read",
    )
    assert verdict_of(vm_review("default", "v", GPU), budgets).allowed is True
    a_cpu_quota = tenant_request("tenant-a", "b", {"requests.cpu": "1"})
    assert verdict_of(a_cpu_quota, budgets).allowed is False  # must-declare: the pool has a key
    at_zero = verdict_of(tenant_request("tenant-a", "b", {TOTAL_KEY: "0"}), budgets)
    assert at_zero.allowed is True


def test_a_tenant_release_with_values_from_fails_closed_where_its_quotas_count(
    apiserver: FakeApiServer,
) -> None:
    hidden = with_values_from(helmrelease("Tenant", "tenant-root", "a", {}))
    budgets = cluster(apiserver, ROOT_TWO, hidden)
    verdict = verdict_of(vm_review("tenant-root", "v", GPU), budgets)
    assert (verdict.allowed, verdict.message) == (
        False,
        "GPU budget check failed closed: HelmRelease tenant-root/tenant-a: spec.valuesFrom: "
        "values from ConfigMap vm-values, which the webhook does not read",
    )


def test_a_release_with_values_from_whose_values_set_its_gpus_is_counted_from_them(
    apiserver: FakeApiServer,
) -> None:
    """Flux merges `values` over `valuesFrom`, a list or a scalar replaced whole: a VM release
    whose values set `gpus` and `instanceType` reserves those, whatever the ConfigMap holds (and a
    worker pool's values set its size bounds too)."""
    vm = {"gpus": gpus(GPU), "instanceType": "u1.medium"}
    declared = with_values_from(helmrelease("VMInstance", "tenant-a", "v", vm))
    budgets = cluster(apiserver, ROOT_TWO, TENANT_A, declared)
    assert verdict_of(vm_review("tenant-a", "w", GPU), budgets).allowed is True
    over = verdict_of(vm_review("tenant-a", "w", GPU, GPU), budgets)
    assert (over.allowed, over.message.split(",")[0]) == (
        False,
        "gpuclass.cozystack.io/devices: this VMInstance needs 2",
    )
    sized = {"gpus": gpus(GPU), "instanceType": "", "maxReplicas": 1, "minReplicas": 1}
    pool = with_values_from(helmrelease("KubernetesNodes", "tenant-a", "p", sized))
    budgets = cluster(apiserver, ROOT_TWO, TENANT_A, pool)
    assert verdict_of(vm_review("tenant-a", "w", GPU), budgets).allowed is True
    unsized = with_values_from(
        helmrelease("KubernetesNodes", "tenant-a", "p", {"gpus": gpus(GPU), "instanceType": ""})
    )
    budgets = cluster(apiserver, ROOT_TWO, TENANT_A, unsized)
    assert verdict_of(vm_review("tenant-a", "w", GPU), budgets).message.endswith(
        "HelmRelease tenant-a/kubernetes-nodes-p: spec.valuesFrom: values from ConfigMap "
        "vm-values, which the webhook does not read"
    )


def test_an_update_of_an_app_whose_own_release_takes_values_from_elsewhere(
    apiserver: FakeApiServer,
) -> None:
    """Flux merges the ConfigMap's values under the new ones: the update is judged when the new
    values set all the reservation reads, and fails closed where its size may come from the
    ConfigMap (a worker pool without its minReplicas)."""
    own = with_values_from(helmrelease("VMInstance", "tenant-a", "v", {}))
    budgets = cluster(apiserver, ROOT_TWO, TENANT_A, own)
    edit = vm_review(
        "tenant-a", "v", spec={"gpus": gpus(GPU, GPU), "instanceType": ""},
        operation="UPDATE", old_spec={"gpus": gpus(GPU)},
    )  # fmt: skip
    assert verdict_of(edit, budgets).allowed is True
    pool = with_values_from(helmrelease("KubernetesNodes", "tenant-a", "p", {}))
    budgets = cluster(apiserver, ROOT_TWO, TENANT_A, pool)
    body = admission_review(
        "KubernetesNodes", "tenant-a", "p", {"gpus": gpus(GPU), "maxReplicas": 1},
        operation="UPDATE", old_spec={"gpus": gpus(GPU), "maxReplicas": 1},
    )  # fmt: skip
    grown = {"gpus": gpus(GPU, GPU), "maxReplicas": 1}
    body["request"]["object"]["spec"] = grown
    verdict = verdict_of(decode_review(msgspec.json.encode(body)), budgets)
    assert (verdict.allowed, verdict.message) == (
        False,
        "GPU budget check failed closed: HelmRelease tenant-a/kubernetes-nodes-p: "
        "spec.valuesFrom: values from ConfigMap vm-values, which the webhook does not read",
    )
    quotas = with_values_from(
        helmrelease("Tenant", "tenant-root", "a", {"resourceQuotas": {TOTAL_KEY: "1"}})
    )
    budgets = cluster(apiserver, ROOT_TWO, quotas)
    old = {"resourceQuotas": {TOTAL_KEY: "1"}}
    edited = verdict_of(tenant_request("tenant-root", "a", {TOTAL_KEY: "1", "requests.cpu": "1"},
                               operation="UPDATE", old_spec=old), budgets)  # fmt: skip
    assert edited.allowed is False and "spec.valuesFrom" in edited.message
