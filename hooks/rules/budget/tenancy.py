"""The tenancy tree: which namespace a tenant owns, where it is declared, and the Tenant and app
releases as the rules read them.

Three namespaces are told apart by name: a Tenant's `release_namespace` (where its release is
declared, in its parent's namespace) and `owned_namespace` (the namespace it owns), and an App's
`namespace` (where the app and its release live).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hooks.wire.cozystack import (
    DEFAULT_MAX_REPLICAS,
    DEFAULT_MIN_REPLICAS,
    KUBERNETES,
    KUBERNETES_NODES,
    TENANT,
    VM_INSTANCE,
    NodeGroupSpec,
    VMSpec,
)
from hooks.wire.names import is_dns_label

__all__ = ["KUBERNETES", "KUBERNETES_NODES", "TENANT", "VM_INSTANCE"]

ROOT_NAMESPACE = "tenant-root"
ROOT_TENANT = "root"
# How Cozystack names an app's HelmRelease: the prefix of its kind (its ApplicationDefinition's
# `release.prefix`), then the app's name.
RELEASE_PREFIX = {
    VM_INSTANCE: "vm-instance-",
    KUBERNETES_NODES: "kubernetes-nodes-",
    KUBERNETES: "kubernetes-",
}


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
    """The namespace a tenant owns: `P-x` for a tenant `x` declared in `P`, and `tenant-x` in the
    root's namespace (the root tenant `root` owns `tenant-root` so)."""
    if release_namespace == ROOT_NAMESPACE:
        return f"tenant-{tenant_name}"
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
    def owned_namespace(self) -> str | None:
        """The namespace the tenant owns; None when its name is unknown."""
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
    def release_key(self) -> tuple[str, str]:
        """Its release's namespace and name, which tell one release from any other."""
        return (self.release_namespace, self.release)

    @property
    def where(self) -> str:
        return f"HelmRelease {self.release_namespace}/{self.release}"


@dataclass(frozen=True)
class Group:
    """VMs of one shape that an app may run: the resources its gpus entries name, the cluster
    instance type it names (None: none), and how many such VMs it may run at once (a VM 1, a
    worker pool max(maxReplicas, minReplicas): the autoscaler never goes below its minimum).
    `size_problem` says why a pool's size could not be read (`replicas` is then 0): that fails
    closed only where the group attaches a device."""

    gpus: tuple[str, ...] = ()
    instance_type: str | None = None
    replicas: int = 1
    size_problem: str | None = None


@dataclass(frozen=True)
class App:
    """A VMInstance, a KubernetesNodes or a Kubernetes app: the groups of VMs it may run (one, or
    a Kubernetes app's one per node group). `unreadable` says what could not be read of it.
    `name` is the app's name ("" when its release does not say); `release` the name of its
    HelmRelease ("" for the object under review): every release reserves on its own. A release
    with `values_from` is unreadable too, and stays so when the app under review replaces its
    values: what it takes from elsewhere is merged under the new values."""

    namespace: str
    kind: str
    name: str
    groups: tuple[Group, ...] = ()
    unreadable: str | None = None
    release: str = ""
    values_from: bool = False  # part of its values lives elsewhere (Flux's `spec.valuesFrom`)
    sized: bool = False  # its values set all its reservation reads (the object under review)

    @property
    def identity(self) -> tuple[str, str, str]:
        return (self.namespace, self.kind, self.name)

    def stores(self, other: App) -> bool:
        """This release stores the app `other` (under review): it carries its name label, or it
        carries none and is named as Cozystack names that app's release (`vm-instance-<name>`),
        as a Tenant release without its label is named by its release name."""
        if self.name:
            return self.identity == other.identity
        canonical = RELEASE_PREFIX.get(other.kind, "\0") + other.name
        return (self.namespace, self.kind, self.release) == (other.namespace, other.kind, canonical)

    @property
    def release_key(self) -> tuple[str, str]:
        """Its release's namespace and name, which tell one release from any other."""
        return (self.namespace, self.release)

    @property
    def where(self) -> str:
        """The object to name in a message: its release, or the app under review."""
        if self.release:
            return f"HelmRelease {self.namespace}/{self.release}"
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def listed_as(self) -> str:
        """The name it is listed under: the app's, else its release's (a release without the name
        label)."""
        return self.name or self.release


@dataclass(frozen=True)
class Tenancy:
    """The Tenants and apps a review read (its pool's, never the whole cluster's): declarations and
    reservations are never cached, because the gate itself admits declarations and apps."""

    tenants: tuple[Tenant, ...] = ()
    apps: tuple[App, ...] = ()


def pool_size(max_replicas: int, min_replicas: int) -> int:
    """How many VMs a worker pool may run at once: the autoscaler never goes below its
    minimum."""
    return max(max_replicas, min_replicas)


def group_of(spec: VMSpec) -> Group:
    """One VM's shape, or a worker pool's with its size."""
    replicas = 1
    if isinstance(spec, NodeGroupSpec):
        most, least = spec.max_replicas, spec.min_replicas
        replicas = pool_size(
            DEFAULT_MAX_REPLICAS if most is None else most,
            DEFAULT_MIN_REPLICAS if least is None else least,
        )
    return Group(
        tuple(entry.name for entry in spec.gpus), spec.instance_type or None, replicas=replicas
    )
