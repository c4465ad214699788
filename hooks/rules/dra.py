"""Free units of a DRA class: the devices of its driver that match its attributes, in complete
pools, one unit per physical GPU, less what allocated claims hold (docs/gpuclass.md, "DRA
classes"; the steps are numbered as there).

1. Pools: slices grouped by (driver, pool); only the highest generation is read, and a pool is
   complete when it holds `resourceSliceCount` slices of it. An incomplete pool counts nothing.
2. Candidates: devices of the class's driver whose attributes equal every one of the class's.
3. Taken: every device an allocated claim names, unless with admin access.
4. Units: devices of one pool sharing `resource.kubernetes.io/pciBusID` are one unit; a unit is
   free only when none of its devices is taken. A device drawing on shared counters is free only
   while what it draws still fits what its counter set has left after the taken devices.
5. Device taints with effect NoSchedule or NoExecute, the slice's own and those of the
   DeviceTaintRules that select the device, exclude it unless the class tolerates them.
6. A device's node is its slice's or its own; the node rules of device-plugin classes apply. A
   device several nodes reach counts in `free` and on no node.
7. `free` is the sum over units; `maxFreePerNode` the best node's.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from hooks.rules.invalid import InvalidObject
from hooks.rules.quantity import QuantityError, parse_quantity
from hooks.rules.scheduling import EXCLUDING_EFFECTS, TolerationLike, ineligibility, tolerates
from hooks.wire.dra import (
    Device,
    DeviceAttribute,
    DeviceTaintRule,
    DeviceTaintSelector,
    ResourceClaim,
    ResourceSlice,
)
from hooks.wire.kube import Node, Taint

PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
AttributeValue = str | int


@dataclass(frozen=True)
class DraNode:
    """The class's units on one node (or, named "", on several)."""

    name: str
    not_eligible_because: str | None
    units: int
    taken: int
    free: int

    @property
    def eligible(self) -> bool:
        return self.not_eligible_because is None


@dataclass(frozen=True)
class DraCapacity:
    publishing: bool  # some slice of the driver exists
    incomplete_pools: tuple[str, ...]  # "driver/pool"
    nodes: tuple[DraNode, ...]  # by name
    shared: DraNode  # units several nodes reach
    invalid: tuple[InvalidObject, ...]

    @property
    def free(self) -> int:
        return sum(n.free for n in self.nodes if n.eligible) + self.shared.free

    @property
    def max_free_per_node(self) -> int:
        return max((n.free for n in self.nodes if n.eligible), default=0)

    def totals(self, *, eligible: bool) -> tuple[int, int]:
        """(units, taken units) summed over eligible nodes and the units several nodes reach, or
        over the other nodes."""
        chosen = [n for n in (*self.nodes, self.shared) if n.eligible is eligible]
        return sum(n.units for n in chosen), sum(n.taken for n in chosen)


def qualified(driver: str, name: str) -> str:
    """An attribute's full name: one without a domain is in the driver's, as in CEL."""
    return name if "/" in name else f"{driver}/{name}"


def attribute_equals(attribute: DeviceAttribute, wanted: AttributeValue) -> bool:
    """CEL's equality of the attribute's one value with the class's: across types, false."""
    if isinstance(wanted, int):
        return attribute.integer == wanted
    return attribute.string == wanted


def cel_literal(value: AttributeValue) -> str:
    """A CEL literal of the value. JSON's string escapes are a subset of CEL's, and JSON escapes
    every quote, backslash and control character, so no value can end the literal early."""
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def device_class_selector(driver: str, attributes: Mapping[str, AttributeValue]) -> str:
    """The one CEL selector of the class's DeviceClass: the same equalities `is_candidate` applies
    (an attribute a device lacks is a mismatch, not an evaluation error)."""
    clauses = [f"device.driver == {cel_literal(driver)}"]
    for name in sorted(attributes):
        domain, _, identifier = qualified(driver, name).rpartition("/")
        attribute = f"device.attributes[{cel_literal(domain)}].{identifier}"
        clauses.append(f"has({attribute}) && {attribute} == {cel_literal(attributes[name])}")
    return " && ".join(clauses)


Wanted = tuple[tuple[tuple[str, ...], AttributeValue], ...]


def wanted_attributes(driver: str, attributes: Mapping[str, AttributeValue]) -> Wanted:
    """Each of the class's equalities with the names a device may publish its attribute under:
    qualified, and, in the driver's own domain, without the domain too."""
    wanted = []
    for name, value in attributes.items():
        full = qualified(driver, name)
        domain, _, short = full.rpartition("/")
        wanted.append(((full, short) if domain == driver else (full,), value))
    return tuple(wanted)


def is_candidate(device: Device, wanted: Wanted) -> bool:
    held = device.attributes
    for names, value in wanted:
        for name in names:
            attribute = held.get(name)
            if attribute is not None:
                break
        else:
            return False
        if not attribute_equals(attribute, value):
            return False
    return True


def latest_pools(slices: Iterable[ResourceSlice], driver: str) -> tuple[
    dict[str, list[ResourceSlice]], list[str]
]:  # fmt: skip
    """The driver's complete pools (their slices of the latest generation), and the others."""
    by_pool: dict[str, list[ResourceSlice]] = defaultdict(list)
    for resource_slice in slices:
        if resource_slice.spec.driver == driver:
            by_pool[resource_slice.spec.pool.name].append(resource_slice)
    complete: dict[str, list[ResourceSlice]] = {}
    incomplete: list[str] = []
    for pool, pool_slices in sorted(by_pool.items()):
        generation = max(s.spec.pool.generation for s in pool_slices)
        latest = [s for s in pool_slices if s.spec.pool.generation == generation]
        expected = {s.spec.pool.resource_slice_count for s in latest}
        if len(expected) == 1 and len(latest) == expected.pop():
            complete[pool] = latest
        else:
            incomplete.append(f"{driver}/{pool}")
    return complete, incomplete


def taken_devices(claims: Iterable[ResourceClaim], driver: str) -> set[tuple[str, str]]:
    """(pool, device) of every device of the driver an allocated claim holds, not for admin."""
    return {
        (result.pool, result.device)
        for claim in claims
        if claim.status.allocation is not None
        for result in claim.status.allocation.devices.results
        if result.driver == driver and not result.admin_access
    }


def untolerated(taints: Iterable[Taint], tolerations: tuple[TolerationLike, ...]) -> bool:
    return any(
        taint.effect in EXCLUDING_EFFECTS and not any(tolerates(t, taint) for t in tolerations)
        for taint in taints
    )


def driver_rules(
    rules: Iterable[DeviceTaintRule], driver: str
) -> list[tuple[DeviceTaintSelector, Taint]]:
    """The rules that may select devices of the driver: a rule without a selector selects none."""
    return [
        (rule.spec.device_selector, rule.spec.taint)
        for rule in rules
        if rule.spec.device_selector is not None
        and rule.spec.device_selector.driver in (None, driver)
    ]


def ruled_taints(
    rules: list[tuple[DeviceTaintSelector, Taint]], pool: str, device: str
) -> list[Taint]:
    """The taints of the rules whose every set field names the device's pool and name."""
    return [
        taint
        for selector, taint in rules
        if selector.pool in (None, pool) and selector.device in (None, device)
    ]


@dataclass
class _Unit:
    node: str  # "" where several nodes reach it
    taken: bool = False  # some device of it is allocated
    candidate: bool = False  # some device of it is of the class
    usable: bool = False  # some candidate of it is untainted and fits its counters


def _draws(device: Device) -> dict[tuple[str, str], Fraction]:
    """What the device draws, by (counter set, counter). Raises QuantityError."""
    if not device.consumes_counters:
        return {}
    drawn: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
    for consumption in device.consumes_counters:
        for counter, value in consumption.counters.items():
            drawn[consumption.counter_set, counter] += parse_quantity(value.value)
    return drawn


def compute_dra_capacity(
    slices: Iterable[ResourceSlice],
    claims: Iterable[ResourceClaim],
    nodes: Iterable[Node],
    driver: str,
    attributes: Mapping[str, AttributeValue],
    tolerations: Iterable[TolerationLike],
    taint_rules: Iterable[DeviceTaintRule] = (),
) -> DraCapacity:
    tolerations = tuple(tolerations)
    rules = driver_rules(taint_rules, driver)
    invalid: list[InvalidObject] = []
    wanted = wanted_attributes(driver, attributes)
    pools, incomplete = latest_pools(slices, driver)
    taken = taken_devices(claims, driver)
    units: dict[tuple[str, str], _Unit] = {}
    for pool, pool_slices in pools.items():
        left: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        devices: list[tuple[ResourceSlice, Device, dict[tuple[str, str], Fraction]]] = []
        for resource_slice in pool_slices:
            try:
                for counter_set in resource_slice.spec.shared_counters:
                    for counter, value in counter_set.counters.items():
                        left[counter_set.name, counter] += parse_quantity(value.value)
                devices.extend((resource_slice, d, _draws(d)) for d in resource_slice.spec.devices)
            except QuantityError as error:
                invalid.append(
                    InvalidObject(
                        "ResourceSlice", resource_slice.metadata.name, f"counter: {error}"
                    )
                )
        for _, device, drawn in devices:
            if (pool, device.name) in taken:
                for key, amount in drawn.items():
                    left[key] -= amount
        for resource_slice, device, drawn in devices:
            bus = device.attributes.get(PCI_BUS_ID)
            unit_key = (pool, bus.string) if bus is not None and bus.string else (pool, device.name)
            unit = units.get(unit_key)
            if unit is None:
                unit = units[unit_key] = _Unit(resource_slice.node_of(device) or "")
            held = (pool, device.name) in taken
            unit.taken = unit.taken or held
            if is_candidate(device, wanted):
                unit.candidate = True
                taints = device.taints
                if rules:
                    taints = [*taints, *ruled_taints(rules, pool, device.name)]
                if not held and not untolerated(taints, tolerations):
                    unit.usable = unit.usable or all(v <= left[k] for k, v in drawn.items())
    candidate_units = [u for u in units.values() if u.candidate]
    why_not = {node.metadata.name: ineligibility(node, tolerations) for node in nodes}
    per_node: dict[str, list[_Unit]] = defaultdict(list)
    for unit in candidate_units:
        per_node[unit.node].append(unit)

    def summed(name: str, reason: str | None) -> DraNode:
        held = per_node.get(name, [])
        free = sum(1 for u in held if u.usable and not u.taken)
        taken_units = sum(1 for u in held if u.taken)
        return DraNode(name, reason, len(held), taken_units, free)

    return DraCapacity(
        publishing=bool(pools or incomplete),
        incomplete_pools=tuple(incomplete),
        nodes=tuple(
            summed(name, why_not.get(name, "not a known node"))
            for name in sorted(n for n in per_node if n)
        ),
        shared=summed("", None),
        invalid=tuple(invalid),
    )
