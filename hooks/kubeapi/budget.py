"""The inputs of the budget webhook, read from the Kubernetes API (apps are HelmReleases).

GPUClasses are cached for `GPUCLASS_ADMISSION_CACHE_SECONDS`: they are the hoster's, change
rarely, and a class seen a few seconds late maps a device to the key it mapped to a moment ago.
Tenant declarations and app reservations are never cached: the webhook itself admits them, so a
cached list would let two quick requests (or two replicas) each take the same budget. They come
from one LIST, which the API server answers from one consistent snapshot.

A release that does not decode is kept, marked with what could not be read and where, so that
the rules deny only the verdicts that need it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec

from hooks.kubeapi.client import ApiClient, Unreadable
from hooks.rules.budget import (
    KUBERNETES_NODES,
    TENANT,
    VM_INSTANCE,
    App,
    Tenancy,
    Tenant,
    app_from,
    quota_problem,
    tenant_declaration,
)
from hooks.rules.classes import ClassIdentity, class_identity
from hooks.settings import Settings
from hooks.wire.cozystack import KIND_LABEL, NAME_LABEL, AppSpec, HelmRelease, ReleaseHead
from hooks.wire.kube import GPUClass
from hooks.wire.problems import Undecodable, decoded

HELMRELEASES = "/apis/helm.toolkit.fluxcd.io/v2/helmreleases"
GPUCLASSES = "/apis/cozystack.io/v1alpha1/gpuclasses"
TENANCY_SELECTOR = f"{KIND_LABEL} in ({TENANT},{VM_INSTANCE},{KUBERNETES_NODES})"

_RELEASE = msgspec.json.Decoder(HelmRelease)
_HEAD = msgspec.json.Decoder(ReleaseHead)
_GPUCLASS = msgspec.json.Decoder(GPUClass)


def release_object(raw: msgspec.Raw) -> Tenant | App:
    """One HelmRelease of the tenancy as a Tenant or an App, marked when it cannot be read."""
    try:
        release = decoded(_RELEASE, raw)
        head: ReleaseHead = release
        values: AppSpec | None = release.spec.values
        problem = None
    except Undecodable as error:
        values, problem = None, str(error)
        try:
            head = decoded(_HEAD, raw)
        except Undecodable:
            # Not even where it lives: every verdict that reads the tenancy must fail closed.
            return Tenant("", None, unreadable=f"HelmRelease (unnamed): {problem}")
    meta = head.metadata
    where = f"HelmRelease {meta.namespace}/{meta.name}"
    kind = meta.labels.get(KIND_LABEL, "")
    name = meta.labels.get(NAME_LABEL) or None
    if kind == TENANT:
        quotas = values.resource_quotas if values else {}
        if problem is None and name is None:
            problem = f"metadata.labels: no {NAME_LABEL}"
        if problem is None and (invalid := quota_problem(quotas)):
            problem = f"spec.values.{invalid}"
        unreadable = f"{where}: {problem}" if problem else None
        return Tenant(meta.namespace, name, tenant_declaration(quotas), unreadable)
    unreadable = f"{where}: {problem}" if problem else None
    return app_from(values or AppSpec(), meta.namespace, kind, name or "", unreadable)


class BudgetReader:
    """Reads GPUClasses, Tenant and app HelmReleases; one request at a time per reader."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._api = ApiClient(settings)
        self._lock = threading.Lock()
        self._classes: tuple[float, list[ClassIdentity]] | None = None

    def classes(self) -> list[ClassIdentity]:
        with self._lock:
            now = self._clock()
            if self._classes is not None:
                read_at, classes = self._classes
                if now - read_at < self._settings.admission_cache_seconds:
                    return classes
            try:
                raws = list(self._api.list(GPUCLASSES))
            except Unreadable as error:
                raise Unreadable(f"could not list GPUClasses ({error})") from None
            try:
                classes = [class_identity(decoded(_GPUCLASS, raw)) for raw in raws]
            except Undecodable as error:
                raise Unreadable(f"GPUClass: {error}") from None
            self._classes = (now, classes)
            return classes

    def tenancy(self) -> Tenancy:
        """Every Tenant, VMInstance and KubernetesNodes release, read fresh on every review."""
        with self._lock:
            try:
                releases = self._api.list(HELMRELEASES, TENANCY_SELECTOR)
                objects = [release_object(raw) for raw in releases]
            except Unreadable as error:
                raise Unreadable(f"could not list HelmReleases ({error})") from None
        return Tenancy(
            tuple(o for o in objects if isinstance(o, Tenant)),
            tuple(o for o in objects if isinstance(o, App)),
        )
