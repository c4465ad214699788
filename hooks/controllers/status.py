"""CompositeController `gpuclass-status`: the whole status of one GPUClass, and a DRA class's
DeviceClass, its one kind of child.

Gates first (features off, an invalid spec, related groups of other rules), then computes the
capacity over eligible nodes (a device-plugin class's from nodes and pods, a DRA class's from
ResourceSlices and ResourceClaims) and decides every condition of the registry
(`hooks.rules.class_status`: the conflict, where the oldest class wins, KubeVirt's permission or
feature gate, advertisement or publishing, the license conditions from the license hook's own
plan, and Ready), settled against the current status so that the answer is idempotent.
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
    license_inputs,
    license_rules,
    plan_for,
)
from hooks.rules.capacity import Capacity, compute_capacity
from hooks.rules.class_status import ClassFacts, DraFacts, class_conditions, settle
from hooks.rules.classes import class_identity, dra_selector, older_class_with_resource
from hooks.rules.conditions import DEVICE_CLASS_CONFLICT, invalid_spec_condition
from hooks.rules.dra import DraCapacity, compute_dra_capacity
from hooks.rules.invalid import InvalidObject
from hooks.rules.license import LicensePlan, copy_name
from hooks.rules.permitted_devices import KubeVirtUnreadable, KubeVirtView
from hooks.rules.resource_labels import LABELLED, resource_label
from hooks.settings import Settings
from hooks.wire.dra import (
    DEVICE_TAINT_RULES_API_VERSION,
    DRA_API_VERSION,
    CelSelector,
    ChildMeta,
    DeviceClass,
    DeviceClassChild,
    DeviceClassSpec,
    DeviceSelector,
)
from hooks.wire.gpuclass import (
    ClassSpec,
    DraSpec,
    InvalidSpecError,
    device_class_name,
    parse_spec,
    parse_status,
)
from hooks.wire.kube import Condition, GPUClass
from hooks.wire.metacontroller import (
    DEVICE_CLASSES,
    DEVICE_TAINT_RULES,
    GPUCLASS_API_VERSION,
    GPUCLASSES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
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
    capacity: Capacity | DraCapacity | None = None
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


def dra_rules(class_name: str, settings: Settings) -> list[RelatedRule]:
    """A DRA class's devices: the Nodes the configured selector picks, every ResourceSlice and
    ResourceClaim, every DeviceTaintRule where the API server serves them, and the DeviceClass of
    its name (whoever made it); nothing where the API server does not serve DRA."""
    if not settings.dra_api:
        return []
    taint_rules = [
        RelatedRule(api_version=DEVICE_TAINT_RULES_API_VERSION, resource="devicetaintrules")
    ]
    return [
        *(taint_rules if settings.dra_device_taint_rules else []),
        *labelled_rules("nodes", settings.node_label_selector, None),
        RelatedRule(api_version=DRA_API_VERSION, resource="resourceslices"),
        RelatedRule(api_version=DRA_API_VERSION, resource="resourceclaims"),
        RelatedRule(
            api_version=DRA_API_VERSION,
            resource="deviceclasses",
            names=[device_class_name(class_name)],
        ),
    ]


def customize(request: CustomizeRequest, settings: Settings) -> CustomizeResponse:
    """A device-plugin class: the Nodes and Pods the configured selectors pick that name the
    class's resource or are not labelled yet; a DRA class: `dra_rules`. Then every GPUClass, and
    for a licensed class the license hook's own rules. With GPU features off, only the classes:
    the sync then only clears the status."""
    parent = decode_gpuclass(request.parent, "parent")
    rules = [RelatedRule(api_version=GPUCLASS_API_VERSION, resource="gpuclasses")]
    if not settings.enabled:
        return CustomizeResponse(related_resources=rules)
    try:
        spec: ClassSpec | None = parse_spec(parent.spec)
    except InvalidSpecError:
        spec = None
    if spec is not None and spec.dra is not None:
        return CustomizeResponse(
            related_resources=[*dra_rules(parent.metadata.name, settings), *rules]
        )
    if spec is not None and spec.license is not None:
        rules.extend(license_rules(parent, spec.license, settings))
    resource = spec.resource_name if spec is not None else None
    return CustomizeResponse(
        related_resources=[
            *labelled_rules("nodes", settings.node_label_selector, resource),
            *labelled_rules("pods", settings.pod_label_selector, resource),
            *rules,
        ]
    )


def _group_invalid(kind: str, group: DecodedGroup) -> list[InvalidObject]:
    return [InvalidObject(kind, key, "does not decode") for key in group.invalid]


@dataclass(frozen=True)
class _Related:
    """The related groups of a device-plugin class's sync, all present, and the license's inputs
    for a licensed class."""

    nodes: DecodedGroup
    pods: DecodedGroup
    classes: DecodedGroup
    license: LicenseInputs | None


NOTHING = DecodedGroup([], [])


@dataclass(frozen=True)
class _DraRelated:
    """The related groups of a DRA class's sync; without the DRA API, none but the classes."""

    classes: DecodedGroup
    nodes: DecodedGroup = NOTHING
    slices: DecodedGroup = NOTHING
    claims: DecodedGroup = NOTHING
    device_classes: DecodedGroup = NOTHING
    taint_rules: DecodedGroup = NOTHING


def _related(
    parent: GPUClass, spec: ClassSpec, request: CompositeSync, settings: Settings
) -> _Related | _DraRelated | None:
    """None when a group the customize rules ask for is missing: Metacontroller sends every group
    it was asked for, so its cached customize answer differs from ours."""
    groups = request.related
    classes = groups.get(GPUCLASSES)
    if classes is None:
        return None
    if spec.dra is not None:
        if not settings.dra_api:
            return _DraRelated(classes)
        nodes, slices, claims, device_classes = (
            groups.get(key) for key in (NODES, RESOURCE_SLICES, RESOURCE_CLAIMS, DEVICE_CLASSES)
        )
        if nodes is None or slices is None or claims is None or device_classes is None:
            return None
        taint_rules = groups.get(DEVICE_TAINT_RULES) if settings.dra_device_taint_rules else NOTHING
        if taint_rules is None:
            return None
        return _DraRelated(classes, nodes, slices, claims, device_classes, taint_rules)
    nodes = groups.get(NODES)
    pods = groups.get(PODS)
    if nodes is None or pods is None:
        return None
    if spec.license is None:
        return _Related(nodes, pods, classes, None)
    license = license_inputs(parent, spec.license, groups, settings)
    return None if license is None else _Related(nodes, pods, classes, license)


def device_class_child(class_name: str, dra: DraSpec) -> DeviceClassChild:
    """The class's DeviceClass: one CEL selector, exactly the class's driver and attributes."""
    return DeviceClassChild(
        metadata=ChildMeta(name=device_class_name(class_name), labels={CLASS_LABEL: class_name}),
        spec=DeviceClassSpec(
            selectors=[DeviceSelector(cel=CelSelector(expression=dra_selector(dra)))]
        ),
    )


CLASS_LABEL = "gpuclass.cozystack.io/class"


def _kept_children(
    parent: GPUClass, spec: ClassSpec, previous: tuple[Condition, ...], settings: Settings
) -> list[DeviceClassChild]:
    """While the related groups are stale, the DeviceClass the class had stays: an empty list
    would have Metacontroller delete it. One the status said is not the class's is not named."""
    if spec.dra is None or not settings.dra_api:
        return []
    conflict = next((c for c in previous if c.type == DEVICE_CLASS_CONFLICT), None)
    if conflict is None or conflict.status != "False":
        return []
    return [device_class_child(parent.metadata.name, spec.dra)]


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
                status=kept,
                children=_kept_children(parent, spec, previous, settings),
                resync_after_seconds=STALE_RULES_RETRY_SECONDS,
            ),
            ClassComputation(name, resource=spec.budget_name(name)),
            outcome="stale_related",
        )
    if isinstance(related, _DraRelated):
        assert spec.dra is not None  # _related gives DRA groups only to a DRA class
        return _computed_dra(
            parent, spec, spec.dra, related, settings, read_kubevirt(), previous, now
        )
    return _computed(parent, spec, related, settings, read_kubevirt(), previous, now)


def _outcome(
    parent: GPUClass,
    facts: ClassFacts,
    capacity: Capacity | DraCapacity,
    classes: list[GPUClass],
    children: list[DeviceClassChild],
    invalid: list[InvalidObject],
    counts: dict[str, int],
    now: datetime,
) -> StatusOutcome:
    """What both kinds of class answer once their capacity and facts are known: a class that an
    older one outranks reports zero and exports nothing."""
    name = parent.metadata.name
    conditions = settle(class_conditions(facts), facts.previous, facts.generation, now)
    conflicting = facts.older_class is not None
    status = ClassStatus(
        free=0 if conflicting else capacity.free,
        max_free_per_node=0 if conflicting else capacity.max_free_per_node,
        conditions=conditions,
        device_class=facts.resource if facts.dra is not None else None,
    )
    retry = KUBEVIRT_RETRY_SECONDS if isinstance(facts.kubevirt, KubeVirtUnreadable) else None
    return StatusOutcome(
        CompositeSyncResponse(status=status, children=children, resync_after_seconds=retry),
        ClassComputation(
            name,
            known_classes=tuple({name, *(c.metadata.name for c in classes)}),
            resource=facts.resource,
            capacity=capacity,
            exports_inventory=not conflicting,
            free=status.free,
            max_free_per_node=status.max_free_per_node,
            conditions=tuple(conditions),
        ),
        outcome="kubevirt_unreadable" if retry else "ok",
        invalid=tuple(invalid),
        counts=counts,
    )


def _computed(
    parent: GPUClass,
    spec: ClassSpec,
    related: _Related,
    settings: Settings,
    view: KubeVirtView,
    previous: tuple[Condition, ...],
    now: datetime,
) -> StatusOutcome:
    resource = spec.budget_name(parent.metadata.name)
    classes = related.classes.objects
    capacity = compute_capacity(
        related.nodes.objects, related.pods.objects, resource, spec.tolerations
    )
    plan = None
    if spec.license is not None and related.license is not None:
        plan = plan_for(parent, spec.license, related.license, settings)
    facts = _facts(
        parent, resource, classes, view, previous, advertised=capacity.advertised, license=plan
    )
    invalid = [
        *_group_invalid("Node", related.nodes),
        *_group_invalid("Pod", related.pods),
        *_group_invalid("GPUClass", related.classes),
        *capacity.invalid,
        *(related.license.invalid if related.license else ()),
        *(plan.invalid if plan else ()),
    ]
    counts = {
        "nodes": len(related.nodes.objects),
        "eligible_nodes": len(capacity.eligible_nodes),
        "counted_pods": capacity.counted_pods,
        **(
            {"copies": len(plan.copies), "conflicts": len(plan.foreign) + len(plan.unmanaged)}
            if plan
            else {}
        ),
    }
    return _outcome(parent, facts, capacity, classes, [], invalid, counts, now)


def _facts(
    parent: GPUClass,
    resource: str,
    classes: list[GPUClass],
    view: KubeVirtView,
    previous: tuple[Condition, ...],
    *,
    advertised: bool,
    license: LicensePlan | None = None,
    dra: DraFacts | None = None,
) -> ClassFacts:
    """What the deciders read, for either kind of class: the older class it competes with is
    found the same way for both."""
    older = older_class_with_resource(class_identity(parent), map(class_identity, classes))
    return ClassFacts(
        resource=resource,
        older_class=older.name if older else None,
        kubevirt=view,
        previous=previous,
        generation=parent.metadata.generation,
        advertised=advertised,
        license=license,
        copy_name=copy_name(parent.metadata.name),
        dra=dra,
    )


def is_foreign(device_class: DeviceClass, parent: GPUClass) -> bool:
    """A DeviceClass the class did not create: Metacontroller makes the class its owner."""
    return not any(
        owner.uid == parent.metadata.uid for owner in device_class.metadata.owner_references
    )


def _computed_dra(
    parent: GPUClass,
    spec: ClassSpec,
    dra: DraSpec,
    related: _DraRelated,
    settings: Settings,
    view: KubeVirtView,
    previous: tuple[Condition, ...],
    now: datetime,
) -> StatusOutcome:
    name = parent.metadata.name
    classes = related.classes.objects
    device_class = device_class_name(name)
    foreign = any(
        d.metadata.name == device_class and is_foreign(d, parent)
        for d in related.device_classes.objects
    )
    capacity = compute_dra_capacity(
        related.slices.objects,
        related.claims.objects,
        related.nodes.objects,
        dra.driver,
        dra.attributes,
        spec.tolerations,
        related.taint_rules.objects,
    )
    facts = _facts(
        parent,
        device_class,
        classes,
        view,
        previous,
        advertised=capacity.publishing,  # a DRA class's devices are advertised in slices
        dra=DraFacts(
            driver=dra.driver,
            api_served=settings.dra_api,
            foreign_device_class=foreign,
            incomplete_pools=capacity.incomplete_pools,
        ),
    )
    owns_device_class = settings.dra_api and facts.older_class is None and not foreign
    invalid = [
        *_group_invalid("Node", related.nodes),
        *_group_invalid("ResourceSlice", related.slices),
        *_group_invalid("ResourceClaim", related.claims),
        *_group_invalid("DeviceClass", related.device_classes),
        *_group_invalid("DeviceTaintRule", related.taint_rules),
        *_group_invalid("GPUClass", related.classes),
        *capacity.invalid,
    ]
    counts = {
        "nodes": len(related.nodes.objects),
        "eligible_nodes": sum(1 for n in capacity.nodes if n.eligible),
        "slices": len(related.slices.objects),
        "claims": len(related.claims.objects),
        "taint_rules": len(related.taint_rules.objects),
    }
    children = [device_class_child(name, dra)] if owns_device_class else []
    return _outcome(parent, facts, capacity, classes, children, invalid, counts, now)
