"""Conditions of a GPUClass: their fixed order, Ready, and stable transition times.

The hook is stateless, so the status must be idempotent: fed its own output as the parent's
status, it returns the same status. That is what lets the classes, which are each other's related
objects, settle instead of re-syncing one another forever.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from hooks.rules.license import LicensePlan, SourceState
from hooks.wire.kube import Condition

RESOURCE_NAME_CONFLICT = "ResourceNameConflict"
RESOURCE_NAME_NOT_PERMITTED = "ResourceNameNotPermitted"
RESOURCE_NOT_ADVERTISED = "ResourceNotAdvertised"
LICENSE_SECRET_MISSING = "LicenseSecretMissing"
LICENSE_COPY_CONFLICT = "LicenseCopyConflict"
READY = "Ready"

ORDER = (
    RESOURCE_NAME_CONFLICT,
    RESOURCE_NAME_NOT_PERMITTED,
    RESOURCE_NOT_ADVERTISED,
    LICENSE_SECRET_MISSING,
    LICENSE_COPY_CONFLICT,
    READY,
)
# The conditions that make a class unable to serve VMs, in the order Ready reports them.
# LicenseCopyConflict is absent on purpose: it concerns single namespaces, not the class.
READY_BLOCKERS = (
    RESOURCE_NAME_CONFLICT,
    RESOURCE_NAME_NOT_PERMITTED,
    RESOURCE_NOT_ADVERTISED,
    LICENSE_SECRET_MISSING,
)


@dataclass(frozen=True)
class DecidedCondition:
    """A condition as a rule decides it, before it gets its time and generation."""

    type: str
    status: str
    reason: str
    message: str = ""


def rfc3339(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def conflict_condition(resource: str, older_class: str | None) -> DecidedCondition:
    if older_class is None:
        return DecidedCondition(
            RESOURCE_NAME_CONFLICT, "False", "NoConflict", f"no older class has {resource}"
        )
    return DecidedCondition(
        RESOURCE_NAME_CONFLICT,
        "True",
        "OlderClassHasResource",
        f"class {older_class} is older and has the same resourceName {resource}",
    )


def advertised_condition(resource: str, advertised: bool) -> DecidedCondition:
    if advertised:
        return DecidedCondition(
            RESOURCE_NOT_ADVERTISED, "False", "Advertised", f"nodes advertise {resource}"
        )
    return DecidedCondition(
        RESOURCE_NOT_ADVERTISED,
        "True",
        "NoNodeAdvertises",
        f"no node lists {resource} in status.capacity",
    )


def license_secret_condition(source: SourceState) -> DecidedCondition:
    """LicenseSecretMissing: True with why the source cannot be copied, False when it can."""
    return DecidedCondition(
        LICENSE_SECRET_MISSING, "False" if source.usable else "True", source.reason, source.message
    )


def _first_five(namespaces: tuple[str, ...]) -> str:
    shown = ", ".join(namespaces[:5])
    return shown + (", ..." if len(namespaces) > 5 else "")


def license_conflict_condition(plan: LicensePlan, copy: str) -> DecidedCondition:
    """LicenseCopyConflict: namespaces where a Secret named like the copy is not ours."""
    if plan.foreign:
        return DecidedCondition(
            LICENSE_COPY_CONFLICT,
            "True",
            "ForeignSecret",
            f"{len(plan.foreign)} entitled namespaces hold a Secret {copy} that is not a managed "
            f"copy and get no copy: {_first_five(plan.foreign)}",
        )
    if plan.unmanaged:
        return DecidedCondition(
            LICENSE_COPY_CONFLICT,
            "True",
            "UnmanagedCopy",
            f"{len(plan.unmanaged)} namespaces hold a copy {copy} with our labels that no class "
            f"manages (orphaned, or written by another controller); delete it to let the hook "
            f"manage it: {_first_five(plan.unmanaged)}",
        )
    return DecidedCondition(
        LICENSE_COPY_CONFLICT, "False", "NoConflict", f"no foreign Secret named {copy}"
    )


def ready_condition(conditions: Iterable[DecidedCondition | Condition]) -> DecidedCondition:
    """Ready: False with the first failing blocker, Unknown when only KubeVirt is unknown."""
    by_type = {c.type: c for c in conditions}
    for blocker in READY_BLOCKERS:
        failing = by_type.get(blocker)
        if failing is not None and failing.status == "True":
            return DecidedCondition(READY, "False", blocker, failing.message)
    permission = by_type.get(RESOURCE_NAME_NOT_PERMITTED)
    if permission is not None and permission.status == "Unknown":
        return DecidedCondition(READY, "Unknown", "KubeVirtUnreadable", permission.message)
    return DecidedCondition(READY, "True", READY, "the class can serve VMs")


def invalid_spec_condition(message: str) -> DecidedCondition:
    return DecidedCondition(READY, "False", "InvalidSpec", message)


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
    for item in sorted(decided, key=lambda c: rank.get(c.type, len(ORDER))):
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
