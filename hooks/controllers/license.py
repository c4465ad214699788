"""DecoratorController `gpuclass-license`: the license Secret copies of one GPUClass.

It attaches Secrets to the class and always answers `status: null`, so it never touches the
status (the status controller owns it). Every error path keeps the copies that exist: a 4xx
changes nothing, and a plan that cannot be computed safely returns the attachments as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from hooks.controllers import STALE_RULES_RETRY_SECONDS
from hooks.rules.invalid import InvalidObject
from hooks.rules.license import (
    LicensePlan,
    SecretCopy,
    copy_name,
    keep_all,
    plan_license,
    source_location,
)
from hooks.settings import Settings
from hooks.wire.gpuclass import ClassSpec, InvalidSpecError, License, parse_spec
from hooks.wire.kube import GPUClass, Namespace, Secret
from hooks.wire.metacontroller import (
    NAMESPACES,
    SECRETS,
    BadRequest,
    CustomizeRequest,
    CustomizeResponse,
    DecodedGroup,
    DecoratorSync,
    DecoratorSyncResponse,
    LabelSelector,
    RelatedRule,
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


def license_rules(gpuclass: GPUClass, license: License, settings: Settings) -> list[RelatedRule]:
    """The source Secret (only from an allowed namespace), the entitled Namespaces, and every
    Secret named like the copy in any namespace (to see tenants' Secrets of that name)."""
    namespace, name = source_location(license, settings.license_namespaces)
    rules = []
    if namespace in settings.license_namespaces:
        rules.append(
            RelatedRule(api_version="v1", resource="secrets", namespace=namespace, names=[name])
        )
    rules.append(
        RelatedRule(
            api_version="v1",
            resource="namespaces",
            label_selector=LabelSelector(match_labels={settings.vgpu_namespace_label: "true"}),
        )
    )
    rules.append(
        RelatedRule(api_version="v1", resource="secrets", names=[copy_name(gpuclass.metadata.name)])
    )
    return rules


def licensed_spec(gpuclass: GPUClass) -> ClassSpec | None:
    """The spec when it is valid and names a license; customize answers depend on nothing else."""
    try:
        spec = parse_spec(gpuclass.spec)
    except InvalidSpecError:
        return None
    return spec if spec.license is not None else None


def customize(request: CustomizeRequest, settings: Settings) -> CustomizeResponse:
    target = decode_gpuclass(request.parent, "parent")
    spec = licensed_spec(target)
    if not settings.enabled or spec is None or spec.license is None:
        return CustomizeResponse(related_resources=[])
    return CustomizeResponse(related_resources=license_rules(target, spec.license, settings))


@dataclass(frozen=True)
class LicenseInputs:
    """The related objects of a licensed class, split the way the plan reads them."""

    source: Secret | None
    same_named: list[Secret]
    undecodable_same_named: list[str]
    namespaces: list[Namespace]
    undecodable_namespaces: list[str]
    invalid: list[InvalidObject]


def license_inputs(
    gpuclass: GPUClass, license: License, related: Mapping[str, DecodedGroup], settings: Settings
) -> LicenseInputs | None:
    """None when a group the customize rules ask for is missing (stale cached rules)."""
    secrets = related.get(SECRETS)
    namespaces = related.get(NAMESPACES)
    if secrets is None or namespaces is None:
        return None
    source_key = namespaced_key(*source_location(license, settings.license_namespaces))
    name = copy_name(gpuclass.metadata.name)
    source = None
    same_named = []
    for secret in secrets.objects:
        key = namespaced_key(secret.metadata.namespace, secret.metadata.name)
        if key == source_key:
            source = secret
        if secret.metadata.name == name:
            same_named.append(secret)
    return LicenseInputs(
        source=source,
        same_named=same_named,
        undecodable_same_named=[k for k in secrets.invalid if k.endswith(f"/{name}")],
        namespaces=namespaces.objects,
        undecodable_namespaces=list(namespaces.invalid),
        invalid=[
            *(InvalidObject("Secret", key, "does not decode") for key in secrets.invalid),
            *(InvalidObject("Namespace", key, "does not decode") for key in namespaces.invalid),
        ],
    )


def plan_for(
    gpuclass: GPUClass, license: License, inputs: LicenseInputs, settings: Settings
) -> LicensePlan:
    """The one plan both hooks use."""
    return plan_license(
        class_name=gpuclass.metadata.name,
        class_uid=gpuclass.metadata.uid,
        license=license,
        allowed_namespaces=settings.license_namespaces,
        entitlement_label=settings.vgpu_namespace_label,
        source=inputs.source,
        namespaces=inputs.namespaces,
        undecodable_namespaces=inputs.undecodable_namespaces,
        same_named=inputs.same_named,
        undecodable_same_named=inputs.undecodable_same_named,
    )


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
