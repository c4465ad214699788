"""The budget report: every GPU budget pool's use, from the same arithmetic as the verdicts.

For each bounded tenant that declares a GPU key: per key its budget, what the bounded tenants in
its pool carve out, what its members' apps reserve and what is left (`Pools.key_use`, which the
app check reads too), and the apps that reserve. Every app counts, none is under review. A pool
whose arithmetic reads an object that cannot be read has no figures anyone can know: it is
reported unreadable, naming the object, as a verdict would fail closed on it. The report is for
people to read; the webhook never trusts it and reads fresh on every review.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hooks.rules.budget.pools import FailedClosed, KeyUse, Pools
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import Tenancy


@dataclass(frozen=True)
class AppUse:
    """An app of the pool and what it reserves of each key the pool declares (none at 0)."""

    kind: str
    namespace: str
    name: str
    units: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class PoolUse:
    """One bounded tenant's pool: `namespace` is the namespace the tenant owns."""

    namespace: str
    tenant: str
    keys: tuple[KeyUse, ...]
    apps: tuple[AppUse, ...] = ()
    unreadable: str | None = None
    # devices of resources no GPUClass names, by that resource: counted under the total key
    unclassed: tuple[tuple[str, int], ...] = ()

    @property
    def over_budget(self) -> tuple[KeyUse, ...]:
        return tuple(use for use in self.keys if use.left < 0)


def budget_usage(tenancy: Tenancy, catalog: Catalog) -> tuple[PoolUse, ...]:
    """Every GPU budget pool of the tenancy, by the namespace its tenant owns."""
    pools = Pools(tenancy.tenants, tenancy.apps)
    return tuple(
        use
        for root in sorted(pools.bounded)
        if (use := _pool_use(pools, root, catalog)) is not None
    )


def pool_usage(tenancy: Tenancy, catalog: Catalog, namespace: str) -> PoolUse | None:
    """The pool of the tenant owning the namespace, as `budget_usage` gives it; None where that
    tenant is not bounded or declares no GPU key."""
    pools = Pools(tenancy.tenants, tenancy.apps)
    if namespace not in pools.bounded:
        return None
    return _pool_use(pools, namespace, catalog)


def _pool_use(pools: Pools, root: str, catalog: Catalog) -> PoolUse | None:
    tenant = pools.tenant(root).name or ""
    try:
        budget = pools.budget(root)
    except FailedClosed as problem:  # its own declaration: whether it has a GPU key is unknown
        return PoolUse(root, tenant, (), unreadable=str(problem))
    if not budget:
        return None  # bounded on other quotas only: no GPU budget to report
    declared = sorted(budget)
    try:
        pools.require_readable(root)
        keys = tuple(pools.key_use(root, key, catalog) for key in declared)
        held = [(app, pools.held(app, catalog)) for app in pools.members(root)]
    except FailedClosed as problem:
        return PoolUse(root, tenant, (), unreadable=str(problem))
    apps = []
    unclassed: Counter[str] = Counter()
    for app, reserves in held:
        units = tuple((key, reserves.get(key)) for key in declared if reserves.get(key))
        if units:
            apps.append(AppUse(app.kind, app.namespace, app.listed_as, units))
        unclassed.update(reserves.unclassed)
    apps.sort(key=lambda a: (a.namespace, a.kind, a.name))
    return PoolUse(root, tenant, keys, tuple(apps), unclassed=tuple(sorted(unclassed.items())))
