"""The declaration gate: a Tenant create or update against the pool it carves out of, and against
what is already held inside it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain

from hooks.rules.budget.keys import CLASS_KEY_SUFFIX, TOTAL_KEY, in_gpu_domain, is_budget_key
from hooks.rules.budget.pools import FailedClosed, Pools, claim_conflict
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import App, Tenant, parent_namespace
from hooks.rules.budget.verdicts import Verdict, decided, first_denial


def check_declaration(
    *,
    new: Tenant,
    old: Tenant | None,
    apps: Iterable[App],
    tenants: Iterable[Tenant],
    catalog: Catalog,
    creating: bool | None = None,
) -> Verdict:
    """The declaration gate for a Tenant create (old None) or update.

    The tenant carves out of P, the pool of the namespace its release lives in (the root tenant
    of none). Intermediate unbounded tenants are members of P, so the limit is P's budget, not the
    direct parent's. Stored values of the tenant under review are replaced by the new ones; the
    old object is only the baseline of growth (a value that does not parse counts as 0).
    """
    tenants, apps = tuple(tenants), tuple(apps)
    refused = declaration_refused(new)
    if refused is not None:
        return Verdict(False, refused)
    claiming = [
        t
        for t in tenants
        if t.owned_namespace is not None and t.owned_namespace == new.owned_namespace
    ]
    # On CREATE nothing stored is the tenant under review: a release already claiming its
    # namespace is another tenant.
    creating = old is None if creating is None else creating
    stored = [] if creating else claiming
    others = tuple(t for t in tenants if t not in stored)
    pools = Pools((*others, new), apps)
    pool = pools.root(parent_namespace(new.owned_namespace))

    def decide() -> Verdict:
        if new.owned_namespace is None:
            raise FailedClosed(
                f"Tenant in {new.release_namespace} has no name: its namespace, and the pool "
                "it carves out of, are unknown"
            )
        if creating and claiming:
            return Verdict(
                False,
                f"tenant {new.name}: its namespace {new.owned_namespace} is already claimed by "
                f"{sorted(t.where for t in claiming)[0]}; two releases of one tenant would make "
                "every budget verdict in its pool fail closed",
            )
        if len(stored) > 1:
            raise FailedClosed(claim_conflict(new.owned_namespace, stored))
        if stored and stored[0].values_from:
            # its quotas from elsewhere are merged under the new ones: the declaration under
            # review is not the whole of it
            raise FailedClosed(stored[0].unreadable or stored[0].where)
        pools.require_settled(new.release_namespace)
        return _gate(new, old, pools, pool, catalog)

    return decided(decide, others, apps)


def declaration_refused(new: Tenant) -> str | None:
    """What no input can make right: stray keys in the GPU domain, values that do not parse."""
    stray = sorted(k for k in new.declaration if in_gpu_domain(k) and not is_budget_key(k))
    if stray:
        keys = ", ".join(stray)
        return f"{keys}: not a GPU budget key; use {TOTAL_KEY} or <class>{CLASS_KEY_SUFFIX}"
    invalid = sorted(k for k, v in new.declaration.items() if v is None)
    if invalid:
        return f"resourceQuotas.{invalid[0]}: not a whole, non-negative number of devices"
    return None


@dataclass(frozen=True)
class DeclarationReview:
    """What the declaration gate's rules read: the tenant under review and its old value, the
    pools with the new value in place, P (the pool the tenant carves out of, None outside every
    pool) and the catalog."""

    new: Tenant
    old: Tenant | None
    pools: Pools
    pool: str | None
    catalog: Catalog

    @property
    def own(self) -> str:
        """The tenant's own namespace (the tenant under review always has a name)."""
        own = self.new.owned_namespace
        if own is None:
            raise FailedClosed(f"tenant in {self.new.release_namespace} has no name")
        return own

    @property
    def budget(self) -> dict[str, int]:
        return self.pools.budget(self.pool) if self.pool is not None else {}

    @property
    def was_bounded(self) -> bool:
        return self.old is not None and self.old.bounded

    def previous(self, key: str) -> int:
        return self.old.units(key) if self.old is not None else 0

    def newly_declares(self, key: str) -> bool:
        return self.old is None or not self.old.declares(key)

    def lowers(self, key: str) -> bool:
        return self.new.units(key) < self.previous(key)


def must_declare_pool_keys(review: DeclarationReview) -> Verdict | None:
    """Must-declare: a tenant becoming bounded inside a pool with a GPU budget forms a pool of its
    own, unbounded for every GPU key it leaves out."""
    new, pool = review.new, review.pool
    if pool is None or not new.bounded or review.was_bounded:
        return None
    missing = sorted(set(review.budget) - {k for k in new.declaration if is_budget_key(k)})
    if not missing:
        return None
    return Verdict(
        False,
        f"tenant {new.name} declares a quota inside the pool of {review.pools.name(pool)}, "
        f"which has a GPU budget: declare {', '.join(missing)} too (0 is allowed), "
        "or it would escape that budget",
    )


def keeps_pool_keys(review: DeclarationReview) -> Verdict | None:
    """A bounded tenant keeps every budget key of its pool that it validly declared; becoming
    unbounded altogether returns its whole sub-tree to the pool and is allowed."""
    new, old, pool = review.new, review.old, review.pool
    if pool is None or not new.bounded or old is None or not old.bounded:
        return None
    dropped = sorted(k for k in review.budget if old.declares(k) and k not in new.declaration)
    if not dropped:
        return None
    return Verdict(
        False,
        f"{dropped[0]}: tenant {new.name} keeps a quota inside the pool of "
        f"{review.pools.name(pool)}, which declares this key: dropping it would let the "
        "tenant escape that budget; declare the number it needs (0 is allowed)",
    )


def no_unmapped_devices_under_a_new_bound(review: DeclarationReview) -> Verdict | None:
    """Devices of a resource no GPUClass names count under no key. A tenant that starts declaring
    a GPU budget while its own pool holds such devices would take them in uncounted, and they
    would count, over its budget, once a class names them: refused, naming them, until they are
    removed or a class names them (the app check's `no_unmapped_devices_escape`, for a bound)."""
    new, old = review.new, review.old
    budgeted_before = old is not None and any(is_budget_key(k) for k in old.declaration)
    if budgeted_before or not any(is_budget_key(k) for k in new.declaration):
        return None
    own, pools = review.own, review.pools
    pools.require_readable(own)
    unmapped = {app: pools.held(app, review.catalog).unmapped for app in pools.members(own)}
    holders = {app: resources for app, resources in unmapped.items() if resources}
    if not holders:
        return None
    names = ", ".join(sorted(set().union(*holders.values())))
    first = sorted(f"{app.kind} {app.namespace}/{app.name or app.release}" for app in holders)[0]
    more = f" and {len(holders) - 1} more" if len(holders) > 1 else ""
    return Verdict(
        False,
        f"tenant {new.name} declares a GPU budget, but its namespaces hold devices of {names}, "
        f"which no GPUClass names ({first}{more}): they would escape the budget. Remove those "
        "gpus entries, or create their GPUClass first",
    )


def key_fits_pool(review: DeclarationReview, key: str) -> Verdict | None:
    """Growth fits P: P's budget less every other carve-out and P's members' reservations."""
    new, pools, pool = review.new, review.pools, review.pool
    budget = review.budget
    if pool is None or key not in budget or new.units(key) <= review.previous(key):
        return None
    pools.require_readable(pool)  # P's arithmetic, read only for a key that grows
    carved = pools.carved_out(pool, key) - new.units(key)
    reserved = pools.reserved(pool, key, review.catalog)
    limit = budget[key] - carved - reserved
    if new.units(key) <= limit:
        return None
    return Verdict(
        False,
        f"{key}: tenant {new.name} declares {new.units(key)}, the pool of "
        f"{pools.name(pool)} can give {max(limit, 0)} (budget {budget[key]}, "
        f"{carved} carved out for other sub-tenants, {reserved} reserved by apps)",
    )


def sub_tenants_declare_key(review: DeclarationReview, key: str) -> Verdict | None:
    """The mirror of must-declare: a tenant that starts bounding a key may not hold bounded
    sub-tenants that leave it out, whose sub-trees would be unbounded for it."""
    if not review.newly_declares(key):
        return None
    own, pools = review.own, review.pools
    pools.require_readable(own)
    leaving_out = sorted(ns for ns, t in pools.carving(own).items() if not t.declares(key))
    if not leaving_out:
        return None
    return Verdict(
        False,
        f"{key}: tenant {review.new.name} declares this key, but its sub-tenant "
        f"{pools.tenant(leaving_out[0]).name} ({leaving_out[0]}) does not and would "
        "escape it: declare it there first (0 is allowed)",
    )


def holds_what_is_inside(review: DeclarationReview, key: str) -> Verdict | None:
    """The floor: a new or lowered declaration still holds what is already held inside the
    tenant, or the devices its pool would give back to P are still in use."""
    if not (review.newly_declares(key) or review.lowers(key)):
        return None
    own, pools, new = review.own, review.pools, review.new
    pools.require_readable(own)
    carved = pools.carved_out(own, key)
    reserved = pools.reserved(own, key, review.catalog)
    if carved + reserved <= new.units(key):
        return None
    return Verdict(
        False,
        f"{key}: tenant {new.name} declares {new.units(key)}, but {carved + reserved} "
        f"are held inside it already ({carved} carved out for its sub-tenants, "
        f"{reserved} reserved by apps): release those first",
    )


# The declaration gate's rules, in the order they are tried: first those over the whole
# declaration, then, key by key in sorted order, those over one budget key. The first denial is
# the verdict.
TENANT_RULES: tuple[Callable[[DeclarationReview], Verdict | None], ...] = (
    must_declare_pool_keys,
    keeps_pool_keys,
    no_unmapped_devices_under_a_new_bound,
)
KEY_RULES: tuple[Callable[[DeclarationReview, str], Verdict | None], ...] = (
    key_fits_pool,
    sub_tenants_declare_key,
    holds_what_is_inside,
)


def _gate(
    new: Tenant,
    old: Tenant | None,
    pools: Pools,
    pool: str | None,
    catalog: Catalog,
) -> Verdict:
    review = DeclarationReview(new, old, pools, pool, catalog)
    keys = sorted(k for k in new.declaration if is_budget_key(k))
    return first_denial(
        chain(
            (rule(review) for rule in TENANT_RULES),
            (rule(review, key) for key in keys for rule in KEY_RULES),
        )
    )


def declaration_needs_input(new: Tenant, old: Tenant | None) -> bool:
    """Whether the gate needs to read the cluster: the declaration touches the GPU domain, the
    tenant becomes bounded, or it drops a budget key it declared."""
    if any(in_gpu_domain(key) for key in new.declaration):
        return True
    if old is None or not old.bounded:
        return new.bounded
    return new.bounded and any(is_budget_key(k) and old.declares(k) for k in old.declaration)
