"""What an app reserves: declared sizes per budget key, not use."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.tenancy import KUBERNETES_NODES, App
from hooks.rules.classes import ClassIdentity, age_key

DEFAULT_MAX_REPLICAS = 10


def classes_by_resource(classes: Iterable[ClassIdentity]) -> dict[str, ClassIdentity]:
    """The class each resource's `gpus[]` entries map to: the oldest class with that
    resourceName, as in the status (creationTimestamp, then name); classes being deleted do not
    count."""
    owners: dict[str, ClassIdentity] = {}
    for identity in sorted((c for c in classes if not c.deleting), key=age_key):
        if identity.resource_name is not None:
            owners.setdefault(identity.resource_name, identity)
    return owners


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


def replicas(app: App) -> int:
    """How many times an app's entries count: a worker pool max(maxReplicas, minReplicas), with
    maxReplicas 10 when unset (the autoscaler never goes below minReplicas)."""
    if app.kind != KUBERNETES_NODES:
        return 1
    most = DEFAULT_MAX_REPLICAS if app.max_replicas is None else app.max_replicas
    return max(most, app.min_replicas or 0)


def reservation(
    app: App | None, classes: Iterable[ClassIdentity] | dict[str, ClassIdentity]
) -> Reservation:
    """Declared sizes, not use: a VM reserves its entries per class (a halted VM too), a worker
    pool its entries times its size (`replicas`); entries of no class under the total key.
    `classes` may be given as `classes_by_resource` made them, to map many apps' entries."""
    if app is None or not app.gpus:
        return Reservation()
    owners = classes if isinstance(classes, dict) else classes_by_resource(classes)
    per_class: dict[str, int] = {}
    per_resource: dict[str, int] = {}
    for resource in app.gpus:
        owner = owners.get(resource)
        if owner is None:
            per_resource[resource] = per_resource.get(resource, 0) + 1
        else:
            key = class_key(owner.name)
            per_class[key] = per_class.get(key, 0) + 1
    times = replicas(app)
    keys = {key: count * times for key, count in per_class.items()}
    unclassed = {
        resource: count * times for resource, count in per_resource.items() if count * times
    }
    total = sum(keys.values()) + sum(unclassed.values())
    if total:
        keys[TOTAL_KEY] = total
    return Reservation(keys, unclassed)


def cannot_grow(new: App, old: App | None) -> bool:
    """An update that cannot grow any reservation, whatever the classes: its entries are among the
    old ones and, for a worker pool, its size does not grow. Such a review needs no input."""
    if not new.gpus:
        return True
    if old is None:
        return False
    return not Counter(new.gpus) - Counter(old.gpus) and replicas(new) <= replicas(old)
