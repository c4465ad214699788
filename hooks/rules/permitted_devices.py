"""Whether KubeVirt lets VMs use the class's devices: a device-plugin class's resource through its
permittedHostDevices, a DRA class's through its GPUsWithDRA feature gate."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from hooks.rules.conditions import (
    DRA_NOT_ENABLED,
    RESOURCE_NAME_NOT_PERMITTED,
    DecidedCondition,
)
from hooks.wire.kube import Condition, KubeVirt


@dataclass(frozen=True)
class KubeVirtFound:
    kubevirt: KubeVirt
    location: str  # namespace/name, for messages


@dataclass(frozen=True)
class KubeVirtAbsent:
    """The CR, or the whole KubeVirt API, does not exist (404)."""

    location: str


@dataclass(frozen=True)
class KubeVirtUnreadable:
    """The read failed for another reason; `detail` is safe to show (no credentials, no body)."""

    detail: str


KubeVirtView = KubeVirtFound | KubeVirtAbsent | KubeVirtUnreadable


def permitted_resources(kubevirt: KubeVirt) -> frozenset[str]:
    devices = kubevirt.spec.configuration.permitted_host_devices
    return frozenset(
        d.resource_name for d in (*devices.pci_host_devices, *devices.mediated_devices)
    )


def kubevirt_condition(
    kind: str,
    view: KubeVirtView,
    previous: Condition | None,
    generation: int,
    found: Callable[[KubeVirtFound], DecidedCondition],
) -> DecidedCondition | Condition:
    """A condition read from the KubeVirt CR: `found` decides it from the CR; a CR that does not
    exist makes it True. When KubeVirt cannot be read, a previous condition of the current
    generation is kept exactly as it was (a flaky API server must not flap the class); without
    one the answer is Unknown."""
    if isinstance(view, KubeVirtFound):
        return found(view)
    if isinstance(view, KubeVirtAbsent):
        return DecidedCondition(
            kind, "True", "KubeVirtNotFound", f"KubeVirt {view.location} does not exist"
        )
    if previous is not None and previous.observed_generation == generation:
        return previous
    return DecidedCondition(
        kind, "Unknown", "KubeVirtUnreadable", f"KubeVirt could not be read: {view.detail}"
    )


def permission_condition(
    resource: str, view: KubeVirtView, previous: Condition | None, generation: int
) -> DecidedCondition | Condition:
    """ResourceNameNotPermitted: whether KubeVirt's permittedHostDevices list the resource."""

    def permitted(found: KubeVirtFound) -> DecidedCondition:
        if resource in permitted_resources(found.kubevirt):
            return DecidedCondition(
                RESOURCE_NAME_NOT_PERMITTED,
                "False",
                "Permitted",
                f"{resource} is in the permittedHostDevices of KubeVirt {found.location}",
            )
        return DecidedCondition(
            RESOURCE_NAME_NOT_PERMITTED,
            "True",
            "NotInPermittedHostDevices",
            f"{resource} is in neither pciHostDevices nor mediatedDevices of the "
            f"permittedHostDevices of KubeVirt {found.location}",
        )

    return kubevirt_condition(RESOURCE_NAME_NOT_PERMITTED, view, previous, generation, permitted)


GPUS_WITH_DRA = "GPUsWithDRA"
# The first KubeVirt in which GPUsWithDRA is beta, so on unless disabled; alpha before it.
GPUS_WITH_DRA_ON_BY_DEFAULT = (1, 9)
_MINOR_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.|$|-)")


def gpus_with_dra(kubevirt: KubeVirt) -> tuple[bool, str]:
    """Whether KubeVirt hands DRA devices to VMs, and why."""
    developer = kubevirt.spec.configuration.developer_configuration
    if GPUS_WITH_DRA in developer.disabled_feature_gates:
        return False, f"{GPUS_WITH_DRA} is in its disabledFeatureGates"
    if GPUS_WITH_DRA in developer.feature_gates:
        return True, f"{GPUS_WITH_DRA} is in its featureGates"
    version = kubevirt.status.observed_kube_virt_version
    match = _MINOR_VERSION.match(version)
    if match is None:
        return False, (
            f"{GPUS_WITH_DRA} is not in its featureGates and its version is unknown "
            "(on by default only from KubeVirt 1.9)"
        )
    if (int(match[1]), int(match[2])) >= GPUS_WITH_DRA_ON_BY_DEFAULT:
        return True, f"{GPUS_WITH_DRA} is on by default in KubeVirt {version}"
    return False, f"{GPUS_WITH_DRA} is not in its featureGates (alpha in KubeVirt {version})"


def dra_enabled_condition(
    api_served: bool, view: KubeVirtView, previous: Condition | None, generation: int
) -> DecidedCondition | Condition:
    """DRANotEnabled: the API server must serve resource.k8s.io/v1 and KubeVirt must have
    GPUsWithDRA on."""
    if not api_served:
        return DecidedCondition(
            DRA_NOT_ENABLED,
            "True",
            "APINotServed",
            "the API server did not serve resource.k8s.io/v1 when the hooks were installed "
            "(dra.api in the chart)",
        )

    def gate(found: KubeVirtFound) -> DecidedCondition:
        enabled, why = gpus_with_dra(found.kubevirt)
        return DecidedCondition(
            DRA_NOT_ENABLED,
            "False" if enabled else "True",
            "Enabled" if enabled else "GPUsWithDRAOff",
            f"KubeVirt {found.location}: {why}",
        )

    return kubevirt_condition(DRA_NOT_ENABLED, view, previous, generation, gate)
