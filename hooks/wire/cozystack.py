"""Cozystack's apps as the budget webhook reads them: the object under review, and the Flux
HelmRelease that stores each app (its values are the app's spec)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

import msgspec

from hooks.wire.kube import ObjectMeta, is_absent
from hooks.wire.problems import BadRequest, Undecodable, decoded

# Labels Cozystack puts on the HelmRelease of every app.
KIND_LABEL = "apps.cozystack.io/application.kind"
NAME_LABEL = "apps.cozystack.io/application.name"

S = TypeVar("S")


class _Cozystack(msgspec.Struct, kw_only=True, rename="camel"):
    pass


class GpuEntry(_Cozystack):
    name: str = ""


# A quota as people write it in values: a quantity string, or a YAML number. The rules decide
# whether it is a whole number of devices; the wire only keeps it.
QuotaValue = str | int | float | bool | None


class AppSpec(_Cozystack):
    """The fields of a VMInstance's or KubernetesNodes' spec (or its HelmRelease's values) the
    budgets read."""

    gpus: list[GpuEntry] = []
    max_replicas: Annotated[int, msgspec.Meta(ge=0)] | None = None
    min_replicas: Annotated[int, msgspec.Meta(ge=0)] | None = None


class _Gpus(_Cozystack):
    """Only whether an app lists any gpus entry."""

    gpus: list[msgspec.Raw] = []


class _Sizes(_Cozystack):
    """Which of the fields an app's reservation reads its values set at all."""

    gpus: list[msgspec.Raw] | msgspec.UnsetType | None = msgspec.UNSET
    max_replicas: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    min_replicas: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


def sets_reservation(values: msgspec.Raw, worker_pool: bool) -> bool:
    """Whether an app's values set everything its reservation reads: its `gpus` and, for a
    worker pool that lists any, both its size bounds. Flux merges a release's `values` over what
    it takes from elsewhere (`valuesFrom`), a list replaced whole: values that set these decide
    the reservation, whatever the referenced object holds."""
    try:
        sizes = decoded(_SIZES, values)
    except Undecodable:
        return False
    if isinstance(sizes.gpus, msgspec.UnsetType) or sizes.gpus is None:
        return False
    if not sizes.gpus or not worker_pool:
        return True
    unset = msgspec.UnsetType
    return not isinstance(sizes.max_replicas, unset) and not isinstance(sizes.min_replicas, unset)


def object_sets_reservation(raw: msgspec.Raw, worker_pool: bool) -> bool:
    """`sets_reservation` of an app object's spec."""
    try:
        head = decoded(_OBJECT_HEAD, raw)
    except Undecodable:
        return False
    return sets_reservation(head.spec, worker_pool)


class TenantSpec(_Cozystack):
    """The field of a Tenant's spec (or its HelmRelease's values) the budgets read."""

    resource_quotas: dict[str, QuotaValue] = {}


class ObjectHead(_Cozystack):
    """An app under review, its spec still raw: how it is read depends on its kind."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))


class AppObject(_Cozystack):
    """A VMInstance or KubernetesNodes under review."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: AppSpec = msgspec.field(default_factory=AppSpec)


class TenantObject(_Cozystack):
    """A Tenant under review."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: TenantSpec = msgspec.field(default_factory=TenantSpec)


class ReleaseMeta(_Cozystack):
    name: str = ""
    namespace: str = ""
    labels: dict[str, str] = {}


class ReleaseHead(_Cozystack):
    """Where a HelmRelease is and which app it stores; decoded apart from its values, so that a
    release whose values do not decode can still be placed and named."""

    metadata: ReleaseMeta = msgspec.field(default_factory=ReleaseMeta)


class HelmReleaseSpec(_Cozystack):
    # The app's spec, read as its kind (the release's labels) says.
    values: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))
    # Flux merges values from ConfigMaps and Secrets into `values`; the webhook reads neither,
    # so it keeps only whether there are any.
    values_from: list[msgspec.Raw] = []


class HelmRelease(ReleaseHead):
    """How Cozystack stores an app: the app's spec is the HelmRelease's values."""

    spec: HelmReleaseSpec = msgspec.field(default_factory=HelmReleaseSpec)


def app_spec(raw: msgspec.Raw, at: str) -> AppSpec:
    """An app's spec (`at` names where it sits, for the message). One with no gpus entry reserves
    nothing, whatever else it holds: it is never unreadable for a field that multiplies nothing
    (the admission webhook's match conditions let such apps through unjudged, so they must never
    make a pool fail closed once stored)."""
    try:
        return decoded(_APP_SPEC, raw, at)
    except Undecodable:
        try:
            listed = decoded(_GPUS, raw, at)
        except Undecodable:
            listed = None
        if listed is not None and not listed.gpus:
            return AppSpec()
        raise


class _Quotas(_Cozystack):
    """A Tenant's quotas with their values still raw: which one does not decode."""

    resource_quotas: dict[str, msgspec.Raw] = {}


def tenant_spec(raw: msgspec.Raw, at: str) -> TenantSpec:
    """A Tenant's spec (`at` names where it sits, for the message). A quota whose value is no
    quantity (`[4]`, `{"a": 1}`) is named by its key."""
    try:
        return decoded(_TENANT_SPEC, raw, at)
    except Undecodable as whole:
        try:
            quotas = decoded(_QUOTAS, raw, at).resource_quotas
        except Undecodable:
            raise whole from None
        for key in sorted(quotas):
            decoded(_QUOTA_VALUE, quotas[key], f"{at}.resourceQuotas.{key}")
        raise


def decode_app_object(raw: msgspec.Raw, field: str) -> AppObject | None:
    """A VMInstance or KubernetesNodes under review; None when the field is absent; BadRequest
    naming the field when it is not an app object."""
    head = _object_head(raw, field)
    if head is None:
        return None
    return AppObject(metadata=head.metadata, spec=_spec_of(app_spec, head, field))


def decode_tenant_object(raw: msgspec.Raw, field: str) -> TenantObject | None:
    """A Tenant under review, as decode_app_object."""
    head = _object_head(raw, field)
    if head is None:
        return None
    return TenantObject(metadata=head.metadata, spec=_spec_of(tenant_spec, head, field))


def _object_head(raw: msgspec.Raw, field: str) -> ObjectHead | None:
    if is_absent(raw):
        return None
    try:
        return decoded(_OBJECT_HEAD, raw)
    except Undecodable as error:
        raise BadRequest(f"{field} is not a valid app: {error}") from None


def _spec_of(read: Callable[[msgspec.Raw, str], S], head: ObjectHead, field: str) -> S:
    try:
        return read(head.spec, "spec")
    except Undecodable as error:
        raise BadRequest(f"{field} is not a valid app: {error}") from None


_OBJECT_HEAD = msgspec.json.Decoder(ObjectHead)
_APP_SPEC = msgspec.json.Decoder(AppSpec)
_GPUS = msgspec.json.Decoder(_Gpus)
_SIZES = msgspec.json.Decoder(_Sizes)
_TENANT_SPEC = msgspec.json.Decoder(TenantSpec)
_QUOTAS = msgspec.json.Decoder(_Quotas)
_QUOTA_VALUE: msgspec.json.Decoder[QuotaValue] = msgspec.json.Decoder(QuotaValue)
