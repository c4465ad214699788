"""Cozystack's apps as the budget webhook reads them: the object under review, and the Flux
HelmRelease that stores each app (its values are the app's spec)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from hooks.wire.kube import ObjectMeta, is_absent
from hooks.wire.problems import BadRequest, Undecodable, decoded

# Labels Cozystack puts on the HelmRelease of every app.
KIND_LABEL = "apps.cozystack.io/application.kind"
NAME_LABEL = "apps.cozystack.io/application.name"


class _Cozystack(msgspec.Struct, kw_only=True, rename="camel"):
    pass


class GpuEntry(_Cozystack):
    name: str = ""


# A quota as people write it in values: a quantity string, or a YAML number. The rules decide
# whether it is a whole number of devices; the wire only keeps it.
QuotaValue = str | int | float | bool | None


class AppSpec(_Cozystack):
    """The fields of an app's spec (or a HelmRelease's values) the budgets read."""

    gpus: list[GpuEntry] = []
    max_replicas: Annotated[int, msgspec.Meta(ge=0)] | None = None
    min_replicas: Annotated[int, msgspec.Meta(ge=0)] | None = None
    resource_quotas: dict[str, QuotaValue] = {}


class AppObject(_Cozystack):
    """A VMInstance, KubernetesNodes or Tenant under review."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: AppSpec = msgspec.field(default_factory=AppSpec)


class ReleaseMeta(_Cozystack):
    name: str = ""
    namespace: str = ""
    labels: dict[str, str] = {}


class ReleaseHead(_Cozystack):
    """Where a HelmRelease is and which app it stores; decoded apart from its values, so that a
    release whose values do not decode can still be placed and named."""

    metadata: ReleaseMeta = msgspec.field(default_factory=ReleaseMeta)


class HelmReleaseSpec(_Cozystack):
    values: AppSpec = msgspec.field(default_factory=AppSpec)
    # Flux merges values from ConfigMaps and Secrets into `values`; the webhook reads neither,
    # so it keeps only whether there are any.
    values_from: list[msgspec.Raw] = []


class HelmRelease(ReleaseHead):
    """How Cozystack stores an app: the app's spec is the HelmRelease's values."""

    spec: HelmReleaseSpec = msgspec.field(default_factory=HelmReleaseSpec)


def decode_app_object(raw: msgspec.Raw, field: str) -> AppObject | None:
    """None when the field is absent; BadRequest naming the field when it is not an app object."""
    if is_absent(raw):
        return None
    try:
        return decoded(_APP_OBJECT, raw)
    except Undecodable as error:
        raise BadRequest(f"{field} is not a valid app: {error}") from None


_APP_OBJECT = msgspec.json.Decoder(AppObject)
