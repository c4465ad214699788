"""DecoratorController `gpuclass-license`: the license Secret copies of one GPUClass.

It attaches Secrets to the class and always answers `status: null`, so it never touches the
status (the status controller owns it). Every error path keeps the copies that exist: a 4xx
changes nothing, and a plan that cannot be computed safely returns the attachments as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from hooks.controllers import STALE_RULES_RETRY_SECONDS
from hooks.controllers.licensing import class_license, license_inputs, license_rules, plan_for
from hooks.rules.invalid import InvalidObject
from hooks.rules.license import (
    LicensePlan,
    SecretCopy,
    keep_all,
)
from hooks.settings import Settings
from hooks.wire.gpuclass import InvalidSpecError, parse_spec
from hooks.wire.metacontroller import (
    SECRETS,
    BadRequest,
    CustomizeRequest,
    CustomizeResponse,
    DecoratorSync,
    DecoratorSyncResponse,
    decode_gpuclass,
)
from hooks.wire.names import namespaced_key

LicenseResult = Literal[
    "ok", "disabled", "invalid_spec", "unlicensed", "stale_related", "source_unusable"
]


@dataclass(frozen=True)
class LicenseOutcome:
    response: DecoratorSyncResponse
    class_name: str
    outcome: LicenseResult = "ok"
    plan: LicensePlan | None = None
    invalid: tuple[InvalidObject, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)


def customize(request: CustomizeRequest, settings: Settings) -> CustomizeResponse:
    target = decode_gpuclass(request.parent, "parent")
    license = class_license(target)
    if not settings.enabled or license is None:
        return CustomizeResponse(related_resources=[])
    return CustomizeResponse(related_resources=license_rules(target, license, settings))


def _respond(copies: tuple[SecretCopy, ...], retry: float | None = None) -> DecoratorSyncResponse:
    return DecoratorSyncResponse(attachments=list(copies), status=None, resync_after_seconds=retry)


def sync(request: DecoratorSync, settings: Settings) -> LicenseOutcome:
    target = decode_gpuclass(request.object, "object")
    name = target.metadata.name
    if request.attachments is None:
        raise BadRequest("request has no attachments")
    attached = request.attachments.get(SECRETS)
    if attached is not None and attached.invalid:
        raise BadRequest(f"{len(attached.invalid)} attachments do not decode")
    observed = {
        namespaced_key(s.metadata.namespace, s.metadata.name): s
        for s in (attached.objects if attached else [])
    }

    if not settings.enabled:
        return LicenseOutcome(_respond(()), name, outcome="disabled")
    try:
        spec = parse_spec(target.spec)
    except InvalidSpecError:
        # Someone is editing the class: the copies restarting VMs need stay until it is valid.
        return LicenseOutcome(
            _respond(keep_all(observed)),
            name,
            outcome="invalid_spec",
            counts={"kept": len(observed)},
        )
    if spec.license is None:
        return LicenseOutcome(_respond(()), name, outcome="unlicensed")

    inputs = license_inputs(target, spec.license, request.related, settings)
    if inputs is None:
        return LicenseOutcome(
            _respond(keep_all(observed), STALE_RULES_RETRY_SECONDS),
            name,
            outcome="stale_related",
            counts={"kept": len(observed)},
        )
    # Attachments are managed copies by definition; the related map shows the same Secrets, but
    # the attachments are what Metacontroller will delete if we leave them out.
    by_key = {namespaced_key(s.metadata.namespace, s.metadata.name): s for s in inputs.same_named}
    by_key.update(observed)
    inputs = replace(inputs, same_named=list(by_key.values()))
    plan = plan_for(target, spec.license, inputs, settings)
    return LicenseOutcome(
        _respond(plan.copies),
        name,
        outcome="ok" if plan.source.usable else "source_unusable",
        plan=plan,
        invalid=(*inputs.invalid, *plan.invalid),
        counts={
            "copies": len(plan.copies),
            "new_copies": plan.new_copies,
            "conflicts": len(plan.foreign) + len(plan.unmanaged),
        },
    )
