"""Whether KubeVirt lets VMs use the class's resource (its permittedHostDevices)."""

from __future__ import annotations

from dataclasses import dataclass

from hooks.rules.conditions import RESOURCE_NAME_NOT_PERMITTED, DecidedCondition
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


def permission_condition(
    resource: str, view: KubeVirtView, previous: Condition | None, generation: int
) -> DecidedCondition | Condition:
    """ResourceNameNotPermitted. When KubeVirt cannot be read, a previous condition of the current
    generation is kept exactly as it was (a flaky API server must not flap the class); without
    one the answer is Unknown."""
    if isinstance(view, KubeVirtFound):
        if resource in permitted_resources(view.kubevirt):
            return DecidedCondition(
                RESOURCE_NAME_NOT_PERMITTED,
                "False",
                "Permitted",
                f"{resource} is in the permittedHostDevices of KubeVirt {view.location}",
            )
        return DecidedCondition(
            RESOURCE_NAME_NOT_PERMITTED,
            "True",
            "NotInPermittedHostDevices",
            f"{resource} is in neither pciHostDevices nor mediatedDevices of the "
            f"permittedHostDevices of KubeVirt {view.location}",
        )
    if isinstance(view, KubeVirtAbsent):
        return DecidedCondition(
            RESOURCE_NAME_NOT_PERMITTED,
            "True",
            "KubeVirtNotFound",
            f"KubeVirt {view.location} does not exist",
        )
    if previous is not None and previous.observed_generation == generation:
        return previous
    return DecidedCondition(
        RESOURCE_NAME_NOT_PERMITTED,
        "Unknown",
        "KubeVirtUnreadable",
        f"KubeVirt could not be read: {view.detail}",
    )
