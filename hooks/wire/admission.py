"""`admission.k8s.io/v1` AdmissionReview, and the Cozystack objects the budget webhook reads."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from hooks.wire.kube import ObjectMeta, is_absent
from hooks.wire.metacontroller import BadRequest
from hooks.wire.problems import decode_problem

ADMISSION_API_VERSION = "admission.k8s.io/v1"


class _Admission(msgspec.Struct, kw_only=True, rename="camel"):
    pass


class GroupVersionKind(_Admission):
    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(_Admission):
    uid: str
    kind: GroupVersionKind = msgspec.field(default_factory=GroupVersionKind)
    namespace: str = ""
    name: str = ""
    operation: str = ""
    object: msgspec.Raw = msgspec.Raw()
    old_object: msgspec.Raw = msgspec.Raw()


class AdmissionReview(_Admission):
    api_version: str = ""
    kind: str = ""
    request: AdmissionRequest | None = None


def decode_review(body: bytes) -> AdmissionRequest:
    try:
        review = msgspec.json.decode(body, type=AdmissionReview)
    except msgspec.ValidationError as error:
        raise BadRequest(f"invalid AdmissionReview: {error}") from None
    except msgspec.DecodeError:
        raise BadRequest("request body is not valid JSON") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if review.api_version != ADMISSION_API_VERSION or review.kind != "AdmissionReview":
        raise BadRequest(f"not an {ADMISSION_API_VERSION} AdmissionReview")
    if review.request is None:
        raise BadRequest("AdmissionReview has no request")
    return review.request


# Messages quote names and keys from the request; the API server relays them to the client and
# into events, so a hostile name must not make them unbounded.
MAX_MESSAGE = 1_000


def review_response(uid: str, allowed: bool, message: str = "") -> dict[str, Any]:
    """The answer: HTTP 200 always; a denial carries code 403 and a message a tenant can act on."""
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        response["status"] = {"code": 403, "message": message}
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


class GpuEntry(_Admission):
    name: str = ""


# A quota as people write it in values: a quantity string, or a YAML number. The rules decide
# whether it is a whole number of devices; the wire only keeps it.
QuotaValue = str | int | float | bool | None


class AppSpec(_Admission):
    """The fields of an app's spec (or a HelmRelease's values) the budgets read."""

    gpus: list[GpuEntry] = []
    max_replicas: Annotated[int, msgspec.Meta(ge=0)] | None = None
    resource_quotas: dict[str, QuotaValue] = {}


class AppObject(_Admission):
    """A VMInstance, KubernetesNodes or Tenant under review."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: AppSpec = msgspec.field(default_factory=AppSpec)


class ReleaseMeta(_Admission):
    name: str = ""
    namespace: str = ""
    labels: dict[str, str] = {}


class ReleaseHead(_Admission):
    """Where a HelmRelease is and which app it stores; decoded apart from its values, so that a
    release whose values do not decode can still be placed and named."""

    metadata: ReleaseMeta = msgspec.field(default_factory=ReleaseMeta)


class HelmReleaseSpec(_Admission):
    values: AppSpec = msgspec.field(default_factory=AppSpec)


class HelmRelease(ReleaseHead):
    """How Cozystack stores an app: the app's spec is the HelmRelease's values."""

    spec: HelmReleaseSpec = msgspec.field(default_factory=HelmReleaseSpec)


def decode_app_object(raw: msgspec.Raw, field: str) -> AppObject | None:
    """None when the field is absent; BadRequest naming the field when it is not an app object."""
    if is_absent(raw):
        return None
    try:
        return msgspec.json.decode(raw, type=AppObject)
    except (msgspec.DecodeError, RecursionError) as error:
        raise BadRequest(f"{field} is not a valid app: {decode_problem(error)}") from None
