"""What an app reserves: declared sizes per budget key, not use. The devices a VM attaches are
its gpus entries plus those of the cluster instance type it names; the catalog says what each
instance type attaches and which class each device counts for."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.tenancy import App, Group
from hooks.rules.classes import ClassIdentity, age_key

INSTANCE_TYPE_KIND = "VirtualMachineClusterInstancetype"


class FailedClosed(Exception):
    """An object this verdict's arithmetic needs could not be read."""


class SizeUnreadable(FailedClosed):
    """A worker pool's size that does not decode, on a group that attaches a device: its
    `problem` names the field."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.problem = problem


def classes_by_resource(classes: Iterable[ClassIdentity]) -> dict[str, ClassIdentity]:
    """The class each resource's `gpus[]` entries map to: the oldest class with that
    resourceName, as in the status (creationTimestamp, then name); classes being deleted do not
    count."""
    owners: dict[str, ClassIdentity] = {}
    for identity in sorted((c for c in classes if not c.deleting), key=age_key):
        if identity.resource_name is not None:
            owners.setdefault(identity.resource_name, identity)
    return owners


@dataclass(frozen=True, eq=False)
class Catalog:
    """What the hoster defines that reservations read: the GPUClasses, and the devices each
    cluster instance type attaches to a VM that names it (by resource name, one item per
    device; an instance type not listed attaches none). `unreadable_types` names the instance
    types that could not be read, and why: an app naming one fails closed where it counts."""

    classes: tuple[ClassIdentity, ...] = ()
    instance_types: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unreadable_types: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def owners(self) -> dict[str, ClassIdentity]:
        """`classes_by_resource` of the classes, worked out once."""
        return classes_by_resource(self.classes)


@dataclass(frozen=True)
class Reservation:
    """What an app reserves per budget key (the total key included), and, apart, the devices of
    entries that map to no class, by the resource they name (their class was deleted, or is not
    made yet). Those still count under the total key: devices in use never leave the accounting
    because a class went away."""

    keys: Mapping[str, int] = field(default_factory=dict)
    unclassed: Mapping[str, int] = field(default_factory=dict)

    def get(self, key: str) -> int:
        return self.keys.get(key, 0)

    @property
    def unmapped(self) -> frozenset[str]:
        """The resources of entries that map to no class."""
        return frozenset(self.unclassed)

    @property
    def unmapped_devices(self) -> int:
        return sum(self.unclassed.values())


def attached(group: Group, catalog: Catalog) -> tuple[str, ...]:
    """The devices each VM of the group attaches: its gpus entries, then its instance type's."""
    if group.instance_type is None:
        return group.gpus
    problem = catalog.unreadable_types.get(group.instance_type)
    if problem is not None:
        raise FailedClosed(f"{INSTANCE_TYPE_KIND} {group.instance_type}: {problem}")
    return group.gpus + tuple(catalog.instance_types.get(group.instance_type, ()))


def reservation(app: App | None, catalog: Catalog) -> Reservation:
    """Declared sizes, not use: every device a group's VMs attach (a halted VM's too), times the
    group's replicas, per class; devices of no class under the total key only. FailedClosed
    where a group that attaches a device cannot be read (its size, its instance type)."""
    if app is None:
        return Reservation()
    per_class: Counter[str] = Counter()
    per_resource: Counter[str] = Counter()
    for group in app.groups:
        devices = attached(group, catalog)
        if devices and group.size_problem is not None:
            raise SizeUnreadable(app.where, group.size_problem)
        for resource in devices:
            owner = catalog.owners.get(resource)
            if owner is None:
                per_resource[resource] += group.replicas
            else:
                per_class[class_key(owner.name)] += group.replicas
    keys = {key: units for key, units in per_class.items() if units}
    unclassed = {resource: units for resource, units in per_resource.items() if units}
    total = sum(keys.values()) + sum(unclassed.values())
    if total:
        keys[TOTAL_KEY] = total
    return Reservation(keys, unclassed)


def demand(app: App) -> Counter[tuple[str, str]]:
    """What an app asks for before the catalog says what that means: each gpus entry's resource
    and each instance type it names, times its group's replicas."""
    asked: Counter[tuple[str, str]] = Counter()
    for group in app.groups:
        for resource in group.gpus:
            asked["resource", resource] += group.replicas
        if group.instance_type is not None:
            asked["instance type", group.instance_type] += group.replicas
    return +asked


def cannot_grow(new: App, old: App | None) -> bool:
    """A change that cannot grow any reservation, whatever the catalog: it asks for nothing, or
    (an update) for nothing the old value did not ask for as often. Every device counts the same
    whatever asks for it, so such a review needs no input."""
    if any(g.size_problem is not None and (g.gpus or g.instance_type) for g in new.groups):
        return False  # how often it asks is unknown: judged, where its field is named
    asked = demand(new)
    if not asked:
        return True
    if old is None:
        return False
    return not asked - demand(old)
