"""Which class owns a resource name, or a DRA class's devices, when several classes name the same:
the oldest."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hooks.rules.dra import device_class_selector
from hooks.wire.gpuclass import DraSpec, InvalidSpecError, parse_spec
from hooks.wire.kube import GPUClass


@dataclass(frozen=True)
class ClassIdentity:
    """What the ordering of classes reads. `resource_name` is what a VM's `gpus[]` entry names
    to take a unit of the class (a DRA class's DeviceClass); `dra_selector` is a DRA class's
    selector, over which DRA classes compete as device-plugin classes compete over their resource.
    Both are None for a class with an invalid spec, which then never competes for anything."""

    name: str
    created: str | None
    deleting: bool
    resource_name: str | None
    dra_selector: str | None = None

    @property
    def competes_for(self) -> str | None:
        return self.dra_selector or self.resource_name


def age_key(identity: ClassIdentity) -> tuple[bool, str, str]:
    """Oldest first: creationTimestamp, then name. Kubernetes writes RFC 3339 UTC with seconds and
    `Z`, so the strings order like the times. A class without a timestamp (or with an empty one)
    sorts as the youngest, so a malformed object never takes a resource from a real class."""
    return (not identity.created, identity.created or "", identity.name)


def older_class_with_resource(
    parent: ClassIdentity, classes: Iterable[ClassIdentity]
) -> ClassIdentity | None:
    """The oldest class, older than the parent and not being deleted, with the same resource (or,
    for a DRA class, the same driver and attributes)."""
    if parent.competes_for is None:
        return None
    rivals = [
        other
        for other in classes
        if other.name != parent.name
        and not other.deleting
        and other.competes_for == parent.competes_for
        and age_key(other) < age_key(parent)
    ]
    return min(rivals, key=age_key, default=None)


def class_identity(gpuclass: GPUClass) -> ClassIdentity:
    """How a class takes part in the ordering; an invalid spec competes for nothing."""
    metadata = gpuclass.metadata
    try:
        spec = parse_spec(gpuclass.spec)
    except InvalidSpecError:
        spec = None
    return ClassIdentity(
        name=metadata.name,
        created=metadata.creation_timestamp,
        deleting=metadata.deletion_timestamp is not None,
        resource_name=spec.budget_name(metadata.name) if spec else None,
        dra_selector=dra_selector(spec.dra) if spec and spec.dra else None,
    )


def dra_selector(dra: DraSpec) -> str:
    """The DeviceClass's selector: equal for two classes exactly when they select the same
    devices by the same equalities (it is generated in one order)."""
    return device_class_selector(dra.driver, dra.attributes)
