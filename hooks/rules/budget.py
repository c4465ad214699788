"""GPU budgets of tenants: reservations, pools and the declaration gate.

The arithmetic is that of Cozystack's tenant quota pools, so that a later pool-wide gate can take
over without changing any verdict. Plain values in, a verdict out; reading the cluster is the
edge's job (`hooks.kubeapi.budget`). What the gate must keep true, after any sequence of admitted
operations that starts from a consistent tree, is the pool invariant: for every pool P and budget
key K it declares, the reservations of P's members plus the carve-outs of the bounded tenants in P
stay within P's budget for K.

Objects that were read but do not decode arrive as data (`unreadable` says what and where). They
deny a verdict only when that verdict's arithmetic reads them; any others are listed in
`Verdict.skipped` so that the route can log them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import chain

from hooks.rules.classes import ClassIdentity, age_key
from hooks.rules.quantity import QuantityError, parse_units
from hooks.wire.cozystack import AppSpec, QuotaValue
from hooks.wire.names import is_dns_label

TOTAL_KEY = "gpuclass.cozystack.io/devices"
CLASS_KEY_SUFFIX = ".gpuclass.cozystack.io/devices"
GPU_DOMAIN = "gpuclass.cozystack.io"
ROOT_NAMESPACE = "tenant-root"
ROOT_TENANT = "root"
DEFAULT_MAX_REPLICAS = 10
VM_INSTANCE = "VMInstance"
KUBERNETES_NODES = "KubernetesNodes"
TENANT = "Tenant"
FAILED_CLOSED = "GPU budget check failed closed: "


def class_key(class_name: str) -> str:
    return f"{class_name}{CLASS_KEY_SUFFIX}"


def in_gpu_domain(key: str) -> bool:
    """A key whose domain ends with `gpuclass.cozystack.io`, dot or no dot, in any case:
    `l40sgpuclass.cozystack.io/devices` is a typo of a budget key, not some other key. A key with
    no `/` is all domain: `gpuclass.cozystack.io` alone is a budget key with its name left off."""
    domain = key.partition("/")[0]
    return domain.strip().lower().endswith(GPU_DOMAIN)


def is_budget_key(key: str) -> bool:
    """Exactly the total key, or `<class>.gpuclass.cozystack.io/devices` for a class name."""
    if key == TOTAL_KEY:
        return True
    class_name = key.removesuffix(CLASS_KEY_SUFFIX)
    return class_name != key and is_dns_label(class_name)


def parse_budget(value: QuotaValue) -> int:
    """A budget value in whole devices; QuantityError when it is not one. A JSON number is held
    to the bounds of a quantity string: whole, non-negative, within int64."""
    if isinstance(value, bool) or value is None:
        raise QuantityError("not a quantity")
    if isinstance(value, int):
        return parse_units(str(value))
    return parse_units(repr(value) if isinstance(value, float) else value)


# --- tenants and their namespaces --------------------------------------------------------------


def parent_namespace(namespace: str | None) -> str | None:
    """Tenant names have no dashes, so a tenant namespace's parent is itself minus its last
    `-segment`; `tenant-x`'s parent is `tenant-root`; `tenant-root` and others have none."""
    if namespace is None or namespace == ROOT_NAMESPACE or not namespace.startswith("tenant-"):
        return None
    parent = namespace.rpartition("-")[0]
    return ROOT_NAMESPACE if parent == "tenant" else parent


def tenant_from_release(release_name: str) -> str | None:
    """The tenant a Tenant release names when it carries no name label: `tenant-x` names `x`
    (tenant names have no dashes); None when the release name names no tenant."""
    name = release_name.removeprefix("tenant-")
    if name == release_name or "-" in name or not is_dns_label(name):
        return None
    return name


def tenant_namespace(release_namespace: str, tenant_name: str) -> str:
    """The namespace a tenant owns: `P-x` for a tenant `x` declared in `P`, `tenant-x` in the
    root's namespace, and `tenant-root` for the root tenant itself."""
    if release_namespace == ROOT_NAMESPACE:
        return ROOT_NAMESPACE if tenant_name == ROOT_TENANT else f"tenant-{tenant_name}"
    return f"{release_namespace}-{tenant_name}"


def owner_of(namespace: str) -> tuple[str, str] | None:
    """Where the Tenant owning a namespace is declared, and its name: the inverse of
    `tenant_namespace`. None for a namespace no tenant owns."""
    if namespace == ROOT_NAMESPACE:
        return ROOT_NAMESPACE, ROOT_TENANT
    parent = parent_namespace(namespace)
    if parent is None:
        return None
    prefix = "tenant-" if parent == ROOT_NAMESPACE else f"{parent}-"
    return parent, namespace.removeprefix(prefix)


@dataclass(frozen=True)
class Tenant:
    """A Tenant app: where it is declared, its name, and its `resourceQuotas`.

    Budget keys hold whole devices, or None where the value does not parse; other keys hold 0
    (any key makes a tenant bounded). `name` is None when the release does not say which tenant
    it is: it then has no known namespace. `unreadable` says what could not be read. `release`
    is the name of its HelmRelease ("" for the object under review): with the namespace it
    identifies the release, and two releases are never one tenant because their names agree.
    """

    release_namespace: str
    name: str | None
    declaration: Mapping[str, int | None] = field(default_factory=dict)
    unreadable: str | None = None
    release: str = ""
    values_from: bool = False  # part of its values lives elsewhere (Flux's `spec.valuesFrom`)

    @property
    def namespace(self) -> str | None:
        if self.name is None:
            return None
        return tenant_namespace(self.release_namespace, self.name)

    @property
    def bounded(self) -> bool:
        """Bounded: a tenant is bounded when it declares anything at all. One that could not be
        read counts as bounded, so that every verdict whose arithmetic it could change reads it
        (and fails closed) instead of silently passing it by."""
        return bool(self.declaration) or self.unreadable is not None

    def units(self, key: str) -> int:
        """Devices declared for the key; a value that does not parse counts as 0."""
        return self.declaration.get(key) or 0

    def declares(self, key: str) -> bool:
        """The key is declared with a value that parses."""
        return self.declaration.get(key) is not None

    @property
    def where(self) -> str:
        return f"HelmRelease {self.release_namespace}/{self.release}"


@dataclass(frozen=True)
class App:
    """A VMInstance or KubernetesNodes app: its GPU entries (resource names), and for worker
    pools their size bounds. `unreadable` says what could not be read of it. `name` is the app's
    name ("" when its release does not say); `release` the name of its HelmRelease ("" for the
    object under review): every release reserves on its own. A release with `values_from` is
    unreadable too, and stays so when the app under review replaces its values: what it takes from
    elsewhere is merged under the new values."""

    namespace: str
    kind: str
    name: str
    gpus: tuple[str, ...] = ()
    max_replicas: int | None = None
    unreadable: str | None = None
    min_replicas: int | None = None
    release: str = ""
    values_from: bool = False  # part of its values lives elsewhere (Flux's `spec.valuesFrom`)

    @property
    def identity(self) -> tuple[str, str, str]:
        return (self.namespace, self.kind, self.name)


@dataclass(frozen=True)
class Tenancy:
    """The Tenants and apps a review read (its pool's, never the whole cluster's): declarations and
    reservations are never cached, because the gate itself admits declarations and apps."""

    tenants: tuple[Tenant, ...] = ()
    apps: tuple[App, ...] = ()


def app_from(
    spec: AppSpec, namespace: str, kind: str, name: str, unreadable: str | None = None
) -> App:
    """An app from its spec (the object under review) or its HelmRelease's values."""
    gpus = tuple(entry.name for entry in spec.gpus)
    return App(namespace, kind, name, gpus, spec.max_replicas, unreadable, spec.min_replicas)


def tenant_declaration(quotas: Mapping[str, QuotaValue]) -> dict[str, int | None]:
    """A `resourceQuotas` map: budget keys in devices (None where the value does not parse),
    other keys as 0."""
    units: dict[str, int | None] = {}
    for key, value in quotas.items():
        if not is_budget_key(key):
            units[key] = 0
            continue
        try:
            units[key] = parse_budget(value)
        except QuantityError:
            units[key] = None
    return units


def quota_problem(quotas: Mapping[str, QuotaValue]) -> str | None:
    """`resourceQuotas.<key>: <why>` for the first budget key (sorted) whose value is not a whole,
    non-negative number of devices; None when every one is."""
    for key in sorted(quotas):
        if is_budget_key(key):
            try:
                parse_budget(quotas[key])
            except QuantityError as error:
                return f"resourceQuotas.{key}: {error}"
    return None


# --- reservations -------------------------------------------------------------------------------


def class_for_resource(resource: str, classes: Iterable[ClassIdentity]) -> ClassIdentity | None:
    """The class a `gpus[]` entry maps to: the oldest class with that resourceName, as in the
    status (creationTimestamp, then name); classes being deleted do not count."""
    candidates = [c for c in classes if c.resource_name == resource and not c.deleting]
    return min(candidates, key=age_key, default=None)


@dataclass(frozen=True)
class Reservation:
    """What an app reserves per budget key (the total key included), and the devices of entries
    that map to no class: their resource names, and how many devices they stand for (counted, not
    repeated: maxReplicas is the tenant's to choose)."""

    keys: Mapping[str, int] = field(default_factory=dict)
    unmapped: frozenset[str] = frozenset()
    unmapped_devices: int = 0

    def get(self, key: str) -> int:
        return self.keys.get(key, 0)


def replicas(app: App) -> int:
    """How many times an app's entries count: a worker pool max(maxReplicas, minReplicas), with
    maxReplicas 10 when unset (the autoscaler never goes below minReplicas)."""
    if app.kind != KUBERNETES_NODES:
        return 1
    most = DEFAULT_MAX_REPLICAS if app.max_replicas is None else app.max_replicas
    return max(most, app.min_replicas or 0)


def reservation(app: App | None, classes: Iterable[ClassIdentity]) -> Reservation:
    """Declared sizes, not use: a VM reserves its entries per class (a halted VM too), a worker
    pool its entries times its size (`replicas`)."""
    if app is None:
        return Reservation()
    classes = tuple(classes)
    per_class: Counter[str] = Counter()
    unmapped = []
    for resource in app.gpus:
        owner = class_for_resource(resource, classes)
        if owner is None:
            unmapped.append(resource)
        else:
            per_class[class_key(owner.name)] += 1
    times = replicas(app)
    keys = {key: count * times for key, count in per_class.items()}
    total = sum(keys.values())
    if total:
        keys[TOTAL_KEY] = total
    return Reservation(keys, frozenset(unmapped), len(unmapped) * times)


def cannot_grow(new: App, old: App | None) -> bool:
    """An update that cannot grow any reservation, whatever the classes: its entries are among the
    old ones and, for a worker pool, its size does not grow. Such a review needs no input."""
    if not new.gpus:
        return True
    if old is None:
        return False
    return not Counter(new.gpus) - Counter(old.gpus) and replicas(new) <= replicas(old)


# --- pools ------------------------------------------------------------------------------------


class FailedClosed(Exception):
    """An object this verdict's arithmetic needs could not be read."""


class Pools:
    """The pools of bounded tenants (pool roots, members, carve-outs, budgets) over the tenants
    and apps a review read."""

    def __init__(self, tenants: Iterable[Tenant], apps: Iterable[App] = ()) -> None:
        tenants = tuple(tenants)  # read twice below: a generator would leave `unplaced` empty
        claims: dict[str, list[Tenant]] = {}
        for tenant in tenants:
            if tenant.namespace is not None:
                claims.setdefault(tenant.namespace, []).append(tenant)
        self.tenants = {ns: _claimant(ns, claimed) for ns, claimed in claims.items()}
        self.unplaced = tuple(t for t in tenants if t.namespace is None)
        self.bounded = {ns: t for ns, t in self.tenants.items() if t.bounded}
        self.apps = tuple(apps)

    def root(self, namespace: str | None) -> str | None:
        """Pool root: the first bounded tenant namespace walking up from the namespace."""
        while namespace is not None:
            if namespace in self.bounded:
                return namespace
            namespace = parent_namespace(namespace)
        return None

    def tenant(self, root: str) -> Tenant:
        return self.bounded[root]

    def carving(self, root: str) -> list[Tenant]:
        """Carve-outs: the bounded tenants that carve their whole declaration out of this pool,
        wherever inside it they are declared. The root tenant owns `tenant-root` and has no
        parent: it is never a sub-tenant of itself."""
        return [
            tenant
            for namespace, tenant in self.bounded.items()
            if self.root(parent_namespace(namespace)) == root
        ]

    def carved_out(self, root: str, key: str) -> int:
        return sum(tenant.units(key) for tenant in self.carving(root))

    def members(self, root: str) -> list[App]:
        """Members: the apps of every namespace whose pool root is this one."""
        return [app for app in self.apps if self.root(app.namespace) == root]

    def reserved(self, root: str, key: str, classes: tuple[ClassIdentity, ...]) -> int:
        return sum(reservation(app, classes).get(key) for app in self.members(root))

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
        return [self.tenant(root), *self.carving(root), *self.members(root), *unplaced]

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


def _claimant(namespace: str, claimed: list[Tenant]) -> Tenant:
    """The tenant owning a namespace; when several releases claim it, none can be trusted: a
    tenant that cannot be read, naming them, which fails closed every verdict that needs it."""
    if len(claimed) == 1:
        return claimed[0]
    first, second = sorted(claimed, key=lambda t: (t.release_namespace, t.release))[:2]
    return replace(
        first,
        declaration={},
        unreadable=(f"{first.where} and {second.where} both claim tenant namespace {namespace}"),
    )


def pool_may_apply(tenants: Iterable[Tenant], namespace: str) -> bool:
    """Whether a budget pool applies to the namespace, or could (an unplaced tenant might own a
    namespace on its way up): the object under review is read only then."""
    pools = Pools(tenants)
    return pools.root(namespace) is not None or bool(pools.unsettled(namespace))


def unreadable_objects(tenants: Iterable[Tenant], apps: Iterable[App]) -> tuple[str, ...]:
    objects: tuple[Tenant | App, ...] = (*tenants, *apps)
    return tuple(sorted(o.unreadable for o in objects if o.unreadable is not None))


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    skipped: tuple[str, ...] = ()


ALLOWED = Verdict(True)


def _decided(
    decide: Callable[[], Verdict], tenants: Iterable[Tenant], apps: Iterable[App]
) -> Verdict:
    """The verdict, denied naming the first unreadable object its arithmetic needed; otherwise
    carrying the unreadable objects it did not need, for the route to log."""
    try:
        verdict = decide()
    except FailedClosed as unreadable:
        return Verdict(False, f"{FAILED_CLOSED}{unreadable}")
    return replace(verdict, skipped=unreadable_objects(tenants, apps))


def check_app(
    *,
    new: App,
    old: App | None,
    apps: Iterable[App],
    tenants: Iterable[Tenant],
    classes: Iterable[ClassIdentity],
    creating: bool | None = None,
) -> Verdict:
    """The app check (`APP_RULES`) for a VMInstance or KubernetesNodes create (old None) or
    update.

    The pool's reservations count every app of every member namespace, the app under review with
    its new value and not its old one. Only growth is checked: a key whose reservation does not
    grow passes, even in a pool already over budget. A key the pool does not declare is unbounded.
    `creating` says the review is a CREATE (by default, when there is no old value; an UPDATE
    whose old object does not decode says so itself).
    """
    classes, tenants, apps = tuple(classes), tuple(tenants), tuple(apps)
    stored = stored_self(new, apps, old is None if creating is None else creating)
    # The app's own release is counted with its new value, not its old one; when several
    # releases say they store it, none can be left out (each may reserve).
    others = tuple(app for app in apps if app not in stored or len(stored) > 1)
    pools = Pools(tenants, others)

    def decide() -> Verdict:
        partial = [app for app in stored if app.values_from]
        if partial and pools.root(new.namespace) is not None:
            raise FailedClosed(partial[0].unreadable or partial[0].release)
        if len(stored) > 1 and pools.root(new.namespace) is not None:
            first, second = sorted(f"HelmRelease {a.namespace}/{a.release}" for a in stored)[:2]
            raise FailedClosed(f"{first} and {second} both store {new.kind} {new.name}")
        return _app_verdict(new, old, pools, classes)

    return _decided(decide, tenants, others)


def stored_self(new: App, apps: Iterable[App], creating: bool) -> list[App]:
    """The releases that store the app under review: those carrying its identity. A CREATE has
    no stored self (a release that already carries the identity is another release, and keeps
    its reservation), and neither has an app without a name yet (`generateName`), which would
    otherwise match every release without a name label."""
    if creating or not new.name:
        return []
    return [app for app in apps if app.identity == new.identity]


@dataclass(frozen=True)
class AppReview:
    """What the app rules read: the app under review, its old value, its pool and the classes."""

    new: App
    old: App | None
    pools: Pools
    root: str
    classes: tuple[ClassIdentity, ...]

    @property
    def wanted(self) -> Reservation:
        return reservation(self.new, self.classes)

    @property
    def before(self) -> Reservation:
        return reservation(self.old, self.classes)


def no_unmapped_devices_escape(review: AppReview) -> Verdict | None:
    """Entries that map to no class are refused in a pool that declares any GPU budget key, when
    they grow: such a device would escape the budget."""
    wanted, before = review.wanted, review.before
    if wanted.unmapped_devices > before.unmapped_devices and review.pools.budget(review.root):
        names = ", ".join(sorted(wanted.unmapped))
        return Verdict(
            False,
            f"gpus entries {names} map to no GPUClass, and the pool of "
            f"{review.pools.name(review.root)} declares a GPU budget: such a device would escape "
            "it. Use the resourceName of a GPUClass.",
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
        carved = pools.carved_out(root, key)
        reserved = pools.reserved(root, key, review.classes)
        if reserved + carved + wanted.get(key) > budget[key]:
            left = max(budget[key] - carved - reserved, 0)
            return Verdict(
                False,
                f"{key}: this {new.kind} needs {wanted.get(key)}, the pool of "
                f"{pools.name(root)} has {left} left (budget {budget[key]}, {carved} carved out "
                f"for sub-tenants, {reserved} reserved by other apps)",
            )
    return None


# The app check's rules, in the order they are tried: the first denial is the verdict.
APP_RULES: tuple[Callable[[AppReview], Verdict | None], ...] = (
    no_unmapped_devices_escape,
    app_fits_its_pool,
)


def _app_verdict(
    new: App, old: App | None, pools: Pools, classes: tuple[ClassIdentity, ...]
) -> Verdict:
    pools.require_settled(new.namespace)
    root = pools.root(new.namespace)
    if root is None:
        return ALLOWED
    review = AppReview(new, old, pools, root, classes)
    return _first_denial(rule(review) for rule in APP_RULES)


def _first_denial(verdicts: Iterable[Verdict | None]) -> Verdict:
    """The first denial of rules tried in order (later rules are not run), else allowed."""
    return next((v for v in verdicts if v is not None), ALLOWED)


def check_declaration(
    *,
    new: Tenant,
    old: Tenant | None,
    apps: Iterable[App],
    tenants: Iterable[Tenant],
    classes: Iterable[ClassIdentity],
    creating: bool | None = None,
) -> Verdict:
    """The declaration gate for a Tenant create (old None) or update.

    The tenant carves out of P, the pool of the namespace its release lives in (the root tenant
    of none). Intermediate unbounded tenants are members of P, so the limit is P's budget, not the
    direct parent's. Stored values of the tenant under review are replaced by the new ones; the
    old object is only the baseline of growth (a value that does not parse counts as 0).
    """
    classes, tenants, apps = tuple(classes), tuple(tenants), tuple(apps)
    refused = declaration_refused(new)
    if refused is not None:
        return Verdict(False, refused)
    claiming = [t for t in tenants if t.namespace is not None and t.namespace == new.namespace]
    # On CREATE nothing stored is the tenant under review: a release already claiming its
    # namespace is another tenant.
    creating = old is None if creating is None else creating
    stored = [] if creating else claiming
    others = tuple(t for t in tenants if t not in stored)
    pools = Pools((*others, new), apps)
    pool = pools.root(parent_namespace(new.namespace))

    def decide() -> Verdict:
        if new.namespace is None:
            raise FailedClosed(
                f"Tenant in {new.release_namespace} has no name: its namespace, and the pool "
                "it carves out of, are unknown"
            )
        if creating and claiming:
            return Verdict(
                False,
                f"tenant {new.name}: its namespace {new.namespace} is already claimed by "
                f"{sorted(t.where for t in claiming)[0]}; two releases of one tenant would make "
                "every budget verdict in its pool fail closed",
            )
        if len(stored) > 1:
            raise FailedClosed(_claimant(new.namespace, stored).unreadable or "")
        if stored and stored[0].values_from:
            # its quotas from elsewhere are merged under the new ones: the declaration under
            # review is not the whole of it
            raise FailedClosed(stored[0].unreadable or stored[0].where)
        pools.require_settled(new.release_namespace)
        return _gate(new, old, pools, pool, classes)

    return _decided(decide, others, apps)


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
    pool) and the classes."""

    new: Tenant
    old: Tenant | None
    pools: Pools
    pool: str | None
    classes: tuple[ClassIdentity, ...]

    @property
    def own(self) -> str:
        """The tenant's own namespace (the tenant under review always has a name)."""
        own = self.new.namespace
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
    holders = {
        app: reservation(app, review.classes).unmapped
        for app in pools.members(own)
        if reservation(app, review.classes).unmapped
    }
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
    reserved = pools.reserved(pool, key, review.classes)
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
    leaving_out = sorted(t.namespace or "" for t in pools.carving(own) if not t.declares(key))
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
    reserved = pools.reserved(own, key, review.classes)
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
    classes: tuple[ClassIdentity, ...],
) -> Verdict:
    review = DeclarationReview(new, old, pools, pool, classes)
    keys = sorted(k for k in new.declaration if is_budget_key(k))
    return _first_denial(
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
