"""The app check: a VMInstance or KubernetesNodes create or update against its pool."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hooks.rules.budget.pools import FailedClosed, Pools
from hooks.rules.budget.reservations import Catalog, Reservation, SizeUnreadable, reservation
from hooks.rules.budget.tenancy import App, Tenant
from hooks.rules.budget.verdicts import ALLOWED, Verdict, decided, first_denial


class AppCheck:
    """The app check (`APP_RULES`) of one VMInstance or KubernetesNodes create (old None) or
    update, over the pools built once for the review.

    The pool's reservations count every app of every member namespace, the app under review with
    its new value and not its old one. Only growth is checked: a key whose reservation does not
    grow passes, even in a pool already over budget. A key the pool does not declare is unbounded.
    `creating` says the review is a CREATE (by default, when there is no old value; an UPDATE
    whose old object does not decode says so itself).
    """

    def __init__(
        self,
        *,
        new: App,
        old: App | None,
        apps: Iterable[App],
        tenants: Iterable[Tenant],
        creating: bool | None = None,
    ) -> None:
        apps = tuple(apps)
        self.new, self.old, self.tenants = new, old, tuple(tenants)
        self.stored = stored_self(new, apps, old is None if creating is None else creating)
        # The app's own release is counted with its new value, not its old one; when several
        # releases say they store it, none can be left out (each may reserve).
        self.others = tuple(app for app in apps if app not in self.stored or len(self.stored) > 1)
        self.pools = Pools(self.tenants, self.others)

    @property
    def needs_catalog(self) -> bool:
        """Outside every pool (settled) the verdict is allowed whatever the catalog says."""
        return self.pools.may_apply(self.new.namespace)

    def verdict(self, catalog: Catalog) -> Verdict:
        new, stored, pools = self.new, self.stored, self.pools

        def decide() -> Verdict:
            # Flux merges what the stored release takes from elsewhere under the new values:
            # known only where the new values set all the reservation reads.
            partial = [app for app in stored if app.values_from and not new.sized]
            if partial and pools.root(new.namespace) is not None:
                raise FailedClosed(partial[0].unreadable or partial[0].release)
            if len(stored) > 1 and pools.root(new.namespace) is not None:
                releases = sorted(f"HelmRelease {a.namespace}/{a.release}" for a in stored)
                raise FailedClosed(
                    f"{releases[0]} and {releases[1]} both store {new.kind} {new.name}"
                )
            return _app_verdict(new, self.old, pools, catalog)

        return decided(decide, self.tenants, self.others)


def stored_self(new: App, apps: Iterable[App], creating: bool) -> list[App]:
    """The releases that store the app under review (`App.stores`: an app without a name yet,
    under `generateName`, is stored in none). A CREATE has no stored self: a release that already
    carries the identity is another release, and keeps its reservation."""
    if creating:
        return []
    return [app for app in apps if app.stores(new)]


@dataclass(frozen=True)
class AppReview:
    """What the app rules read: the app under review and what it reserves, its old value's
    reservation, its pool and the catalog."""

    new: App
    wanted: Reservation
    before: Reservation
    pools: Pools
    root: str
    catalog: Catalog


def no_unmapped_devices_escape(review: AppReview) -> Verdict | None:
    """Devices that map to no class (a gpus entry's, or an instance type's) are refused in a pool
    that declares any GPU budget key, when they grow: such a device would escape the budget."""
    wanted, before = review.wanted, review.before
    if wanted.unmapped_devices > before.unmapped_devices and review.pools.budget(review.root):
        names = ", ".join(sorted(wanted.unmapped))
        return Verdict(
            False,
            f"devices {names} map to no GPUClass, and the pool of "
            f"{review.pools.name(review.root)} declares a GPU budget: such a device would escape "
            "it. Use the resourceName of a GPUClass, in gpus entries or through an instance type.",
        )
    return None


def app_fits_its_pool(review: AppReview) -> Verdict | None:
    """Within the pool: every key that grows fits what the pool has left; keys the pool does not
    declare are unbounded."""
    pools, root, new = review.pools, review.root, review.new
    wanted, before = review.wanted, review.before
    budget = pools.budget(root)
    for key in sorted(wanted.keys):
        if key not in budget or wanted.get(key) <= before.get(key):
            continue
        pools.require_readable(root)  # the pool's arithmetic, read only for a key that grows
        use = pools.key_use(root, key, review.catalog)
        if wanted.get(key) > use.left:
            return Verdict(
                False,
                f"{key}: this {new.kind} needs {wanted.get(key)}, the pool of "
                f"{pools.name(root)} has {max(use.left, 0)} left (budget {use.budget}, "
                f"{use.carved_out} carved out for sub-tenants, {use.reserved} reserved by other "
                "apps)",
            )
    return None


# The app check's rules, in the order they are tried: the first denial is the verdict.
APP_RULES: tuple[Callable[[AppReview], Verdict | None], ...] = (
    no_unmapped_devices_escape,
    app_fits_its_pool,
)


def _app_verdict(new: App, old: App | None, pools: Pools, catalog: Catalog) -> Verdict:
    pools.require_settled(new.namespace)
    root = pools.root(new.namespace)
    if root is None:
        return ALLOWED
    try:
        wanted = reservation(new, catalog)
    except SizeUnreadable as invalid:
        # the app under review's own field: a request to correct, not an input to wait for
        return Verdict(False, f"object is not a valid app: {invalid.problem}")
    review = AppReview(new, wanted, reservation(old, catalog), pools, root, catalog)
    return first_denial(rule(review) for rule in APP_RULES)
