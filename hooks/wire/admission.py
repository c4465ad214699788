"""`admission.k8s.io/v1` AdmissionReview: the request the API server sends, the answer it reads."""

from __future__ import annotations

from typing import Any

import msgspec

from hooks.wire.problems import BadRequest, decode_request

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


_REVIEW = msgspec.json.Decoder(AdmissionReview)


def decode_review(body: bytes) -> AdmissionRequest:
    review = decode_request(_REVIEW, body, "AdmissionReview")
    if review.api_version != ADMISSION_API_VERSION or review.kind != "AdmissionReview":
        raise BadRequest(f"not an {ADMISSION_API_VERSION} AdmissionReview")
    if review.request is None:
        raise BadRequest("AdmissionReview has no request")
    return review.request


# Messages quote names and keys from the request; the API server relays them to the client and
# into events, so a hostile name must not make them unbounded.
MAX_MESSAGE = 1_000


def review_response(uid: str, allowed: bool, message: str) -> dict[str, Any]:
    """The answer: HTTP 200 always; a denial carries code 403 and a message a tenant can act on."""
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        response["status"] = {"code": 403, "message": message}
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}
