"""The conditions of a GPUClass's status: the registry of deciders, Ready, and stable transition
times.

Each condition is one `ConditionRule`: its type, its decider (`ClassFacts` in, a condition out, or
None where it does not apply) and whether it blocks Ready. The registry's order is the order of
the status. A new condition is one decider and one entry here.

The hook is stateless, so the status must be idempotent: fed its own output as the parent's
status, it returns the same status. That is what lets the classes, which are each other's related
objects, settle instead of re-syncing one another forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from hooks.rules.conditions import (
    DEVICE_CLASS_CONFLICT,
    DRA_NOT_ENABLED,
    DRIVER_NOT_PUBLISHING,
    LICENSE_COPY_CONFLICT,
    LICENSE_SECRET_MISSING,
    POOLS_INCOMPLETE,
    READY,
    RESOURCE_NAME_CONFLICT,
    RESOURCE_NAME_NOT_PERMITTED,
    RESOURCE_NOT_ADVERTISED,
    DecidedCondition,
    advertised_condition,
    conflict_condition,
    device_class_conflict_condition,
    driver_publishing_condition,
    license_conflict_condition,
    license_secret_condition,
    pools_complete_condition,
)
from hooks.rules.license import LicensePlan
from hooks.rules.permitted_devices import (
    KubeVirtView,
    dra_enabled_condition,
    permission_condition,
)
from hooks.wire.kube import Condition


@dataclass(frozen=True)
class DraFacts:
    """What the deciders of a DRA class read besides the common facts."""

    driver: str
    api_served: bool  # the API server serves resource.k8s.io/v1 (the chart says)
    foreign_device_class: bool  # a DeviceClass of the class's name that it did not create
    incomplete_pools: tuple[str, ...]


@dataclass(frozen=True)
class ClassFacts:
    """What the deciders read of one class's sync. A DRA class has `dra`, and its `resource` is
    its DeviceClass; a device-plugin class has none."""

    resource: str
    older_class: str | None  # the older class with the same resourceName (DRA: devices), if any
    kubevirt: KubeVirtView
    previous: tuple[Condition, ...]  # the conditions of the current status
    generation: int
    advertised: bool  # some node lists the resource in status.capacity (DRA: some slice exists)
    license: LicensePlan | None  # the license plan; None for a class that names no license
    copy_name: str  # the name of the class's license copies
    dra: DraFacts | None = None

    def previous_of(self, condition_type: str) -> Condition | None:
        return next((c for c in self.previous if c.type == condition_type), None)


Decided = DecidedCondition | Condition


@dataclass(frozen=True)
class ConditionRule:
    type: str
    decide: Callable[[ClassFacts], Decided | None]
    blocks_ready: bool  # a True status means the class cannot serve VMs (Ready says which)


def _conflict(facts: ClassFacts) -> Decided | None:
    return None if facts.dra else conflict_condition(facts.resource, facts.older_class)


def _permission(facts: ClassFacts) -> Decided | None:
    if facts.dra:
        return None  # KubeVirt skips permittedHostDevices for DRA devices
    previous = facts.previous_of(RESOURCE_NAME_NOT_PERMITTED)
    return permission_condition(facts.resource, facts.kubevirt, previous, facts.generation)


def _advertised(facts: ClassFacts) -> Decided | None:
    return None if facts.dra else advertised_condition(facts.resource, facts.advertised)


def _device_class_conflict(facts: ClassFacts) -> Decided | None:
    if facts.dra is None:
        return None
    return device_class_conflict_condition(
        facts.resource, facts.older_class, facts.dra.foreign_device_class
    )


def _dra_enabled(facts: ClassFacts) -> Decided | None:
    if facts.dra is None:
        return None
    previous = facts.previous_of(DRA_NOT_ENABLED)
    return dra_enabled_condition(facts.dra.api_served, facts.kubevirt, previous, facts.generation)


def _driver_publishing(facts: ClassFacts) -> Decided | None:
    if facts.dra is None:
        return None
    return driver_publishing_condition(facts.dra.driver, facts.advertised)


def _pools_complete(facts: ClassFacts) -> Decided | None:
    if facts.dra is None:
        return None
    return pools_complete_condition(facts.dra.driver, facts.dra.incomplete_pools)


def _license_secret(facts: ClassFacts) -> Decided | None:
    return None if facts.license is None else license_secret_condition(facts.license.source)


def _license_conflict(facts: ClassFacts) -> Decided | None:
    if facts.license is None:
        return None
    return license_conflict_condition(facts.license, facts.copy_name)


# In the order of the status. LicenseCopyConflict does not block Ready on purpose: it concerns
# single namespaces, not the class.
CONDITIONS: tuple[ConditionRule, ...] = (
    ConditionRule(RESOURCE_NAME_CONFLICT, _conflict, blocks_ready=True),
    ConditionRule(RESOURCE_NAME_NOT_PERMITTED, _permission, blocks_ready=True),
    ConditionRule(RESOURCE_NOT_ADVERTISED, _advertised, blocks_ready=True),
    ConditionRule(DEVICE_CLASS_CONFLICT, _device_class_conflict, blocks_ready=True),
    ConditionRule(DRA_NOT_ENABLED, _dra_enabled, blocks_ready=True),
    ConditionRule(DRIVER_NOT_PUBLISHING, _driver_publishing, blocks_ready=True),
    ConditionRule(POOLS_INCOMPLETE, _pools_complete, blocks_ready=True),
    ConditionRule(LICENSE_SECRET_MISSING, _license_secret, blocks_ready=True),
    ConditionRule(LICENSE_COPY_CONFLICT, _license_conflict, blocks_ready=False),
)
ORDER = (*(rule.type for rule in CONDITIONS), READY)
# The conditions that make a class unable to serve VMs, in the order Ready reports them.
READY_BLOCKERS = tuple(rule.type for rule in CONDITIONS if rule.blocks_ready)


def class_conditions(facts: ClassFacts) -> list[Decided]:
    """Every condition that applies, in the registry's order, then Ready."""
    decided = [c for rule in CONDITIONS if (c := rule.decide(facts)) is not None]
    return [*decided, ready_condition(decided)]


def rfc3339(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(conditions: Iterable[DecidedCondition | Condition]) -> DecidedCondition:
    """Ready: False with the first failing blocker; else Unknown with the first unknown one (only
    KubeVirt's conditions can be); else True."""
    by_type = {c.type: c for c in conditions}
    for blocker in READY_BLOCKERS:
        failing = by_type.get(blocker)
        if failing is not None and failing.status == "True":
            return DecidedCondition(READY, "False", blocker, failing.message)
    for blocker in READY_BLOCKERS:
        unknown = by_type.get(blocker)
        if unknown is not None and unknown.status == "Unknown":
            return DecidedCondition(READY, "Unknown", unknown.reason, unknown.message)
    return DecidedCondition(READY, "True", READY, "the class can serve VMs")


def settle(
    decided: Iterable[DecidedCondition | Condition],
    previous: Sequence[Condition],
    generation: int,
    now: datetime,
) -> list[Condition]:
    """Conditions in the fixed order. A condition whose status did not change keeps its
    lastTransitionTime verbatim; a kept Condition passes through untouched."""
    previous_by_type = {c.type: c for c in previous}
    rank = {kind: index for index, kind in enumerate(ORDER)}
    settled: list[Condition] = []
    for item in sorted(decided, key=lambda c: rank[c.type]):
        if isinstance(item, Condition):
            settled.append(item)
            continue
        before = previous_by_type.get(item.type)
        unchanged = before is not None and before.status == item.status
        settled.append(
            Condition(
                type=item.type,
                status=item.status,
                reason=item.reason,
                message=item.message,
                last_transition_time=before.last_transition_time
                if before is not None and unchanged
                else rfc3339(now),
                observed_generation=generation,
            )
        )
    return settled
