"""The GPU budget admission webhook: AdmissionReview -> budget rules -> verdict.

The inputs come from a reader passed in (the Kubernetes API in production, plain lists in tests);
the arithmetic is `hooks.rules.budget`. The webhook fails closed: an input it cannot read denies
the request with a message saying what could not be read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hooks.rules.budget import (
    KUBERNETES_NODES,
    VM_INSTANCE,
    App,
    InputUnreadable,
    Tenant,
    Verdict,
    app_from,
    check_app,
    check_declaration,
    declaration,
)
from hooks.rules.classes import ClassIdentity
from hooks.wire.admission import AdmissionRequest, AppObject, decode_app_object
from hooks.wire.metacontroller import BadRequest

APPS_GROUP = "apps.cozystack.io"
CHECKED_OPERATIONS = ("CREATE", "UPDATE")


class BudgetInputs(Protocol):
    """What the webhook reads; each method raises InputUnreadable when it cannot."""

    def classes(self) -> list[ClassIdentity]: ...
    def tenants(self) -> list[Tenant]: ...
    def apps(self) -> list[App]: ...


@dataclass(frozen=True)
class AdmissionOutcome:
    verdict: Verdict
    kind: str
    namespace: str
    name: str
    operation: str


def _objects(request: AdmissionRequest) -> tuple[AppObject, AppObject | None]:
    new = decode_app_object(request.object, "object")
    if new is None:
        raise BadRequest("AdmissionReview request has no object")
    old = (
        decode_app_object(request.old_object, "oldObject")
        if request.operation == "UPDATE"
        else None
    )
    return new, old


def _name(request: AdmissionRequest, obj: AppObject) -> str:
    return obj.metadata.name or request.name


def _guarded(request: AdmissionRequest, decide: Callable[[], Verdict]) -> AdmissionOutcome:
    try:
        verdict = decide()
    except InputUnreadable as error:
        verdict = Verdict(False, f"GPU budget check failed closed: {error}")
    kind = request.kind.kind
    return AdmissionOutcome(verdict, kind, request.namespace, request.name, request.operation)


def review_app(request: AdmissionRequest, inputs: BudgetInputs) -> AdmissionOutcome:
    """VMInstance and KubernetesNodes create and update; anything else is not ours and passes."""
    kind = request.kind.kind
    if (
        request.kind.group != APPS_GROUP
        or kind not in (VM_INSTANCE, KUBERNETES_NODES)
        or request.operation not in CHECKED_OPERATIONS
    ):
        return AdmissionOutcome(
            Verdict(True), kind, request.namespace, request.name, request.operation
        )
    new_obj, old_obj = _objects(request)
    new = app_from(new_obj.spec, request.namespace, kind, _name(request, new_obj))
    old = app_from(old_obj.spec, request.namespace, kind, new.name) if old_obj else None

    def decide() -> Verdict:
        return check_app(
            new=new, old=old, apps=inputs.apps(), tenants=inputs.tenants(), classes=inputs.classes()
        )

    return _guarded(request, decide)


def review_tenant(request: AdmissionRequest, inputs: BudgetInputs) -> AdmissionOutcome:
    """The declaration gate for Tenant create and update."""
    kind = request.kind.kind
    if (
        request.kind.group != APPS_GROUP
        or kind != "Tenant"
        or request.operation not in CHECKED_OPERATIONS
    ):
        return AdmissionOutcome(
            Verdict(True), kind, request.namespace, request.name, request.operation
        )
    new_obj, old_obj = _objects(request)
    name = _name(request, new_obj)

    def decide() -> Verdict:
        where = f"Tenant {request.namespace}/{name}"
        new = Tenant(request.namespace, name, declaration(new_obj.spec.resource_quotas, where))
        old = (
            Tenant(request.namespace, name, declaration(old_obj.spec.resource_quotas, where))
            if old_obj
            else None
        )
        return check_declaration(
            new=new, old=old, apps=inputs.apps(), tenants=inputs.tenants(), classes=inputs.classes()
        )

    return _guarded(request, decide)
