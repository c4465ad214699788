"""CompositeController `gpuclass-status`: the whole status of one GPUClass.

Gates first (features off, an invalid spec, related groups of other rules), then computes the
capacity over eligible nodes and decides every condition of the registry
(`hooks.rules.class_status`: the resource-name conflict, where the oldest class wins, KubeVirt's
permission, advertisement, the license conditions from the license hook's own plan, and Ready),
settled against the current status so that the answer is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import msgspec

from hooks.controllers import STALE_RULES_RETRY_SECONDS
from hooks.controllers.licensing import (
    LicenseInputs,
    class_license,
    license_inputs,
    license_rules,
    plan_for,
)
from hooks.rules.capacity import Capacity, compute_capacity
from hooks.rules.class_status import ClassFacts, class_conditions, settle
from hooks.rules.classes import class_identity, older_class_with_resource
from hooks.rules.conditions import invalid_spec_condition
from hooks.rules.invalid import InvalidObject
from hooks.rules.license import copy_name
from hooks.rules.permitted_devices import KubeVirtUnreadable, KubeVirtView
from hooks.rules.resource_labels import LABELLED, resource_label
from hooks.settings import Settings
from hooks.wire.gpuclass import ClassSpec, InvalidSpecError, parse_spec, parse_status
from hooks.wire.kube import Condition, GPUClass
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
    LabelSelector,
    RelatedRule,
    Requirement,
    decode_gpuclass,
)

KUBEVIRT_RETRY_SECONDS = 10.0
StatusResult = Literal["ok", "disabled", "invalid_spec", "stale_related", "kubevirt_unreadable"]


@dataclass(frozen=True)
class ClassComputation:
    """One class's status computation, from the controller to the metrics: every class the sync
    saw (None when the request did not say, so that deleted classes are forgotten), the capacity
    (None when the spec could not be read), whether the class exports its inventory (a
    conflicting class reports zero and does not), and its conditions (none: nothing to record)."""

    class_name: str
    known_classes: tuple[str, ...] | None = None
    resource: str | None = None
    capacity: Capacity | None = None
    exports_inventory: bool = False
    free: int = 0
    max_free_per_node: int = 0
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True)
class StatusOutcome:
    """The response, and what the route logs and records as metrics."""

    response: CompositeSyncResponse
    computation: ClassComputation
    outcome: StatusResult = "ok"
    invalid: tuple[InvalidObject, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def class_name(self) -> str:
        return self.computation.class_name


def labelled_rules(
    resource_kind: str, selector: LabelSelector | None, resource: str | None
) -> list[RelatedRule]:
    """The pods or nodes whose changes reach this class: of those the configured selector picks,
    the ones the resource labeller marked as naming the class's resource, and the ones it has not
    read yet (`hooks.rules.resource_labels`; Metacontroller sends what either rule selects, once).
    Without a label for the resource (an invalid spec, a domain too long for a label key) the
    configured selector alone."""
    label = resource_label(resource) if resource is not None else None
    if label is None:
        return [RelatedRule(api_version="v1", resource=resource_kind, label_selector=selector)]
    return [
        RelatedRule(
            api_version="v1",
            resource=resource_kind,
            label_selector=LabelSelector(
                match_labels=selector.match_labels if selector else None,
                match_expressions=[
                    *(selector.match_expressions or [] if selector else []),
                    requirement,
                ],
            ),
        )
        for requirement in (
            Requirement(key=label, operator="Exists"),
            Requirement(key=LABELLED, operator="DoesNotExist"),
        )
    ]


def customize(request: CustomizeRequest, settings: Settings) -> CustomizeResponse:
    """The Nodes and Pods the configured selectors pick that name the class's resource or are
    not labelled yet, every GPUClass, and for a licensed class the license hook's own rules.
    With GPU features off, only the classes: the sync then only clears the status."""
    parent = decode_gpuclass(request.parent, "parent")
    resource = class_identity(parent).resource_name
    rules = [RelatedRule(api_version="cozystack.io/v1alpha1", resource="gpuclasses")]
    if settings.enabled:
        license = class_license(parent)
        if license is not None:
            rules.extend(license_rules(parent, license, settings))
        rules = [
            *labelled_rules("nodes", settings.node_label_selector, resource),
            *labelled_rules("pods", settings.pod_label_selector, resource),
            *rules,
        ]
    return CustomizeResponse(related_resources=rules)


def _group_invalid(kind: str, group: DecodedGroup) -> list[InvalidObject]:
    return [InvalidObject(kind, key, "does not decode") for key in group.invalid]


@dataclass(frozen=True)
class _Related:
    """The related groups of a sync, all present, and the license's inputs for a licensed class."""

    nodes: DecodedGroup
    pods: DecodedGroup
    classes: DecodedGroup
    license: LicenseInputs | None


def _related(
    parent: GPUClass, spec: ClassSpec, request: CompositeSync, settings: Settings
) -> _Related | None:
    """None when a group the customize rules ask for is missing: Metacontroller sends every group
    it was asked for, so its cached customize answer differs from ours."""
    nodes = request.related.get(NODES)
    pods = request.related.get(PODS)
    classes = request.related.get(GPUCLASSES)
    if nodes is None or pods is None or classes is None:
        return None
    if spec.license is None:
        return _Related(nodes, pods, classes, None)
    license = license_inputs(parent, spec.license, request.related, settings)
    return None if license is None else _Related(nodes, pods, classes, license)


def sync(
    request: CompositeSync,
    settings: Settings,
    read_kubevirt: Callable[[], KubeVirtView],
    now: datetime,
) -> StatusOutcome:
    """Gate (features off, an invalid spec, stale related groups), decide every condition of the
    registry, and the outcome."""
    parent = decode_gpuclass(request.parent, "parent")
    name = parent.metadata.name
    if not settings.enabled:
        # nothing is computed: no class exports anything
        return StatusOutcome(
            CompositeSyncResponse(status={}, children=[]),
            ClassComputation(name, known_classes=()),
            outcome="disabled",
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
            ClassComputation(name, conditions=tuple(conditions)),
            outcome="invalid_spec",
        )
    related = _related(parent, spec, request, settings)
    if related is None:
        # Keep what the status says until Metacontroller catches up.
        kept: msgspec.Raw | dict[str, Any] = parent.status if previous_status is not None else {}
        return StatusOutcome(
            CompositeSyncResponse(
                status=kept, children=[], resync_after_seconds=STALE_RULES_RETRY_SECONDS
            ),
            ClassComputation(name, resource=spec.resource_name),
            outcome="stale_related",
        )
    return _computed(parent, spec, related, settings, read_kubevirt(), previous, now)


def _computed(
    parent: GPUClass,
    spec: ClassSpec,
    related: _Related,
    settings: Settings,
    view: KubeVirtView,
    previous: tuple[Condition, ...],
    now: datetime,
) -> StatusOutcome:
    name, resource = parent.metadata.name, spec.resource_name
    classes = related.classes.objects
    identity = class_identity(parent)
    older = older_class_with_resource(identity, (class_identity(c) for c in classes))
    capacity = compute_capacity(
        related.nodes.objects, related.pods.objects, resource, spec.tolerations
    )
    plan = None
    if spec.license is not None and related.license is not None:
        plan = plan_for(parent, spec.license, related.license, settings)
    facts = ClassFacts(
        resource=resource,
        older_class=older.name if older else None,
        kubevirt=view,
        previous=previous,
        generation=parent.metadata.generation,
        advertised=capacity.advertised,
        license=plan,
        copy_name=copy_name(name),
    )
    conditions = settle(class_conditions(facts), previous, parent.metadata.generation, now)
    conflicting = older is not None
    status = ClassStatus(
        free=0 if conflicting else capacity.free,
        max_free_per_node=0 if conflicting else capacity.max_free_per_node,
        conditions=conditions,
    )
    retry = KUBEVIRT_RETRY_SECONDS if isinstance(view, KubeVirtUnreadable) else None
    invalid = [
        *_group_invalid("Node", related.nodes),
        *_group_invalid("Pod", related.pods),
        *_group_invalid("GPUClass", related.classes),
        *capacity.invalid,
        *(related.license.invalid if related.license else ()),
        *(plan.invalid if plan else ()),
    ]
    return StatusOutcome(
        CompositeSyncResponse(status=status, children=[], resync_after_seconds=retry),
        ClassComputation(
            name,
            known_classes=tuple({name, *(c.metadata.name for c in classes)}),
            resource=resource,
            capacity=capacity,
            exports_inventory=not conflicting,
            free=status.free,
            max_free_per_node=status.max_free_per_node,
            conditions=tuple(conditions),
        ),
        outcome="kubevirt_unreadable" if retry else "ok",
        invalid=tuple(invalid),
        counts={
            "nodes": len(related.nodes.objects),
            "eligible_nodes": len(capacity.eligible_nodes),
            "counted_pods": capacity.counted_pods,
            **(
                {"copies": len(plan.copies), "conflicts": len(plan.foreign) + len(plan.unmanaged)}
                if plan
                else {}
            ),
        },
    )
