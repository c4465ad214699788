"""CompositeController `gpuclass-status`: the whole status of one GPUClass.

Applies, in order: spec validation, the resource-name conflict (oldest class wins), capacity over
eligible nodes, KubeVirt's permission, advertisement, the license conditions (from the license
hook's own plan), and Ready; then
settles the conditions against the current status so that the answer is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import msgspec

from hooks.controllers import STALE_RULES_RETRY_SECONDS
from hooks.controllers.license import license_inputs, license_rules, licensed_spec, plan_for
from hooks.rules.capacity import Capacity, compute_capacity
from hooks.rules.classes import class_identity, older_class_with_resource
from hooks.rules.conditions import (
    RESOURCE_NAME_NOT_PERMITTED,
    DecidedCondition,
    advertised_condition,
    conflict_condition,
    invalid_spec_condition,
    license_conflict_condition,
    license_secret_condition,
    ready_condition,
    settle,
)
from hooks.rules.invalid import InvalidObject
from hooks.rules.license import LicensePlan, copy_name
from hooks.rules.permitted_devices import KubeVirtUnreadable, KubeVirtView, permission_condition
from hooks.settings import Settings
from hooks.wire.gpuclass import InvalidSpecError, parse_spec, parse_status
from hooks.wire.kube import Condition
from hooks.wire.metacontroller import (
    GPUCLASSES,
    NODES,
    PODS,
    ClassStatus,
    CompositeSync,
    CompositeSyncResponse,
    CustomizeRequest,
    CustomizeResponse,
    DecodedGroup,
    RelatedRule,
    decode_gpuclass,
)

KUBEVIRT_RETRY_SECONDS = 10.0
StatusResult = Literal["ok", "disabled", "invalid_spec", "stale_related", "kubevirt_unreadable"]


@dataclass(frozen=True)
class StatusOutcome:
    """The response, and what the route logs and records as metrics."""

    response: CompositeSyncResponse
    class_name: str
    resource: str | None = None
    capacity: Capacity | None = None  # what the nodes hold, when the spec could be read
    exports_inventory: bool = False  # a conflicting class reports zero and exports no inventory
    outcome: StatusResult = "ok"
    invalid: tuple[InvalidObject, ...] = ()
    conditions: tuple[Condition, ...] = ()
    free: int = 0
    max_free_per_node: int = 0
    known_classes: tuple[str, ...] | None = None  # every class Metacontroller sent, or None
    counts: dict[str, int] = field(default_factory=dict)


def customize(request: CustomizeRequest, settings: Settings) -> CustomizeResponse:
    """Nodes and Pods (with the configured selectors), every GPUClass, and for a licensed class
    the license hook's own rules. With GPU features off, only the classes: the sync then only
    clears the status."""
    parent = decode_gpuclass(request.parent, "parent")
    rules = [RelatedRule(api_version="cozystack.io/v1alpha1", resource="gpuclasses")]
    if settings.enabled:
        spec = licensed_spec(parent)
        if spec is not None and spec.license is not None:
            rules.extend(license_rules(parent, spec.license, settings))
        rules = [
            RelatedRule(
                api_version="v1", resource="nodes", label_selector=settings.node_label_selector
            ),
            RelatedRule(
                api_version="v1", resource="pods", label_selector=settings.pod_label_selector
            ),
            *rules,
        ]
    return CustomizeResponse(related_resources=rules)


def _group_invalid(kind: str, group: DecodedGroup) -> list[InvalidObject]:
    return [InvalidObject(kind, key, "does not decode") for key in group.invalid]


def sync(
    request: CompositeSync,
    settings: Settings,
    read_kubevirt: Callable[[], KubeVirtView],
    now: datetime,
) -> StatusOutcome:
    parent = decode_gpuclass(request.parent, "parent")
    name = parent.metadata.name
    if not settings.enabled:
        return StatusOutcome(
            CompositeSyncResponse(status={}, children=[]),
            name,
            outcome="disabled",
            known_classes=(),  # nothing is computed: no class exports anything
        )

    generation = parent.metadata.generation
    previous_status = parse_status(parent.status)
    previous = tuple(previous_status.conditions) if previous_status else ()

    try:
        spec = parse_spec(parent.spec)
    except InvalidSpecError as error:
        conditions = settle([invalid_spec_condition(str(error))], previous, generation, now)
        status = ClassStatus(free=0, max_free_per_node=0, conditions=conditions)
        return StatusOutcome(
            CompositeSyncResponse(status=status, children=[]),
            name,
            outcome="invalid_spec",
            conditions=tuple(conditions),
        )

    nodes = request.related.get(NODES)
    pods = request.related.get(PODS)
    classes = request.related.get(GPUCLASSES)
    license_input = (
        license_inputs(parent, spec.license, request.related, settings) if spec.license else None
    )
    if nodes is None or pods is None or classes is None or (spec.license and not license_input):
        # Metacontroller sends every group it was asked for: a missing one means its cached
        # customize answer differs from ours. Keep what the status says until it catches up.
        kept: msgspec.Raw | dict[str, Any] = parent.status if previous_status is not None else {}
        return StatusOutcome(
            CompositeSyncResponse(
                status=kept, children=[], resync_after_seconds=STALE_RULES_RETRY_SECONDS
            ),
            name,
            resource=spec.resource_name,
            outcome="stale_related",
        )

    resource = spec.resource_name
    invalid = [
        *_group_invalid("Node", nodes),
        *_group_invalid("Pod", pods),
        *_group_invalid("GPUClass", classes),
    ]
    identity = class_identity(parent)
    older = older_class_with_resource(identity, (class_identity(c) for c in classes.objects))
    capacity = compute_capacity(nodes.objects, pods.objects, resource, spec.tolerations)
    invalid.extend(capacity.invalid)

    view = read_kubevirt()
    previous_permission = next((c for c in previous if c.type == RESOURCE_NAME_NOT_PERMITTED), None)
    decided: list[DecidedCondition | Condition] = [
        conflict_condition(resource, older.name if older else None),
        permission_condition(resource, view, previous_permission, generation),
        advertised_condition(resource, capacity.advertised),
    ]
    plan: LicensePlan | None = None
    if spec.license is not None and license_input is not None:
        plan = plan_for(parent, spec.license, license_input, settings)
        invalid.extend((*license_input.invalid, *plan.invalid))
        decided.append(license_secret_condition(plan.source))
        decided.append(license_conflict_condition(plan, copy_name(name)))
    decided.append(ready_condition(decided))
    conditions = settle(decided, previous, generation, now)

    conflicting = older is not None
    status = ClassStatus(
        free=0 if conflicting else capacity.free,
        max_free_per_node=0 if conflicting else capacity.max_free_per_node,
        conditions=conditions,
    )
    retry = KUBEVIRT_RETRY_SECONDS if isinstance(view, KubeVirtUnreadable) else None
    return StatusOutcome(
        CompositeSyncResponse(status=status, children=[], resync_after_seconds=retry),
        name,
        resource=resource,
        capacity=capacity,
        exports_inventory=not conflicting,
        free=status.free,
        max_free_per_node=status.max_free_per_node,
        known_classes=tuple({name, *(c.metadata.name for c in classes.objects)}),
        outcome="kubevirt_unreadable" if retry else "ok",
        invalid=tuple(invalid),
        conditions=tuple(conditions),
        counts={
            "nodes": len(nodes.objects),
            "eligible_nodes": len(capacity.eligible_nodes),
            "counted_pods": capacity.counted_pods,
            **(
                {"copies": len(plan.copies), "conflicts": len(plan.foreign) + len(plan.unmanaged)}
                if plan
                else {}
            ),
        },
    )
