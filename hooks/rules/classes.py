"""Which class owns a resource name when several name the same one: the oldest."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hooks.wire.gpuclass import InvalidSpecError, parse_spec
from hooks.wire.kube import GPUClass


@dataclass(frozen=True)
class ClassIdentity:
    """What the ordering of classes reads. `resource_name` is None for a class with an invalid
    spec, which then never competes for a resource."""

    name: str
    created: str | None
    deleting: bool
    resource_name: str | None


def age_key(identity: ClassIdentity) -> tuple[bool, str, str]:
    """Oldest first: creationTimestamp, then name. Kubernetes writes RFC 3339 UTC with seconds and
    `Z`, so the strings order like the times. A class without a timestamp (or with an empty one)
    sorts as the youngest, so a malformed object never takes a resource from a real class."""
    return (not identity.created, identity.created or "", identity.name)


def older_class_with_resource(
    parent: ClassIdentity, classes: Iterable[ClassIdentity]
) -> ClassIdentity | None:
    """The oldest class, older than the parent and not being deleted, with the same resource."""
    if parent.resource_name is None:
        return None
    rivals = [
        other
        for other in classes
        if other.name != parent.name
        and not other.deleting
        and other.resource_name == parent.resource_name
        and age_key(other) < age_key(parent)
    ]
    return min(rivals, key=age_key, default=None)


def class_identity(gpuclass: GPUClass) -> ClassIdentity:
    """How a class takes part in the ordering; an invalid spec competes for nothing."""
    try:
        resource: str | None = parse_spec(gpuclass.spec).resource_name
    except InvalidSpecError:
        resource = None
    metadata = gpuclass.metadata
    return ClassIdentity(
        name=metadata.name,
        created=metadata.creation_timestamp,
        deleting=metadata.deletion_timestamp is not None,
        resource_name=resource,
    )
