"""The conditions of a GPUClass, each as its decider makes it from plain values (their registry,
Ready and settling are `hooks.rules.class_status`)."""

from __future__ import annotations

from dataclasses import dataclass

from hooks.rules.license import LicensePlan, SourceState

RESOURCE_NAME_CONFLICT = "ResourceNameConflict"
RESOURCE_NAME_NOT_PERMITTED = "ResourceNameNotPermitted"
RESOURCE_NOT_ADVERTISED = "ResourceNotAdvertised"
LICENSE_SECRET_MISSING = "LicenseSecretMissing"
LICENSE_COPY_CONFLICT = "LicenseCopyConflict"
DEVICE_CLASS_CONFLICT = "DeviceClassConflict"
DRA_NOT_ENABLED = "DRANotEnabled"
DRIVER_NOT_PUBLISHING = "DriverNotPublishing"
POOLS_INCOMPLETE = "PoolsIncomplete"
READY = "Ready"


@dataclass(frozen=True)
class DecidedCondition:
    """A condition as a rule decides it, before it gets its time and generation."""

    type: str
    status: str
    reason: str
    message: str = ""


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


def invalid_spec_condition(message: str) -> DecidedCondition:
    return DecidedCondition(READY, "False", "InvalidSpec", message)


def device_class_conflict_condition(
    device_class: str, older_class: str | None, foreign: bool
) -> DecidedCondition:
    """DeviceClassConflict: an older class selects the same devices, or a DeviceClass of the
    class's name exists that the class did not create (it is never written over)."""
    if older_class is not None:
        return DecidedCondition(
            DEVICE_CLASS_CONFLICT,
            "True",
            "OlderClassHasDevices",
            f"class {older_class} is older and has the same driver and attributes",
        )
    if foreign:
        return DecidedCondition(
            DEVICE_CLASS_CONFLICT,
            "True",
            "ForeignDeviceClass",
            f"a DeviceClass {device_class} exists that this class did not create; it is never "
            f"written over: delete it to let the class create its own",
        )
    return DecidedCondition(
        DEVICE_CLASS_CONFLICT, "False", "NoConflict", f"the class owns DeviceClass {device_class}"
    )


def driver_publishing_condition(driver: str, publishing: bool) -> DecidedCondition:
    if publishing:
        return DecidedCondition(
            DRIVER_NOT_PUBLISHING, "False", "Publishing", f"{driver} publishes ResourceSlices"
        )
    return DecidedCondition(
        DRIVER_NOT_PUBLISHING, "True", "NoResourceSlices", f"no ResourceSlice of driver {driver}"
    )


def pools_complete_condition(driver: str, incomplete: tuple[str, ...]) -> DecidedCondition:
    """PoolsIncomplete: pools whose latest generation lacks slices count nothing, rather than
    a guess (the driver is still writing them, or one was lost)."""
    if incomplete:
        return DecidedCondition(
            POOLS_INCOMPLETE,
            "True",
            "SlicesMissing",
            f"{len(incomplete)} pools hold fewer slices of their latest generation than their "
            f"resourceSliceCount and count nothing: {_first_five(incomplete)}",
        )
    return DecidedCondition(
        POOLS_INCOMPLETE, "False", "Complete", f"every pool of {driver} is complete"
    )
