"""Pools: roots, members, carve-outs (`hooks.rules.budget.pools`)."""

from __future__ import annotations

from hooks.rules.budget.keys import TOTAL_KEY
from hooks.rules.budget.pools import Pools
from hooks.rules.budget.tenancy import (
    Tenant,
)
from tests.builders import tenant
from tests.rules.budget import (
    CATALOG,
    L40S,
    root,
    vm,
)


def test_rule_2_pool_root_is_the_first_bounded_tenant_walking_up() -> None:
    pools = Pools(
        [
            tenant("tenant-root", "a", {TOTAL_KEY: 4}),
            tenant("tenant-a", "b"),
            tenant("tenant-a-b", "c"),
        ]
    )
    assert pools.root("tenant-a-b-c") == "tenant-a"
    assert pools.root("tenant-x") is None


def test_a_pool_may_apply_where_one_does_or_an_unplaced_release_could_make_one() -> None:
    unplaced = Tenant("tenant-root", None, {}, unreadable="HelmRelease tenant-root/legacy: no name")
    assert Pools([root(gpuclass__cozystack__io__devices=4), tenant("tenant-root", "a")]).may_apply(
        "tenant-a"
    )
    assert Pools([root(), unplaced]).may_apply("tenant-a")
    assert not Pools([root()]).may_apply("tenant-a")
    assert not Pools([root(), tenant("tenant-root", "a"), unplaced]).may_apply("tenant-a")


def test_a_namespace_no_tenant_release_names_is_in_no_pool() -> None:
    """The membership rule: `tenant-a-gone`, whose Tenant release is gone, is no member of `a`'s
    pool, nor is anything below it; the webhook, which follows Tenant releases, never reads it."""
    a = tenant("tenant-root", "a", {TOTAL_KEY: 4})
    pools = Pools(
        [root(), a, tenant("tenant-a-gone", "sub")],
        [vm("tenant-a-gone", "v", L40S, L40S, L40S), vm("tenant-a-gone-sub", "w", L40S)],
    )
    assert pools.root("tenant-a") == "tenant-a"
    assert pools.root("tenant-a-gone") is None
    assert pools.root("tenant-a-gone-sub") is None
    assert pools.members("tenant-a") == []
    assert pools.key_use("tenant-a", TOTAL_KEY, CATALOG).left == 4


def test_pools_read_tenants_given_as_a_generator_whole() -> None:
    unplaced = Tenant("tenant-root", None, {}, "HelmRelease tenant-root/legacy: no name")
    pools = Pools(t for t in (root(), unplaced))
    assert pools.unplaced == (unplaced,) and set(pools.tenants) == {"tenant-root"}
