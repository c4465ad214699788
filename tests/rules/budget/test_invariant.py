"""The pool invariant of GPU budgets under random tenant trees and random admitted operations.

For every pool P and budget key K it declares: reservations of P's members + carve-outs of the
bounded tenants in P <= P's budget for K. Starting from a consistent tree, random CREATE and UPDATE
operations of Tenants, VMInstances, KubernetesNodes and Kubernetes apps go through the webhook's own
review functions and are applied only when admitted; the invariant is checked after every step.
Apps attach devices through their gpus entries and through the cluster instance types they name
(absent: Cozystack's default `u1.medium`), worker pools and each node group times their size; the
webhook reads every release as Cozystack's API writes it (`valuesFrom` the platform's values
Secret, values as sent, no defaults stored).

The model below is written apart from `hooks.rules.budget` on purpose: it states the invariant and
what a consistent tree is, and the webhook must agree with it on every verdict. A false denial (the
root tenant counted as its own sub-tenant) fails the test as surely as an escape (a budget passed
through an unbounded intermediate tenant).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hooks.controllers.budget import review_app, review_tenant
from hooks.rules.budget.instance_types import catalog_of
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import App, Tenancy, Tenant
from hooks.rules.classes import ClassIdentity, class_identity
from hooks.wire.admission import AdmissionRequest
from hooks.wire.kube import GPUClass
from tests import cozystack
from tests.builders import as_wire, dra_class, gpuclass, scoped_tenancy
from tests.profiles import examples

L40S, H100 = "nvidia.com/NVIDIA_L40S-24Q", "nvidia.com/GH100_H100_PCIE"
# A DRA class: a VM's gpus entry names its DeviceClass.
A10_VFIO = "a10-vfio.gpuclass.cozystack.io"
CLASS_OBJECTS = (
    gpuclass("l40s", resource=L40S, created="2026-01-01T00:00:00Z"),
    gpuclass("h100", resource=H100, created="2026-02-01T00:00:00Z"),
    dra_class("a10-vfio", created="2026-02-15T00:00:00Z"),
)
CLASSES = tuple(class_identity(as_wire(c, GPUClass)) for c in CLASS_OBJECTS)
CLASS_OF = {
    L40S: "l40s.gpuclass.cozystack.io/devices",
    H100: "h100.gpuclass.cozystack.io/devices",
    A10_VFIO: "a10-vfio.gpuclass.cozystack.io/devices",
}
TOTAL = "gpuclass.cozystack.io/devices"
BUDGET_KEYS = (TOTAL, *CLASS_OF.values())
QUOTA_KEYS = (*BUDGET_KEYS, "requests.cpu")
NAMES = ("a", "b", "c", "d", "e", "f")
PLATFORM_VALUES = "cozystack-values"
# The cluster instance types of the model and what each attaches: Cozystack's default, which
# attaches nothing, and two a hoster defined. An instance type no object names attaches nothing.
INSTANCE_TYPES: dict[str, tuple[str, ...]] = {
    "u1.medium": (),
    "gpu.l40s": (L40S,),
    "gpu.mixed": (L40S, H100),
    "gpu.a10": (A10_VFIO,),
}
DEFAULTS = {"instanceType": "u1.medium", "maxReplicas": 10, "minReplicas": 0}


def instance_type_objects(attaches: dict[str, tuple[str, ...]]) -> list[msgspec.Raw]:
    return [
        msgspec.Raw(
            json.dumps(
                {
                    "apiVersion": "instancetype.kubevirt.io/v1beta1",
                    "kind": "VirtualMachineClusterInstancetype",
                    "metadata": {"name": name},
                    "spec": {
                        "gpus": [
                            {"name": f"gpu{i}", "deviceName": d} for i, d in enumerate(devices)
                        ]
                    },
                }
            ).encode()
        )
        for name, devices in attaches.items()
    ]


CATALOG = catalog_of(CLASSES, instance_type_objects(INSTANCE_TYPES))


def vm_shapes(kind: str, spec: dict[str, Any]) -> list[tuple[list[str], int]]:
    """What each VM of an app attaches, and how many such VMs it may run, read from the spec as
    sent with the schema's defaults for what it leaves out; a Kubernetes app with no node groups
    runs the default `md0` (no gpus, `u1.medium`)."""

    def one(values: dict[str, Any]) -> list[str]:
        devices = [g["name"] for g in values.get("gpus") or []]
        instance_type = values.get("instanceType", DEFAULTS["instanceType"])
        return devices + list(INSTANCE_TYPES.get(instance_type, ()) if instance_type else ())

    def size(values: dict[str, Any]) -> int:
        return max(
            values.get("maxReplicas", DEFAULTS["maxReplicas"]),
            values.get("minReplicas", DEFAULTS["minReplicas"]),
        )

    if kind == "VMInstance":
        return [(one(spec), 1)]
    if kind == "KubernetesNodes":
        return [(one(spec), size(spec))]
    groups = spec.get("nodeGroups") or {"md0": {}}
    return [(one(group), size(group)) for group in groups.values()]


# --- the model -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Releases:
    """The cluster as the API server would list its releases, namespace by namespace."""

    cluster: Cluster

    def tenants(self, release_namespace: str, names: Sequence[str]) -> list[Tenant | App]:
        return [
            t
            for t in self.cluster.everything().tenants
            if t.release_namespace == release_namespace and t.name in names
        ]

    def unnamed(self, release_namespace: str) -> list[Tenant | App]:
        return []  # every release of these clusters carries its name label

    def namespace(self, namespace: str) -> list[Tenant | App]:
        everything = self.cluster.everything()
        return [
            *(t for t in everything.tenants if t.release_namespace == namespace),
            *(a for a in everything.apps if a.namespace == namespace),
        ]


def stored(release: dict[str, Any]) -> Tenant | App:
    """A release as the webhook reads it from the API server."""
    return release_object(msgspec.Raw(json.dumps(release).encode()), PLATFORM_VALUES)


def own_namespace(release_namespace: str, name: str) -> str:
    if release_namespace == "tenant-root":
        return "tenant-root" if name == "root" else f"tenant-{name}"
    return f"{release_namespace}-{name}"


def parent_of(namespace: str) -> str | None:
    if namespace == "tenant-root":
        return None
    head = namespace.rsplit("-", 1)[0]
    return "tenant-root" if head == "tenant" else head


@dataclass
class Cluster:
    # (release namespace, name) -> resourceQuotas in devices
    tenants: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    # (namespace, kind, name) -> the app's spec as sent
    apps: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)

    def copy(self) -> Cluster:
        return Cluster(dict(self.tenants), dict(self.apps))

    # What the webhook reads.
    def catalog(self) -> Catalog:
        return CATALOG

    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        # The webhook's own way of reading only the pools a review is about: a release it failed
        # to read would show as a verdict the model disagrees with.
        return scoped_tenancy(Releases(self), namespaces, subtrees)

    def everything(self) -> Tenancy:
        tenants = (
            stored(cozystack.helmrelease("Tenant", r, n, {"resourceQuotas": d} if d else {}))
            for (r, n), d in self.tenants.items()
        )
        apps = (
            stored(cozystack.helmrelease(k, ns, n, spec)) for (ns, k, n), spec in self.apps.items()
        )
        return Tenancy(
            tuple(t for t in tenants if isinstance(t, Tenant)),
            tuple(a for a in apps if isinstance(a, App)),
        )

    # The invariant, stated from scratch.
    def declarations(self) -> dict[str, dict[str, int]]:
        """Bounded tenants by the namespace they own."""
        return {own_namespace(r, n): d for (r, n), d in self.tenants.items() if d}

    def pool_of(self, namespace: str | None) -> str | None:
        """The first bounded tenant up from the namespace, through namespaces Tenant releases
        name: a namespace no release names is in no pool."""
        named = {own_namespace(r, n) for r, n in self.tenants}
        bounded = self.declarations()
        while namespace is not None and namespace not in bounded:
            if namespace not in named:
                return None
            namespace = parent_of(namespace)
        return namespace

    def held(self, pool: str, key: str) -> int:
        """Reservations of the pool's members plus the carve-outs of bounded tenants in it."""
        total = 0
        for (namespace, kind, _), spec in self.apps.items():
            if self.pool_of(namespace) == pool:
                for devices, times in vm_shapes(kind, spec):
                    per_key = Counter(CLASS_OF[g] for g in devices)
                    total += times * (sum(per_key.values()) if key == TOTAL else per_key[key])
        for namespace, declared in self.declarations().items():
            if namespace != pool and self.pool_of(parent_of(namespace)) == pool:
                total += declared.get(key, 0)
        return total

    def breaches(self) -> list[str]:
        return [
            f"{pool} {key}: {self.held(pool, key)} held of {declared[key]}"
            for pool, declared in self.declarations().items()
            for key in BUDGET_KEYS
            if key in declared and self.held(pool, key) > declared[key]
        ]

    def inconsistencies(self) -> list[str]:
        """A bounded tenant leaving out a budget key of the pool it carves out of."""
        declared = self.declarations()
        found = []
        for namespace, keys in declared.items():
            pool = self.pool_of(parent_of(namespace))
            if pool is not None:
                missing = [k for k in BUDGET_KEYS if k in declared[pool] and k not in keys]
                found += [f"{namespace} leaves out {k} of {pool}" for k in missing]
        return found


# --- operations through the webhook ----------------------------------------------------------


def request(kind: str, namespace: str, name: str, spec: Any, old_spec: Any | None) -> bytes:
    def obj(value: Any) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace}, "spec": value}

    body: dict[str, Any] = {
        "uid": "u",
        "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": kind},
        "namespace": namespace,
        "name": name,
        "operation": "CREATE" if old_spec is None else "UPDATE",
        "object": obj(spec),
    }
    if old_spec is not None:
        body["oldObject"] = obj(old_spec)
    return json.dumps(body).encode()


def decode(body: bytes) -> AdmissionRequest:
    return msgspec.json.decode(body, type=AdmissionRequest)


@st.composite
def trees(draw: st.DrawFn) -> Cluster:
    """A bounded root over a chain at least four tenants deep (a -> b -> c -> d, all unbounded),
    more unbounded tenants hung anywhere, and apps within the root's budget."""
    cluster = Cluster()
    cluster.tenants[("tenant-root", "root")] = {}
    chain = ["tenant-root"]
    for name in ("a", "b", "c", "d"):
        cluster.tenants[(chain[-1], name)] = {}
        chain.append(own_namespace(chain[-1], name))
    for name in draw(st.lists(st.sampled_from(("e", "f")), max_size=2, unique=True)):
        cluster.tenants[(draw(st.sampled_from(chain)), name)] = {}
    namespaces = [own_namespace(r, n) for r, n in cluster.tenants]
    for index in range(draw(st.integers(0, 4))):
        namespace = draw(st.sampled_from(namespaces))
        kind, spec = draw(app_specs())
        cluster.apps[(namespace, kind, f"app{index}")] = spec
    root_quota = {"requests.cpu": 0}
    for key in draw(st.lists(st.sampled_from(BUDGET_KEYS), min_size=1, unique=True)):
        # Consistent by construction: only the root is bounded, and holds what is reserved.
        cluster.tenants[("tenant-root", "root")] = {key: 0}
        root_quota[key] = cluster.held("tenant-root", key) + draw(st.integers(0, 8))
    cluster.tenants[("tenant-root", "root")] = root_quota
    assert not cluster.breaches() and not cluster.inconsistencies()
    return cluster


def vm_values(draw: st.DrawFn, pool: bool) -> dict[str, Any]:
    """A VM's or a pool's values as a tenant sends them: any field may be left out."""
    values: dict[str, Any] = {}
    if draw(st.integers(0, 3)):
        values["gpus"] = [
            {"name": g} for g in draw(st.lists(st.sampled_from((L40S, H100, A10_VFIO)), max_size=3))
        ]
    instance_type = draw(
        st.sampled_from((None, "u1.medium", "gpu.l40s", "gpu.mixed", "gpu.a10", "absent"))
    )
    if instance_type != "absent":
        values["instanceType"] = instance_type or ""
    if pool:
        for field_name in ("maxReplicas", "minReplicas"):
            if draw(st.booleans()):
                values[field_name] = draw(st.integers(0, 3))
    return values


@st.composite
def app_specs(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    kind = draw(st.sampled_from(("VMInstance", "KubernetesNodes", "Kubernetes")))
    if kind != "Kubernetes":
        return kind, vm_values(draw, kind == "KubernetesNodes")
    spec: dict[str, Any] = {}
    if draw(st.booleans()):
        names = draw(st.lists(st.sampled_from(("md0", "gpu", "big")), max_size=2, unique=True))
        spec["nodeGroups"] = {name: vm_values(draw, True) for name in names}
    return kind, spec


declarations = st.dictionaries(st.sampled_from(QUOTA_KEYS), st.integers(0, 12), max_size=4)


def step(cluster: Cluster, data: st.DataObject) -> tuple[bool, str, Cluster]:
    """One random operation: what the webhook said, and the cluster if it were applied."""
    after = cluster.copy()
    namespaces = sorted(own_namespace(r, n) for r, n in cluster.tenants)
    what = data.draw(st.sampled_from(("declare", "new tenant", "app", "app")))
    if what == "app":
        namespace = data.draw(st.sampled_from(namespaces))
        kind, spec = data.draw(app_specs())
        name = data.draw(st.sampled_from(("v1", "v2", "p1")))
        old = cluster.apps.get((namespace, kind, name))
        body = request(kind, namespace, name, spec, old)
        verdict = review_app(decode(body), cluster).verdict
        after.apps[(namespace, kind, name)] = spec
    else:
        if what == "declare":
            release, name = data.draw(st.sampled_from(sorted(cluster.tenants)))
        else:
            release = data.draw(st.sampled_from(namespaces))
            name = data.draw(st.sampled_from(NAMES))
        quota = data.draw(declarations)
        previous_quota = cluster.tenants.get((release, name))
        old = {"resourceQuotas": previous_quota} if previous_quota is not None else None
        body = request("Tenant", release, name, {"resourceQuotas": quota}, old)
        verdict = review_tenant(decode(body), cluster).verdict
        after.tenants[(release, name)] = quota
    return verdict.allowed, verdict.message, after


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(start=trees(), data=st.data(), steps=st.integers(1, 40))
def test_pool_invariant_holds_after_every_admitted_operation(
    start: Cluster, data: st.DataObject, steps: int
) -> None:
    cluster = start
    for _ in range(steps):
        allowed, message, after = step(cluster, data)
        expected = not after.breaches() and not after.inconsistencies()
        assert allowed == expected, (
            f"webhook {'admitted' if allowed else 'denied'} ({message}); the model says "
            f"{after.breaches() + after.inconsistencies() or 'consistent and within budget'}"
        )
        if allowed:
            cluster = after
        assert not cluster.breaches()


# --- legacy clusters: unlabelled, duplicated and unplaceable releases ------------------------
#
# Long-lived clusters hold releases that migrations left without their name label, releases that
# share an identity, Tenant releases whose names name no tenant, worker pools with minReplicas
# above maxReplicas, and keys that look like budget keys. The model below places and counts them
# as the design says (every release on its own; a Tenant release without a name label is named by
# its release name; a pool reserves max(maxReplicas, minReplicas)); releases it cannot place it
# leaves out, so the webhook may deny more than the model (it fails closed), never admit more:
# after every admitted operation, every pool holds within its budget and every bounded tenant in
# a pool declares the pool's keys.

KIND_LABEL, NAME_LABEL = "apps.cozystack.io/application.kind", "apps.cozystack.io/application.name"
SLASHLESS = ("gpuclass.cozystack.io", "l40s.gpuclass.cozystack.io")


# A resource no class names until the hoster makes one (`ClassOperation`).
A10 = "nvidia.com/NVIDIA_A10-24Q"
A10_CLASS = ClassIdentity("a10", "2026-03-01T00:00:00Z", False, A10)
A10_KEY = "a10.gpuclass.cozystack.io/devices"
# What a class `l40s` whose resource was changed (before the CRD refused it) names instead.
L40S_NEW = "nvidia.com/NVIDIA_L40S-48Q"


@dataclass(frozen=True)
class Release:
    """A HelmRelease as the API server stores it: where, its name, its labels, its values, and
    `hidden`: values Flux takes from a ConfigMap (`spec.valuesFrom`), which the webhook cannot
    read but Flux merges under `values`."""

    namespace: str
    name: str
    kind: str
    label: str | None  # the application.name label; None: missing ("" counts the same)
    values: dict[str, Any]
    hidden: dict[str, Any] | None = None

    def raw(self) -> msgspec.Raw:
        """As Cozystack's API writes it, the name label as migrations left it."""
        release = cozystack.helmrelease(
            self.kind,
            self.namespace,
            self.label or "",
            self.values,
            name_label=self.label is not None,
            release_name=self.name,
        )
        if self.label == "":
            release["metadata"]["labels"][NAME_LABEL] = ""
        if self.hidden is not None:
            release["spec"]["valuesFrom"].append(
                {"kind": "ConfigMap", "name": f"{self.name}-values"}
            )
        return msgspec.Raw(json.dumps(release).encode())

    @property
    def effective(self) -> dict[str, Any]:
        """What Flux installs: the hidden values with `values` merged over them (maps key by
        key, anything else replaced)."""
        merged = dict(self.hidden or {})
        for key, value in self.values.items():
            below = merged.get(key)
            merged[key] = (
                {**below, **value} if isinstance(below, dict) and isinstance(value, dict) else value
            )
        return merged


def claimed_tenant(release: Release) -> str | None:
    """Which tenant a Tenant release is: its name label, else what its release name says."""
    if release.label:
        return release.label
    rest = release.name.removeprefix("tenant-")
    if rest != release.name and rest.isalnum() and rest.islower():
        return rest
    return None


@dataclass(frozen=True)
class LegacyReleases:
    """`ReleaseSource` over stored releases, with the label selection of the API server."""

    releases: tuple[Release, ...]

    def tenants(self, release_namespace: str, names: Sequence[str]) -> list[Tenant | App]:
        return [
            release_object(r.raw(), PLATFORM_VALUES)
            for r in self.releases
            if r.namespace == release_namespace and r.kind == "Tenant" and r.label in names
        ]

    def unnamed(self, release_namespace: str) -> list[Tenant | App]:
        return [
            release_object(r.raw(), PLATFORM_VALUES)
            for r in self.releases
            if r.namespace == release_namespace and r.kind == "Tenant" and not r.label
        ]

    def namespace(self, namespace: str) -> list[Tenant | App]:
        return [
            release_object(r.raw(), PLATFORM_VALUES)
            for r in self.releases
            if r.namespace == namespace
        ]


@dataclass(frozen=True)
class LegacyCluster:
    releases: tuple[Release, ...]
    classed_a10: bool = False  # the hoster made a GPUClass for A10
    l40s: str | None = L40S  # the resource class l40s names; None: the hoster deleted it

    def classes(self) -> list[ClassIdentity]:
        l40s = () if self.l40s is None else (replace(CLASSES[0], resource_name=self.l40s),)
        return [*l40s, *CLASSES[1:], *([A10_CLASS] if self.classed_a10 else [])]

    def catalog(self) -> Catalog:
        return catalog_of(self.classes(), instance_type_objects(INSTANCE_TYPES))

    def key_of(self, resource: str) -> str | None:
        """The key a device counts under besides the total, None for a resource no class
        names (it counts under the total key alone)."""
        return {
            c.resource_name: f"{c.name}.gpuclass.cozystack.io/devices" for c in self.classes()
        }.get(resource)

    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        return scoped_tenancy(LegacyReleases(self.releases), namespaces, subtrees)

    # The model.
    def claims(self) -> dict[str, list[dict[str, int]]]:
        """Every placed Tenant release's budget-relevant declaration, by the namespace it owns."""
        found: dict[str, list[dict[str, int]]] = {}
        for release in self.releases:
            name = claimed_tenant(release) if release.kind == "Tenant" else None
            if name is not None:
                quotas = release.effective.get("resourceQuotas", {})
                found.setdefault(own_namespace(release.namespace, name), []).append(quotas)
        return found

    def pool_of(self, namespace: str | None) -> str | None:
        claims = self.claims()
        bounded = {ns for ns, claimed in claims.items() if any(claimed)}
        while namespace is not None and namespace not in bounded:
            if namespace not in claims:
                return None  # no Tenant release names it: in no pool
            namespace = parent_of(namespace)
        return namespace

    def held(self, pool: str, key: str) -> int:
        total = 0
        for release in self.releases:
            if release.kind == "Tenant" or self.pool_of(release.namespace) != pool:
                continue
            for devices, times in vm_shapes(release.kind, release.effective):
                per_key = Counter(self.key_of(device) for device in devices)
                # devices of no class count under the total key alone
                total += times * (sum(per_key.values()) if key == TOTAL else per_key[key])
        for namespace, claimed in self.claims().items():
            if namespace != pool and self.pool_of(parent_of(namespace)) == pool:
                total += sum(int(quotas.get(key, 0)) for quotas in claimed)
        return total

    def budgets(self) -> dict[str, dict[str, int]]:
        """Each pool's budget per key: the least any of its claimants declares."""
        found: dict[str, dict[str, int]] = {}
        for namespace, claimed in self.claims().items():
            for quotas in claimed:
                for key in (*BUDGET_KEYS, A10_KEY):
                    if key in quotas:
                        pool = found.setdefault(namespace, {})
                        pool[key] = min(pool.get(key, int(quotas[key])), int(quotas[key]))
        return found

    def over(self) -> dict[tuple[str, str], int]:
        """How far each pool is over its budget, per key."""
        return {
            (pool, key): self.held(pool, key) - budget
            for pool, keys in self.budgets().items()
            for key, budget in keys.items()
            if self.held(pool, key) > budget
        }

    def worse_than(self, before: LegacyCluster) -> list[str]:
        """What this cluster breaks that `before` did not: a pool further over a budget, or a
        bounded tenant newly leaving out its pool's key. A hoster's change of classes can bring a
        pool over (devices held under a deleted class count under its key again once it is
        made again); an admitted operation never may."""
        was = before.over()
        found = [
            f"{pool} {key}: {excess} over (was {was.get((pool, key), 0)})"
            for (pool, key), excess in self.over().items()
            if excess > was.get((pool, key), 0)
        ]
        return found + sorted(set(self.leaving_out()) - set(before.leaving_out()))

    def breaches(self) -> list[str]:
        found = [f"{pool} {key}: {excess} over" for (pool, key), excess in self.over().items()]
        return found + self.leaving_out()

    def leaving_out(self) -> list[str]:
        found: list[str] = []
        budgets = self.budgets()
        for namespace, claimed in self.claims().items():
            pool = self.pool_of(parent_of(namespace))
            for quotas in (q for q in claimed if q):
                missing = [k for k in budgets.get(pool or "", {}) if k not in quotas]
                found += [f"{namespace} leaves out {k} of {pool}" for k in missing]
        return found


@dataclass(frozen=True)
class AppOperation:
    """An app create or update; `create` sends a CREATE even where a release of another name
    already carries the app's name label, and an empty name is a create under `generateName`."""

    namespace: str
    kind: str
    name: str
    gpus: tuple[str, ...]
    max_replicas: int | None = None
    min_replicas: int | None = None
    create: bool = False
    instance_type: str | None = None  # None: left out (the default, `u1.medium`)

    @property
    def values(self) -> dict[str, Any]:
        """The spec as the tenant sends it, and Cozystack stores it."""
        values: dict[str, Any] = {"gpus": [{"name": g} for g in self.gpus]}
        for field_name, value in (
            ("instanceType", self.instance_type),
            ("maxReplicas", self.max_replicas),
            ("minReplicas", self.min_replicas),
        ):
            if value is not None:
                values[field_name] = value
        return values


@dataclass(frozen=True)
class ClassOperation:
    """The hoster changes the classes, which no review judges: makes a GPUClass for A10 (devices
    already held start to count under its key), deletes the class l40s while VMs hold its devices
    (they count under the total key alone), makes it again, or changes its resource (as before
    the CRD refused that: its devices held under the old name count under the total key alone)."""

    change: str = "make a10"  # or "delete l40s", "restore l40s", "rename l40s"


@dataclass(frozen=True)
class TenantOperation:
    release_namespace: str
    name: str
    quotas: dict[str, Any]


def apply(
    cluster: LegacyCluster, operation: AppOperation | TenantOperation | ClassOperation
) -> tuple[bool, LegacyCluster]:
    """What the webhook says of the operation, and the cluster with it stored: Cozystack writes
    the release named after the app (`vm-instance-<name>`, `tenant-<name>`), labelled or not, and
    makes it labelled when there is none. The webhook sees the stored app through its label only,
    and other releases claiming the same app stay as they are."""
    if isinstance(operation, ClassOperation):
        changed = {
            "make a10": replace(cluster, classed_a10=True),
            "delete l40s": replace(cluster, l40s=None),
            "restore l40s": replace(cluster, l40s=L40S),
            "rename l40s": replace(cluster, l40s=L40S_NEW),
        }
        return True, changed[operation.change]
    if isinstance(operation, AppOperation) and not operation.name:
        # generateName: reviewed without a name, stored under the one the API server makes
        generated = f"gen{len(cluster.releases)}"
        spec = operation.values
        body = request(operation.kind, operation.namespace, "", spec, None)
        allowed = review_app(decode(body), cluster).verdict.allowed
        release = cozystack.release_prefix(operation.kind) + generated
        made = Release(operation.namespace, release, operation.kind, generated, spec)
        return allowed, replace(cluster, releases=(*cluster.releases, made))
    if isinstance(operation, AppOperation):
        kind, namespace, name = operation.kind, operation.namespace, operation.name
        values = operation.values
        stored = [
            r for r in cluster.releases if (r.namespace, r.kind, r.label) == (namespace, kind, name)
        ]
    else:
        kind, namespace, name = "Tenant", operation.release_namespace, operation.name
        values = {"resourceQuotas": operation.quotas}
        stored = [
            r
            for r in cluster.releases
            if r.kind == "Tenant" and r.namespace == namespace and claimed_tenant(r) == name
        ]
    release_name = cozystack.release_prefix(kind) + name
    written = [r for r in cluster.releases if (r.namespace, r.name) == (namespace, release_name)]
    creating = isinstance(operation, AppOperation) and operation.create and not written
    old = None if creating else (written or stored or [None])[0]
    body = request(kind, namespace, name, values, old.values if old is not None else None)
    review = review_tenant if kind == "Tenant" else review_app
    allowed = review(decode(body), cluster).verdict.allowed
    if written:
        replaced = replace(written[0], values=values)
        releases = tuple(replaced if r is written[0] else r for r in cluster.releases)
    else:
        releases = (
            *cluster.releases,
            Release(namespace, release_name, kind, name, values),
        )
    return allowed, replace(cluster, releases=releases)


@st.composite
def legacy_clusters(draw: st.DrawFn) -> LegacyCluster:
    """A consistent labelled tree (as `trees`), then legacy damage that keeps it consistent in
    the model: name labels dropped or emptied, second releases claiming an unbounded tenant,
    unplaceable Tenant releases, values taken from ConfigMaps; or, with a root that bounds no
    GPU key, devices no class names yet, held anywhere."""
    tree = draw(trees())
    if draw(st.booleans()):
        # a cluster whose hoster has set no GPU budget yet: unclassed devices are fine anywhere
        tree.tenants[("tenant-root", "root")] = {"requests.cpu": 0}
        namespaces = sorted(own_namespace(r, n) for r, n in tree.tenants)
        for index in range(draw(st.integers(1, 3))):
            where = draw(st.sampled_from(namespaces))
            tree.apps[(where, "VMInstance", f"unclassed{index}")] = {
                "gpus": [{"name": A10}] * (index + 1)
            }
    releases = [
        Release(r, f"tenant-{n}", "Tenant", n, {"resourceQuotas": q} if q else {})
        for (r, n), q in tree.tenants.items()
    ]
    releases += [
        Release(ns, cozystack.release_prefix(k) + n, k, n, spec)
        for (ns, k, n), spec in tree.apps.items()
    ]
    damaged = []
    for release in releases:
        label = draw(st.sampled_from((release.label, None, "")))
        release = replace(release, label=label)
        if release.kind != "Tenant" and draw(st.integers(0, 5)) == 0:
            # its gpus moved into a ConfigMap the release takes its values from
            release = replace(release, values={}, hidden=release.values)
        damaged.append(release)
    namespaces = sorted({own_namespace(r, n) for r, n in tree.tenants})
    unbounded = sorted((r, n) for (r, n), q in tree.tenants.items() if not q)
    for release_namespace, name in draw(st.lists(st.sampled_from(unbounded), max_size=2)):
        # a second release claiming the same tenant, left over by a migration
        damaged.append(Release(release_namespace, f"{name}-old", "Tenant", name, {}))
    for index in range(draw(st.integers(0, 2))):
        quotas = draw(declarations)
        where = draw(st.sampled_from(namespaces))
        damaged.append(
            Release(where, f"legacy-{index}", "Tenant", None, {"resourceQuotas": quotas})
        )
    cluster = LegacyCluster(tuple(damaged))
    assert not cluster.breaches()
    return cluster


@st.composite
def operations(draw: st.DrawFn) -> AppOperation | TenantOperation | ClassOperation:
    namespace = draw(st.sampled_from(("tenant-root", "tenant-a", "tenant-a-b", "tenant-a-b-c")))
    if draw(st.integers(0, 7)) == 0:
        changes = ("make a10", "delete l40s", "restore l40s", "rename l40s")
        return ClassOperation(draw(st.sampled_from(changes)))
    if draw(st.booleans()):
        kind = draw(st.sampled_from(("VMInstance", "KubernetesNodes")))
        gpus = tuple(draw(st.lists(st.sampled_from((L40S, H100, A10, L40S_NEW)), max_size=3)))
        most = least = None
        if kind == "KubernetesNodes":
            most = draw(st.none() | st.integers(0, 3))
            least = draw(st.none() | st.integers(0, 4))
        name = draw(st.sampled_from(("v1", "p1", "app0", "unclassed0", "")))
        instance_type = draw(st.sampled_from((None, "u1.medium", "gpu.l40s", "gpu.mixed")))
        return AppOperation(
            namespace, kind, name, gpus, most, least, draw(st.booleans()), instance_type
        )
    keys = st.sampled_from((*QUOTA_KEYS, A10_KEY, *SLASHLESS))
    quotas = draw(st.dictionaries(keys, st.integers(0, 12), max_size=4))
    return TenantOperation(namespace, draw(st.sampled_from(NAMES)), quotas)


UNLABELLED_ROOT = LegacyCluster(
    (
        Release("tenant-root", "tenant-root", "Tenant", None, {"resourceQuotas": {TOTAL: 2}}),
        Release("tenant-root", "tenant-a", "Tenant", "a", {}),
    )
)
TWO_UNLABELLED_VMS = LegacyCluster(
    (
        Release("tenant-root", "tenant-root", "Tenant", "root", {"resourceQuotas": {TOTAL: 2}}),
        Release("tenant-root", "tenant-a", "Tenant", "a", {}),
        Release("tenant-a", "vm-instance-one", "VMInstance", None, {"gpus": [{"name": L40S}]}),
        Release("tenant-a", "vm-instance-two", "VMInstance", None, {"gpus": [{"name": L40S}]}),
    )
)


ROOT_FOUR = Release("tenant-root", "tenant-root", "Tenant", "root", {"resourceQuotas": {TOTAL: 4}})
TENANT_A = Release("tenant-root", "tenant-a", "Tenant", "a", {})
THREE_L40S = {"gpus": [{"name": L40S}] * 3}
UNCLASSED_DEVICES = LegacyCluster(
    (
        Release(
            "tenant-root", "tenant-root", "Tenant", "root", {"resourceQuotas": {"requests.cpu": 1}}
        ),
        TENANT_A,
        Release("tenant-a", "vm-instance-old", "VMInstance", "old", {"gpus": [{"name": A10}] * 3}),
    )
)
LEGACY_V = LegacyCluster(
    (
        ROOT_FOUR,
        TENANT_A,
        Release("tenant-a", "vm-instance-v-legacy", "VMInstance", "v", THREE_L40S),
    )
)
UNLABELLED_LEGACY_VM = LegacyCluster(
    (ROOT_FOUR, TENANT_A, Release("tenant-a", "vm-instance-legacy", "VMInstance", None, THREE_L40S))
)
HIDDEN_VM = LegacyCluster(
    (ROOT_FOUR, TENANT_A, Release("tenant-a", "vm-instance-h", "VMInstance", "h", {}, THREE_L40S))
)


# A worker pool of three VMs, one L40S each, named by no instance type.
POOL_OF_THREE = LegacyCluster(
    (
        ROOT_FOUR,
        TENANT_A,
        Release(
            "tenant-a",
            "kubernetes-nodes-p",
            "KubernetesNodes",
            "p",
            {"gpus": [{"name": L40S}], "instanceType": "", "maxReplicas": 3},
        ),
    )
)
TWO_RELEASES_OF_ONE_TENANT = LegacyCluster(
    (
        Release("tenant-root", "tenant-root", "Tenant", "root", {"resourceQuotas": {TOTAL: 2}}),
        Release("tenant-root", "tenant-x", "Tenant", "x", {"resourceQuotas": {TOTAL: 1}}),
        Release("tenant-root", "x-old", "Tenant", "x", {"resourceQuotas": {TOTAL: 1}}),
    )
)


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(start=legacy_clusters(), steps=st.lists(operations(), min_size=1, max_size=25))
@example(  # 1: three unclassed devices bounded to 1, then the class is made
    start=UNCLASSED_DEVICES,
    steps=[TenantOperation("tenant-root", "a", {TOTAL: 1}), ClassOperation()],
)
@example(  # 2: a CREATE beside a release of another name that carries its name label
    start=LEGACY_V, steps=[AppOperation("tenant-a", "VMInstance", "v", (L40S, L40S), create=True)]
)
@example(  # 3: a CREATE without a name beside an unlabelled release
    start=UNLABELLED_LEGACY_VM, steps=[AppOperation("tenant-a", "VMInstance", "", (L40S, L40S))]
)
@example(  # a class deleted while a VM holds its devices, the pool filled with another class
    start=LEGACY_V,
    steps=[
        ClassOperation("delete l40s"),
        AppOperation("tenant-a", "VMInstance", "w", (H100,) * 4),
        ClassOperation("restore l40s"),
    ],
)
@example(  # a class's resource changed while a VM holds 3 of the old name
    start=LEGACY_V,
    steps=[
        ClassOperation("rename l40s"),
        AppOperation("tenant-a", "VMInstance", "w", (L40S_NEW,) * 4),
    ],
)
@example(  # a worker pool holding devices of a deleted class: each replica's still count
    start=POOL_OF_THREE,
    steps=[
        ClassOperation("delete l40s"),
        AppOperation("tenant-a", "VMInstance", "w", (H100, H100)),
    ],
)
@example(  # a VM whose instance type attaches the devices its gpus entries leave out
    start=LEGACY_V,
    steps=[AppOperation("tenant-a", "VMInstance", "w", (), instance_type="gpu.mixed")],
)
@example(  # 4: a release whose gpus come from a ConfigMap
    start=HIDDEN_VM, steps=[AppOperation("tenant-a", "VMInstance", "w", (L40S, L40S))]
)
@example(  # escape 1: a root release without its name label, its budget passed by
    start=UNLABELLED_ROOT, steps=[AppOperation("tenant-a", "VMInstance", "big", (L40S,) * 5)]
)
@example(  # escape 3: two VM releases without a name label counted once
    start=TWO_UNLABELLED_VMS, steps=[AppOperation("tenant-a", "VMInstance", "three", (L40S,))]
)
@example(  # escape 3: two Tenant releases labelled x counted one carve-out
    start=TWO_RELEASES_OF_ONE_TENANT,
    steps=[AppOperation("tenant-root", "VMInstance", "v", (L40S,))],
)
def test_no_admitted_operation_breaks_a_pool_of_a_legacy_cluster(
    start: LegacyCluster, steps: list[AppOperation | TenantOperation | ClassOperation]
) -> None:
    cluster = start
    for operation in steps:
        allowed, after = apply(cluster, operation)
        if isinstance(operation, TenantOperation) and set(operation.quotas) & set(SLASHLESS):
            assert not allowed, f"a key without a slash was accepted: {operation.quotas}"
        if isinstance(operation, ClassOperation):
            cluster = after  # the hoster's: no review, and it may bring a pool over
        elif allowed:
            assert not after.worse_than(cluster), (
                f"admitted {operation}: {after.worse_than(cluster)}"
            )
            cluster = after
