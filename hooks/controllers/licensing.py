"""What both controllers of a licensed class share: the related objects its license needs, how
they are split for the plan, and the one plan both hooks compute (the copies the license hook
attaches, the conditions the status hook reports)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hooks.rules.invalid import InvalidObject
from hooks.rules.license import LicensePlan, copy_name, plan_license, source_location
from hooks.settings import Settings
from hooks.wire.gpuclass import InvalidSpecError, License, parse_spec
from hooks.wire.kube import GPUClass, Namespace, Secret
from hooks.wire.metacontroller import (
    NAMESPACES,
    SECRETS,
    DecodedGroup,
    LabelSelector,
    RelatedRule,
)
from hooks.wire.names import namespaced_key


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


def class_license(gpuclass: GPUClass) -> License | None:
    """The license a valid spec names; customize answers depend on nothing else."""
    try:
        return parse_spec(gpuclass.spec).license
    except InvalidSpecError:
        return None


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
