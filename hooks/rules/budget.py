"""GPU budgets of tenants: reservations, pools and the declaration gate (budget-admission.md).

The arithmetic is that of Cozystack's tenant quota pools, so that a later pool-wide gate can take
over without changing any verdict. Plain values in, a verdict out; reading the cluster is
`hooks.kubeapi`'s job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hooks.rules.classes import ClassIdentity, age_key
from hooks.rules.quantity import QuantityError, parse_units
from hooks.wire.admission import AppSpec
from hooks.wire.names import is_dns_label

TOTAL_KEY = "gpuclass.cozystack.io/devices"
CLASS_KEY_SUFFIX = ".gpuclass.cozystack.io/devices"
GPU_DOMAIN = "gpuclass.cozystack.io"
ROOT_NAMESPACE = "tenant-root"
ROOT_TENANT = "root"
DEFAULT_MAX_REPLICAS = 10
VM_INSTANCE = "VMInstance"
KUBERNETES_NODES = "KubernetesNodes"


def class_key(class_name: str) -> str:
    return f"{class_name}{CLASS_KEY_SUFFIX}"


def in_gpu_domain(key: str) -> bool:
    """A key in the GPU domain: `gpuclass.cozystack.io/...` or `*.gpuclass.cozystack.io/...`."""
    prefix, slash, _ = key.partition("/")
    return bool(slash) and (prefix == GPU_DOMAIN or prefix.endswith("." + GPU_DOMAIN))


def is_budget_key(key: str) -> bool:
    """Exactly the total key, or `<class>.gpuclass.cozystack.io/devices` for a class name."""
    if key == TOTAL_KEY:
        return True
    class_name = key.removesuffix(CLASS_KEY_SUFFIX)
    return class_name != key and is_dns_label(class_name)


# --- tenants and their namespaces --------------------------------------------------------------


def parent_namespace(namespace: str) -> str | None:
    """Tenant names have no dashes, so a tenant namespace's parent is itself minus its last
    `-segment`; `tenant-x`'s parent is `tenant-root`; `tenant-root` and others have none."""
    if namespace == ROOT_NAMESPACE or not namespace.startswith("tenant-"):
        return None
    parent = namespace.rpartition("-")[0]
    return ROOT_NAMESPACE if parent == "tenant" else parent


def tenant_namespace(release_namespace: str, tenant_name: str) -> str:
    """The namespace a tenant owns: `P-x` for a tenant `x` declared in `P`, `tenant-x` in the
    root's namespace, and `tenant-root` for the root tenant itself."""
    if release_namespace == ROOT_NAMESPACE:
        return ROOT_NAMESPACE if tenant_name == ROOT_TENANT else f"tenant-{tenant_name}"
    return f"{release_namespace}-{tenant_name}"


def within(namespace: str, tenant_ns: str) -> bool:
    """The namespace is the tenant's own or one of its descendants'."""
    if tenant_ns == ROOT_NAMESPACE:
        return namespace == ROOT_NAMESPACE or namespace.startswith("tenant-")
    return namespace == tenant_ns or namespace.startswith(tenant_ns + "-")


@dataclass(frozen=True)
class Tenant:
    """A Tenant app: where it is declared, its name, and its `resourceQuotas` in units."""

    release_namespace: str
    name: str
    declaration: Mapping[str, int]

    @property
    def namespace(self) -> str:
        return tenant_namespace(self.release_namespace, self.name)

    @property
    def bounded(self) -> bool:
        """Rule 1: a tenant is bounded when it declares anything at all."""
        return bool(self.declaration)


@dataclass(frozen=True)
class App:
    """A VMInstance or KubernetesNodes app: its GPU entries (resource names), and for worker
    pools their maximum size."""

    namespace: str
    kind: str
    name: str
    gpus: tuple[str, ...] = ()
    max_replicas: int | None = None

    @property
    def identity(self) -> tuple[str, str, str]:
        return (self.namespace, self.kind, self.name)


class InputUnreadable(Exception):
    """Raised by whatever supplies the inputs when it cannot; the message says what, in words a
    tenant's denial can carry (the webhook fails closed)."""


def declaration(quotas: Mapping[str, str | int], where: str) -> dict[str, int]:
    """A `resourceQuotas` map in units. Only budget keys need a value (whole units); any key
    makes a tenant bounded, so the others are kept with 0."""
    units = {}
    for key, value in quotas.items():
        if not is_budget_key(key):
            units[key] = 0
            continue
        try:
            units[key] = parse_units(str(value))
        except QuantityError as error:
            raise InputUnreadable(f"{where}: resourceQuotas {key}: {error}") from None
    return units


def app_from(spec: AppSpec, namespace: str, kind: str, name: str) -> App:
    """An app from its spec (the object under review) or its HelmRelease's values."""
    return App(namespace, kind, name, tuple(g.name for g in spec.gpus), spec.max_replicas)


# --- reservations -------------------------------------------------------------------------------


def class_for_resource(resource: str, classes: Iterable[ClassIdentity]) -> ClassIdentity | None:
    """The class a `gpus[]` entry maps to: the oldest class with that resourceName, as in the
    status (creationTimestamp, then name); classes being deleted do not count."""
    candidates = [c for c in classes if c.resource_name == resource and not c.deleting]
    return min(candidates, key=age_key, default=None)


@dataclass(frozen=True)
class Reservation:
    """What an app reserves per budget key (the total key included), and its unmapped entries."""

    keys: Mapping[str, int] = field(default_factory=dict)
    unmapped: tuple[str, ...] = ()

    def get(self, key: str) -> int:
        return self.keys.get(key, 0)


def reservation(app: App | None, classes: Iterable[ClassIdentity]) -> Reservation:
    """Declared sizes, not use: a VM reserves its entries per class (a halted VM too), a worker
    pool its entries times maxReplicas (10 when unset)."""
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
    times = 1
    if app.kind == KUBERNETES_NODES:
        times = DEFAULT_MAX_REPLICAS if app.max_replicas is None else app.max_replicas
    keys = {key: count * times for key, count in per_class.items()}
    total = sum(keys.values())
    if total:
        keys[TOTAL_KEY] = total
    return Reservation(keys, tuple(unmapped) * times)


# --- pools ------------------------------------------------------------------------------------


class Pools:
    """The pools of bounded tenants (rules 2 to 5)."""

    def __init__(self, tenants: Iterable[Tenant]) -> None:
        self.tenants = {t.namespace: t for t in tenants}
        self.bounded = {ns: t for ns, t in self.tenants.items() if t.bounded}

    def root(self, namespace: str | None) -> str | None:
        """Rule 2: the first bounded tenant namespace walking up from the namespace."""
        while namespace is not None:
            if namespace in self.bounded:
                return namespace
            namespace = parent_namespace(namespace)
        return None

    def budget(self, root: str) -> Mapping[str, int]:
        """Rule 3: each bounded tenant is a pool whose budget is its declaration."""
        return self.bounded[root].declaration

    def carved_out(self, root: str) -> Counter[str]:
        """Rule 4: every bounded tenant carves its whole declaration out of its parent's pool."""
        carved: Counter[str] = Counter()
        for namespace, tenant in self.bounded.items():
            if namespace != root and self.root(parent_namespace(namespace)) == root:
                carved.update(tenant.declaration)
        return carved

    def available(self, root: str) -> dict[str, int]:
        """Rule 5: per key the budget declares, max(budget - carved out, 0)."""
        carved = self.carved_out(root)
        return {key: max(units - carved[key], 0) for key, units in self.budget(root).items()}

    def declares_gpu_keys(self, root: str) -> bool:
        return any(is_budget_key(key) for key in self.budget(root))

    def name(self, root: str) -> str:
        return self.bounded[root].name


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""


ALLOWED = Verdict(True)


def check_app(
    *,
    new: App,
    old: App | None,
    apps: Iterable[App],
    tenants: Iterable[Tenant],
    classes: Iterable[ClassIdentity],
) -> Verdict:
    """Rules 6 and 7 for a VMInstance or KubernetesNodes create (old None) or update.

    The pool's reservations count every app of every member namespace, the app under review with
    its new value and not its old one. Only growth is checked: a key whose reservation does not
    grow passes, even in a pool already over budget. A key the pool does not declare is unbounded.
    """
    classes = tuple(classes)
    pools = Pools(tenants)
    root = pools.root(new.namespace)
    if root is None:
        return ALLOWED
    wanted, before = reservation(new, classes), reservation(old, classes)
    pool = f"tenant {pools.name(root)} ({root})"
    if len(wanted.unmapped) > len(before.unmapped) and pools.declares_gpu_keys(root):
        names = ", ".join(sorted(set(wanted.unmapped)))
        return Verdict(
            False,
            f"gpus entries {names} map to no GPUClass, and the pool of {pool} declares a GPU "
            "budget: such a device would escape it. Use the resourceName of a GPUClass.",
        )
    budget = pools.budget(root)
    available = pools.available(root)
    for key in sorted(wanted.keys):
        if key not in budget or wanted.get(key) <= before.get(key):
            continue
        others = sum(
            reservation(app, classes).get(key)
            for app in apps
            if app.identity != new.identity and pools.root(app.namespace) == root
        )
        if others + wanted.get(key) > available[key]:
            left = max(available[key] - others, 0)
            return Verdict(
                False,
                f"{key}: this {new.kind} needs {wanted.get(key)}, the pool of {pool} has {left} "
                f"left (budget {budget[key]}, {budget[key] - available[key]} carved out for "
                f"sub-tenants, {others} reserved by other apps)",
            )
    return ALLOWED


def check_declaration(
    *,
    new: Tenant,
    old: Tenant | None,
    apps: Iterable[App],
    tenants: Iterable[Tenant],
    classes: Iterable[ClassIdentity],
) -> Verdict:
    """The declaration gate for a Tenant create (old None) or update.

    - A key in the GPU domain that is not a budget key is refused: the tenant chart would keep it
      out of the ResourceQuota and nothing would enforce it.
    - For each GPU key both the parent and the tenant declare, growth must fit: the parent's
      declaration less its other children's and the reservations of its pool's members outside
      bounded sub-tenants (the tenant under review excluded).
    - A tenant that becomes bounded inside a pool declaring GPU keys must declare them too.
    """
    classes = tuple(classes)
    stray = sorted(k for k in new.declaration if in_gpu_domain(k) and not is_budget_key(k))
    if stray:
        return Verdict(
            False,
            f"{', '.join(stray)}: not a GPU budget key; use {TOTAL_KEY} or "
            f"<class>{CLASS_KEY_SUFFIX}",
        )
    others = [t for t in tenants if t.namespace != new.namespace]
    pools = Pools(others)
    parent = pools.tenants.get(new.release_namespace)
    if parent is not None:
        for key in sorted(k for k in new.declaration if is_budget_key(k)):
            if key not in parent.declaration:
                continue
            previous = old.declaration.get(key, 0) if old is not None else 0
            if new.declaration[key] <= previous:
                continue
            siblings = sum(
                t.declaration.get(key, 0) for t in others if t.release_namespace == parent.namespace
            )
            root = pools.root(parent.namespace)
            reserved = sum(
                reservation(app, classes).get(key)
                for app in apps
                if pools.root(app.namespace) == root and not within(app.namespace, new.namespace)
            )
            limit = parent.declaration[key] - siblings - reserved
            if new.declaration[key] > limit:
                return Verdict(
                    False,
                    f"{key}: tenant {new.name} declares {new.declaration[key]}, its parent "
                    f"{parent.name} can give {max(limit, 0)} (declared {parent.declaration[key]}, "
                    f"{siblings} declared by its other sub-tenants, {reserved} reserved by apps)",
                )
    if new.bounded:
        root = pools.root(new.release_namespace)
        if root is not None:
            required = {k for k in pools.budget(root) if is_budget_key(k)}
            missing = sorted(required - set(new.declaration))
            if missing:
                return Verdict(
                    False,
                    f"tenant {new.name} declares a quota inside the pool of tenant "
                    f"{pools.name(root)}, which has a GPU budget: declare {', '.join(missing)} "
                    "too (0 is allowed), or it would escape that budget",
                )
    return ALLOWED
