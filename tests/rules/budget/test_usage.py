"""The budget report (`hooks.rules.budget.usage`) against the independent model of the pool
invariant (tests/rules/budget/test_invariant.py): for generated trees grown by admitted
operations, then pushed over budget the way an operator does it (a budget lowered under what is
held), every pool's budget, carve-outs, reservations and what is left are the model's; on legacy
clusters, every pool the report can read has the model's figures, and the others are reported
unreadable, never with figures."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hooks.rules.budget.tenancy import App, Tenancy, Tenant
from hooks.rules.budget.usage import AppUse, PoolUse, budget_usage, pool_usage
from tests.profiles import examples
from tests.rules.budget import vm
from tests.rules.budget.test_invariant import (
    BUDGET_KEYS,
    CATALOG,
    L40S,
    TOTAL,
    Cluster,
    LegacyCluster,
    apply,
    legacy_clusters,
    operations,
    parent_of,
    step,
    trees,
)
from tests.rules.budget.test_invariant import (
    LegacyReleases as Releases,
)


def carved(cluster: Cluster, pool: str, key: str) -> int:
    """The model's carve-outs: the declarations of the bounded tenants whose parent is in the
    pool."""
    return sum(
        declared.get(key, 0)
        for namespace, declared in cluster.declarations().items()
        if namespace != pool and cluster.pool_of(parent_of(namespace)) == pool
    )


@st.composite
def grown_then_lowered(draw: st.DrawFn) -> Cluster:
    """A tree, grown by operations the webhook admitted, then maybe a budget lowered below what
    its pool holds: the webhook never sees that (the operator edits the release), and the pool
    stays over its budget until its apps shrink."""
    cluster = draw(trees())
    for _ in range(draw(st.integers(0, 25))):
        allowed, _, after = step(cluster, draw(st.data()))
        if allowed:
            cluster = after
    gpu_pools = sorted(
        (key, tenant)
        for tenant, declared in cluster.tenants.items()
        for key in declared
        if key in BUDGET_KEYS
    )
    if gpu_pools and draw(st.booleans()):
        key, tenant = draw(st.sampled_from(gpu_pools))
        lowered = dict(cluster.tenants[tenant])
        lowered[key] = draw(st.integers(0, max(lowered[key] - 1, 0)))
        cluster.tenants[tenant] = lowered
    return cluster


def over_grown_trees(test: Callable[[Cluster], None]) -> Callable[[], None]:
    """A property over trees grown by admitted operations, then maybe pushed over budget."""
    given_trees: Callable[[], None] = given(cluster=grown_then_lowered())(test)
    return settings(
        max_examples=examples(200),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )(given_trees)


@over_grown_trees
def test_one_pools_usage_is_that_pool_in_every_pools(cluster: Cluster) -> None:
    """A pool's report computes its own pool alone: the same figures, and none for a namespace
    whose tenant has no GPU budget (or that no tenant owns)."""
    tenancy = cluster.everything()
    every = {pool.namespace: pool for pool in budget_usage(tenancy, CATALOG)}
    namespaces = {tenant.owned_namespace for tenant in tenancy.tenants} | {"tenant-nobody"}
    for namespace in sorted(n for n in namespaces if n is not None):
        assert pool_usage(tenancy, CATALOG, namespace) == every.get(namespace)


@over_grown_trees
def test_every_pools_figures_are_the_models_over_budget_ones_included(cluster: Cluster) -> None:
    report = {pool.namespace: pool for pool in budget_usage(cluster.everything(), CATALOG)}
    expected = {
        namespace: declared
        for namespace, declared in cluster.declarations().items()
        if any(key in BUDGET_KEYS for key in declared)
    }
    assert sorted(report) == sorted(expected)
    for namespace, declared in expected.items():
        pool = report[namespace]
        assert pool.unreadable is None
        figures = {
            use.key: (use.budget, use.carved_out, use.reserved, use.left) for use in pool.keys
        }
        model = {}
        for key in (k for k in BUDGET_KEYS if k in declared):
            carve = carved(cluster, namespace, key)
            reserved = cluster.held(namespace, key) - carve
            model[key] = (declared[key], carve, reserved, declared[key] - carve - reserved)
        assert figures == model
        over = {key for key, (budget, *_, left) in model.items() if left < 0}
        assert {use.key for use in pool.over_budget} == over
        assert bool(over) == any(b.startswith(f"{namespace} ") for b in cluster.breaches())


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(start=legacy_clusters(), steps=st.lists(operations(), max_size=15))
def test_a_legacy_clusters_pools_have_the_models_figures_or_are_reported_unreadable(
    start: LegacyCluster, steps: list
) -> None:
    cluster = start
    for operation in steps:
        allowed, after = apply(cluster, operation)
        if allowed:
            cluster = after
    everything = Releases(cluster.releases).namespace
    namespaces = sorted({r.namespace for r in cluster.releases})
    objects = [obj for namespace in namespaces for obj in everything(namespace)]
    tenancy = Tenancy(
        tuple(o for o in objects if isinstance(o, Tenant)),
        tuple(o for o in objects if isinstance(o, App)),
    )
    budgets = cluster.budgets()
    for pool in budget_usage(tenancy, cluster.catalog()):
        if pool.unreadable is not None:
            assert pool.keys == () and pool.apps == ()
            continue
        for use in pool.keys:
            assert use.budget == budgets[pool.namespace][use.key]
            assert use.carved_out + use.reserved == cluster.held(pool.namespace, use.key)


def test_a_pool_lists_the_apps_that_reserve_and_what_each_reserves_of_its_keys() -> None:
    tenancy = Tenancy(
        (
            Tenant("tenant-root", "root", {}),
            Tenant("tenant-root", "acme", {TOTAL: 4, "l40s.gpuclass.cozystack.io/devices": 2}),
            Tenant("tenant-acme", "lab", {TOTAL: 1, "l40s.gpuclass.cozystack.io/devices": 0}),
        ),
        (
            vm("tenant-acme", "render", L40S, L40S),
            vm("tenant-acme", "idle"),
            vm("tenant-other", "elsewhere", L40S),
        ),
    )
    [acme, lab] = budget_usage(tenancy, CATALOG)
    assert acme == PoolUse(
        "tenant-acme",
        "acme",
        acme.keys,
        (
            AppUse(
                "VMInstance",
                "tenant-acme",
                "render",
                ((TOTAL, 2), ("l40s.gpuclass.cozystack.io/devices", 2)),
            ),
        ),
    )
    assert [(u.key, u.budget, u.carved_out, u.reserved, u.left) for u in acme.keys] == [
        (TOTAL, 4, 1, 2, 1),
        ("l40s.gpuclass.cozystack.io/devices", 2, 0, 2, 0),
    ]
    assert (lab.namespace, lab.apps, [u.left for u in lab.keys]) == ("tenant-acme-lab", (), [1, 0])


def test_a_pool_whose_arithmetic_reads_an_unreadable_release_has_no_figures() -> None:
    broken = App("tenant-acme", "VMInstance", "legacy", unreadable="HelmRelease x: no gpus")
    tenancy = Tenancy(
        (Tenant("tenant-root", "root", {}), Tenant("tenant-root", "acme", {TOTAL: 4})),
        (broken,),
    )
    [acme] = budget_usage(tenancy, CATALOG)
    assert acme == PoolUse("tenant-acme", "acme", (), (), "HelmRelease x: no gpus")


def test_a_tenant_bounded_on_other_quotas_only_has_no_gpu_budget_to_report() -> None:
    tenancy = Tenancy(
        (Tenant("tenant-root", "root", {}), Tenant("tenant-root", "acme", {"requests.cpu": 4})),
        (),
    )
    assert budget_usage(tenancy, CATALOG) == ()
