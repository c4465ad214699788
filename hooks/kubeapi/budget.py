"""The inputs of the budget webhook, read from the Kubernetes API (apps are HelmReleases).

GPUClasses are cached for `GPUCLASS_ADMISSION_CACHE_SECONDS`: they are the hoster's, change
rarely, and a class seen a few seconds late maps a device to the key it mapped to a moment ago.
Cluster instance types are read fresh, like releases: what a VM attaches through one must be
what the API server holds when the review arrives. Where KubeVirt's instance type API is not
served, no instance type exists and none attaches anything.

Tenant declarations and app reservations are never cached: the webhook itself admits them, so a
cached list would let two quick requests (or two replicas) each take the same budget. Nor are
they read cluster-wide: a review reads only the pool it is about (`hooks.rules.budget.scope` says
which releases), with a few namespaced LISTs made after the review arrived. Each is a consistent
read, so every release the API server had stored when the review arrived is seen, and what a
review costs the API server grows with its pool, not with the cluster.

A release that does not decode is kept, marked with what could not be read and where, so that
the rules deny only the verdicts that need it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

import msgspec

from hooks.kubeapi.client import ApiClient, NotFound, ReadShare
from hooks.rules.budget.instance_types import INSTANCE_TYPES_API, catalog_of
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.scope import Read, ReleasesIn, TenantsNamed, UnnamedTenants, read_scope
from hooks.rules.budget.tenancy import (
    KUBERNETES,
    KUBERNETES_NODES,
    TENANT,
    VM_INSTANCE,
    App,
    Tenancy,
    Tenant,
)
from hooks.rules.classes import ClassIdentity, class_identity
from hooks.settings import Settings
from hooks.wire.cozystack import KIND_LABEL, NAME_LABEL
from hooks.wire.kube import GPUClass
from hooks.wire.problems import Undecodable, Unreadable, decoded

HELM_API = "/apis/helm.toolkit.fluxcd.io/v2"
HELMRELEASES = f"{HELM_API}/helmreleases"
GPUCLASSES = "/apis/cozystack.io/v1alpha1/gpuclasses"
TENANCY_SELECTOR = f"{KIND_LABEL} in ({TENANT},{VM_INSTANCE},{KUBERNETES_NODES},{KUBERNETES})"
# Tenant releases whose name label is missing or empty: their release name may name the tenant
# (`tenant-x`); those it does not fail closed beneath where they live, where it could matter.
UNNAMED_TENANTS = (f"{KIND_LABEL}={TENANT},!{NAME_LABEL}", f"{KIND_LABEL}={TENANT},{NAME_LABEL}=")


def releases_in(namespace: str) -> str:
    return f"{HELM_API}/namespaces/{namespace}/helmreleases"


def tenants_named(names: Iterable[str]) -> str:
    return f"{KIND_LABEL}={TENANT},{NAME_LABEL} in ({','.join(sorted(names))})"


_GPUCLASS = msgspec.json.Decoder(GPUClass)


class ApiReleases:
    """The reads of `scoped_reads`, as namespaced LISTs selected by Cozystack's labels."""

    def __init__(self, api: ApiClient, platform_values: str) -> None:
        self._api = api
        self._platform_values = platform_values

    def _list(self, namespace: str, selector: str) -> list[Tenant | App]:
        return [
            release_object(raw, self._platform_values)
            for raw in self._api.list(releases_in(namespace), selector)
        ]

    def read(self, request: Read) -> list[Tenant | App]:
        match request:
            case TenantsNamed(release_namespace, names):
                return self._list(release_namespace, tenants_named(names))
            case UnnamedTenants(release_namespace):
                return [o for s in UNNAMED_TENANTS for o in self._list(release_namespace, s)]
            case ReleasesIn(namespace):
                return self._list(namespace, TENANCY_SELECTOR)


class BudgetReader:
    """Reads GPUClasses, Tenant and app HelmReleases. Reviews run concurrently: no lock is held
    across a read, so a slow LIST delays only its own review."""

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.monotonic,
        share: ReadShare | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._api = ApiClient(settings, share)
        self._releases = ApiReleases(self._api, settings.platform_values_secret)
        self._lock = threading.Lock()  # guards the class cache only
        self._classes: tuple[float, list[ClassIdentity]] | None = None

    def catalog(self) -> Catalog:
        """The classes (cached) and the cluster instance types (fresh)."""
        classes = self._classes_cached()
        try:
            instance_types = list(self._api.list(INSTANCE_TYPES_API))
        except NotFound:
            instance_types = []
        except Unreadable as error:
            raise Unreadable(
                f"could not list VirtualMachineClusterInstancetypes ({error})"
            ) from None
        return catalog_of(classes, instance_types)

    def _classes_cached(self) -> list[ClassIdentity]:
        now = self._clock()
        with self._lock:
            cached = self._classes
        if cached is not None and now - cached[0] < self._settings.admission_cache_seconds:
            return cached[1]
        try:
            raws = list(self._api.list(GPUCLASSES))
        except Unreadable as error:
            raise Unreadable(f"could not list GPUClasses ({error})") from None
        try:
            classes = [class_identity(decoded(_GPUCLASS, raw)) for raw in raws]
        except Undecodable as error:
            raise Unreadable(f"GPUClass: {error}") from None
        with self._lock:
            self._classes = (now, classes)
        return classes

    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        """The pools of these namespaces, and the whole of `subtrees`, read fresh on every
        review."""
        try:
            return read_scope(namespaces, self._releases.read, subtrees)
        except Unreadable as error:
            raise Unreadable(f"could not list HelmReleases ({error})") from None
