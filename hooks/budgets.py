"""The inputs of the budget webhook, read from the Kubernetes API (apps are HelmReleases).

GPUClasses and tenant declarations are cached for `GPUCLASS_ADMISSION_CACHE_SECONDS`; reservations
never are. That is what makes the cache safe: the growth this webhook admitted lives only in app
HelmReleases, which every review reads fresh, so a cached read can never admit what a fresh one
would deny for growth made by the webhook's own earlier verdicts. (A class or a declaration
changed by someone else is seen a few seconds late, like any quota controller's cache.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec

from hooks.kubeapi import ApiClient, ApiUnreadable
from hooks.rules.budget import (
    KUBERNETES_NODES,
    VM_INSTANCE,
    App,
    InputUnreadable,
    Tenant,
    app_from,
    declaration,
)
from hooks.rules.classes import ClassIdentity, class_identity
from hooks.settings import Settings
from hooks.wire.admission import HelmRelease
from hooks.wire.kube import GPUClass

KIND_LABEL = "apps.cozystack.io/application.kind"
NAME_LABEL = "apps.cozystack.io/application.name"
HELMRELEASES = "/apis/helm.toolkit.fluxcd.io/v2/helmreleases"
GPUCLASSES = "/apis/cozystack.io/v1alpha1/gpuclasses"
T = TypeVar("T")


class BudgetReader:
    """Reads GPUClasses, Tenant and app HelmReleases; one request at a time per reader."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._api = ApiClient(settings)
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, object]] = {}

    def _cached(self, name: str, read: Callable[[], T]) -> T:
        now = self._clock()
        hit = self._cache.get(name)
        if hit is not None and now - hit[0] < self._settings.admission_cache_seconds:
            return hit[1]  # type: ignore[return-value]
        value = read()
        self._cache[name] = (now, value)
        return value

    def _releases(self, selector: str) -> list[HelmRelease]:
        decoder = msgspec.json.Decoder(HelmRelease)
        releases = []
        try:
            for raw in self._api.list(HELMRELEASES, selector):
                try:
                    releases.append(decoder.decode(raw))
                except (msgspec.ValidationError, RecursionError):
                    raise InputUnreadable("a HelmRelease of an app is not valid") from None
        except ApiUnreadable as error:
            raise InputUnreadable(f"could not list HelmReleases ({error})") from None
        return releases

    def classes(self) -> list[ClassIdentity]:
        def read() -> list[ClassIdentity]:
            decoder = msgspec.json.Decoder(GPUClass)
            try:
                return [class_identity(decoder.decode(raw)) for raw in self._api.list(GPUCLASSES)]
            except ApiUnreadable as error:
                raise InputUnreadable(f"could not list GPUClasses ({error})") from None
            except (msgspec.ValidationError, RecursionError):
                raise InputUnreadable("a GPUClass is not valid") from None

        with self._lock:
            return self._cached("classes", read)

    def tenants(self) -> list[Tenant]:
        def read() -> list[Tenant]:
            tenants = []
            for release in self._releases(f"{KIND_LABEL}=Tenant"):
                meta = release.metadata
                name = meta.labels.get(NAME_LABEL, "")
                where = f"Tenant {meta.namespace}/{name}"
                quotas = declaration(release.spec.values.resource_quotas, where)
                tenants.append(Tenant(meta.namespace, name, quotas))
            return tenants

        with self._lock:
            return self._cached("tenants", read)

    def apps(self) -> list[App]:
        """Every VMInstance and KubernetesNodes, read fresh on every review."""
        with self._lock:
            releases = self._releases(f"{KIND_LABEL} in ({VM_INSTANCE},{KUBERNETES_NODES})")
        return [
            app_from(
                r.spec.values,
                r.metadata.namespace,
                r.metadata.labels.get(KIND_LABEL, ""),
                r.metadata.labels.get(NAME_LABEL, ""),
            )
            for r in releases
        ]
