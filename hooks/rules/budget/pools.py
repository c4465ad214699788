"""Pools: the bounded tenants over the tenants and apps a review read, with their members,
carve-outs and budgets, and what their arithmetic needs readable."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from hooks.rules.budget.keys import is_budget_key
from hooks.rules.budget.reservations import Catalog, FailedClosed, Reservation, reservation
from hooks.rules.budget.tenancy import App, Tenant, owner_of, parent_namespace

__all__ = ["FailedClosed", "KeyUse", "Pools"]


@dataclass(frozen=True)
class KeyUse:
    """A pool's arithmetic for one key it declares (rule 5): its budget, what the bounded tenants
    in it carve out, what its members' apps reserve, and what is left (below 0 when the pool is
    over its budget: an operator lowered it, or reservations came before the webhook)."""

    key: str
    budget: int
    carved_out: int
    reserved: int

    @property
    def left(self) -> int:
        return self.budget - self.carved_out - self.reserved


class Pools:
    """The pools of bounded tenants (pool roots, members, carve-outs, budgets) over the tenants
    and apps a review read, or over a whole cluster's (the budget report): each namespace's
    root, each pool's members and carve-outs are found once, so the arithmetic of every pool
    together is linear in the apps."""

    def __init__(self, tenants: Iterable[Tenant], apps: Iterable[App] = ()) -> None:
        tenants = tuple(tenants)  # read twice below: a generator would leave `unplaced` empty
        self.tenants = owners(tenants)
        self.unplaced = tuple(t for t in tenants if t.owned_namespace is None)
        self.bounded = bounded_owners(self.tenants)
        self.apps = tuple(apps)
        self._roots: dict[str | None, str | None] = {}
        self._members: dict[str | None, list[App]] | None = None
        self._carving: dict[str | None, dict[str, Tenant]] | None = None
        self._held: dict[int, Reservation] = {}
        self._reserved: dict[str, Counter[str]] = {}
        self._held_under: Catalog | None = None

    def root(self, namespace: str | None) -> str | None:
        if namespace not in self._roots:
            self._roots[namespace] = pool_root(self.tenants, namespace)
        return self._roots[namespace]

    def may_apply(self, namespace: str) -> bool:
        """Whether a budget pool applies to the namespace, or could (an unplaced tenant might own
        a namespace on its way up): the object under review, and the classes, are read only
        then."""
        return self.root(namespace) is not None or bool(self.unsettled(namespace))

    def tenant(self, root: str) -> Tenant:
        return self.bounded[root]

    def carving(self, root: str) -> dict[str, Tenant]:
        """Carve-outs, by the namespace each owns: the bounded tenants that carve their whole
        declaration out of this pool, wherever inside it they are declared. The root tenant owns
        `tenant-root` and has no parent: it is never a sub-tenant of itself."""
        if self._carving is None:
            self._carving = {}
            for namespace, tenant in self.bounded.items():
                parent_root = self.root(parent_namespace(namespace))
                self._carving.setdefault(parent_root, {})[namespace] = tenant
        return dict(self._carving.get(root, {}))

    def carved_out(self, root: str, key: str) -> int:
        return sum(tenant.units(key) for tenant in self.carving(root).values())

    def members(self, root: str) -> list[App]:
        """Members: the apps of every namespace whose pool root is this one (`pool_root`: only
        namespaces a Tenant release names are members)."""
        if self._members is None:
            self._members = {}
            for app in self.apps:
                self._members.setdefault(self.root(app.namespace), []).append(app)
        return list(self._members.get(root, []))

    def held(self, app: App, catalog: Catalog) -> Reservation:
        """What one of these apps reserves under this catalog, worked out once (the same catalog
        throughout a verdict or a report), and only for the apps a pool's arithmetic reads: an
        app that cannot be read fails closed only where it counts."""
        if catalog is not self._held_under:
            self._held, self._reserved, self._held_under = {}, {}, catalog
        if id(app) not in self._held:
            self._held[id(app)] = reservation(app, catalog)
        return self._held[id(app)]

    def reserved(self, root: str, key: str, catalog: Catalog) -> int:
        """What the pool's members reserve of the key, summed once per pool for every key."""
        if catalog is not self._held_under or root not in self._reserved:
            total: Counter[str] = Counter()
            for app in self.members(root):
                total.update(self.held(app, catalog).keys)
            self._reserved[root] = total
        return self._reserved[root][key]

    def key_use(self, root: str, key: str, catalog: Catalog) -> KeyUse:
        """The pool's arithmetic for a key it declares, over the apps these pools were built on
        (the verdicts leave out the app under review; the report counts every app)."""
        return KeyUse(
            key,
            self.budget(root)[key],
            self.carved_out(root, key),
            self.reserved(root, key, catalog),
        )

    def budget(self, root: str) -> dict[str, int]:
        """Budget: each bounded tenant is a pool whose budget is its declaration (budget keys).
        A pool whose own tenant could not be read has no budget anyone can know: FailedClosed."""
        tenant = self.tenant(root)
        if tenant.unreadable is not None:
            raise FailedClosed(tenant.unreadable)
        return {key: tenant.units(key) for key in tenant.declaration if is_budget_key(key)}

    def name(self, root: str) -> str:
        return f"tenant {self.tenant(root).name} ({root})"

    def read_by(self, root: str) -> list[Tenant | App]:
        """What the pool's arithmetic reads: its tenant, the tenants carving out of it, the apps of
        its members, and unplaced tenants declared in a member namespace (any of them could be a
        bounded sub-tenant carving out of the pool) or nowhere known."""
        unplaced = [
            t
            for t in self.unplaced
            if not t.release_namespace or self.root(t.release_namespace) == root
        ]
        return [self.tenant(root), *self.carving(root).values(), *self.members(root), *unplaced]

    def unsettled(self, namespace: str | None) -> list[Tenant]:
        """Unplaced tenants that could own a namespace the walk from this one to its pool root
        passes, where no placed tenant already owns it: any of them could be a bounded tenant
        that makes the pool another one. Once every namespace on the way has its owner, unplaced
        tenants elsewhere (a legacy release in `tenant-root`) change nothing here."""
        could = []
        while namespace is not None:
            owner = owner_of(namespace)
            if namespace not in self.tenants and owner is not None:
                could += [t for t in self.unplaced if t.release_namespace in ("", owner[0])]
            if namespace in self.bounded:
                break
            namespace = parent_namespace(namespace)
        return could

    def require_settled(self, namespace: str | None) -> None:
        """FailedClosed naming the first unplaced tenant that could change this namespace's
        pool."""
        problems = sorted(t.unreadable or t.where for t in self.unsettled(namespace))
        if problems:
            raise FailedClosed(problems[0])

    def require_readable(self, root: str) -> None:
        """FailedClosed naming the first unreadable object this pool's arithmetic reads."""
        problems = sorted(
            obj.unreadable for obj in self.read_by(root) if obj.unreadable is not None
        )
        if problems:
            raise FailedClosed(problems[0])


def claimant(namespace: str, claimed: list[Tenant]) -> Tenant:
    """The tenant owning a namespace; when several releases claim it, none can be trusted: a
    tenant that cannot be read, naming them, which fails closed every verdict that needs it."""
    if len(claimed) == 1:
        return claimed[0]
    first = min(claimed, key=lambda t: t.release_key)
    return replace(first, unreadable=claim_conflict(namespace, claimed))


def claim_conflict(namespace: str, claimed: list[Tenant]) -> str:
    """What is wrong with a namespace that two or more releases claim."""
    first, second = sorted(claimed, key=lambda t: t.release_key)[:2]
    return f"{first.where} and {second.where} both claim tenant namespace {namespace}"


def owners(tenants: Iterable[Tenant]) -> dict[str, Tenant]:
    """The tenant owning each namespace some tenant claims (`claimant` where several do)."""
    claims: dict[str, list[Tenant]] = {}
    for tenant in tenants:
        if tenant.owned_namespace is not None:
            claims.setdefault(tenant.owned_namespace, []).append(tenant)
    return {namespace: claimant(namespace, claimed) for namespace, claimed in claims.items()}


def bounded_owners(owned: Mapping[str, Tenant]) -> dict[str, Tenant]:
    return {namespace: tenant for namespace, tenant in owned.items() if tenant.bounded}


def pool_root(owned: Mapping[str, Tenant], namespace: str | None) -> str | None:
    """Pool root: the first bounded tenant namespace walking up from the namespace, through
    namespaces that Tenant releases name. The membership rule: a namespace no Tenant release names
    (`tenant-a-gone`, whose release is gone: the Tenant chart owns it, so it is being deleted)
    belongs to no pool, and neither does anything below it. The webhook's reads follow Tenant
    releases down from a pool's root; the report, the metrics and `plan` see every release, and
    this one walk makes them count the same members."""
    while namespace is not None:
        tenant = owned.get(namespace)
        if tenant is None:
            return None
        if tenant.bounded:
            return namespace
        namespace = parent_namespace(namespace)
    return None
