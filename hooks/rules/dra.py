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
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import compress
from operator import attrgetter

from hooks.rules.invalid import InvalidObject
from hooks.rules.quantity import QuantityError, parse_quantity
from hooks.rules.scheduling import TolerationLike, ineligibility, untolerated_taint
from hooks.wire.dra import (
    Column,
    DeviceAttribute,
    DeviceTaintRule,
    DeviceTaintSelector,
    ResourceClaim,
    ResourceSlice,
    attribute_reader,
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


@dataclass(frozen=True)
class Wanted:
    """The attributes a class reads, by name (the PCI address last), and its equalities: each the
    positions of the names a device may publish the attribute under, and the value it must be."""

    names: tuple[str, ...]
    equalities: tuple[tuple[tuple[int, ...], DeviceAttribute], ...]


def wanted_attributes(driver: str, attributes: Mapping[str, AttributeValue]) -> Wanted:
    """Each of the class's equalities under the names a device may publish its attribute under:
    qualified, and, in the driver's own domain, without the domain too."""
    names: list[str] = []
    equalities = []
    for name, value in attributes.items():
        full = qualified(driver, name)
        domain, _, short = full.rpartition("/")
        aliases = (full, short) if domain == driver else (full,)
        positions = tuple(range(len(names), len(names) + len(aliases)))
        equalities.append((positions, as_attribute(value)))
        names.extend(aliases)
    return Wanted((*names, PCI_BUS_ID), tuple(equalities))


def as_attribute(value: AttributeValue) -> DeviceAttribute:
    """The class's value as a device publishes it: equal only to an attribute of its one type and
    value, as in CEL, where values of different types are never equal."""
    if isinstance(value, int):
        return DeviceAttribute(integer=value)
    return DeviceAttribute(string=value)


def candidates(columns: Sequence[Column], wanted: Wanted) -> list[bool]:
    """Whether each device is of the class: every equality holds, each attribute read under the
    first of its names the device publishes. One pass over the devices per equality."""
    matching = [True] * len(columns[-1])
    for positions, value in wanted.equalities:
        if len(positions) == 2:
            full, short = (columns[p] for p in positions)
            matching = [
                ok and (a if a is not None else b) == value
                for ok, a, b in zip(matching, full, short, strict=True)
            ]
        else:
            [only] = (columns[p] for p in positions)
            matching = [ok and a == value for ok, a in zip(matching, only, strict=True)]
    return matching


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


def taken_devices(claims: Iterable[ResourceClaim], driver: str) -> dict[str, set[str]]:
    """The devices of the driver an allocated claim holds, not for admin, by pool."""
    taken: dict[str, set[str]] = defaultdict(set)
    for claim in claims:
        if claim.status.allocation is not None:
            for result in claim.status.allocation.devices.results:
                if result.driver == driver and not result.admin_access:
                    taken[result.pool].add(result.device)
    return taken


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


Draws = dict[tuple[str, str], Fraction]
NOTHING_TAKEN: frozenset[str] = frozenset()
NO_DRAWS: Draws = {}
_CONSUMES_COUNTERS = attrgetter("consumes_counters")


def _slice_draws(
    resource_slice: ResourceSlice, pool: str, left: dict[tuple[str, str, str], Fraction]
) -> list[Draws] | None:
    """Adds the slice's counter sets to what its pool has left, and returns what each of its
    devices draws (by counter set and counter), or None where none draws anything. Raises
    QuantityError."""
    for counter_set in resource_slice.spec.shared_counters:
        for counter, value in counter_set.counters.items():
            left[pool, counter_set.name, counter] += parse_quantity(value.value)
    devices = resource_slice.spec.devices
    if not any(map(_CONSUMES_COUNTERS, devices)):
        return None
    every: list[Draws] = []
    for device in devices:
        drawn: Draws = defaultdict(Fraction)
        for consumption in device.consumes_counters:
            for counter, value in consumption.counters.items():
                drawn[consumption.counter_set, counter] += parse_quantity(value.value)
        every.append(drawn)
    return every


def fits(drawn: Draws, pool: str, left: dict[tuple[str, str, str], Fraction]) -> bool:
    return all(amount <= left[pool, *key] for key, amount in drawn.items())


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
    # What each counter set of a pool has left, by (pool, counter set, counter).
    left: dict[tuple[str, str, str], Fraction] = defaultdict(Fraction)
    read_slices: list[tuple[str, ResourceSlice, list[Draws] | None]] = []
    for pool, pool_slices in pools.items():
        held_in_pool = taken.get(pool, NOTHING_TAKEN)
        for resource_slice in pool_slices:
            try:
                drawn = _slice_draws(resource_slice, pool, left)
            except QuantityError as error:
                invalid.append(
                    InvalidObject(
                        "ResourceSlice", resource_slice.metadata.name, f"counter: {error}"
                    )
                )
                continue
            read_slices.append((pool, resource_slice, drawn))
            for device, draws in zip(resource_slice.spec.devices, drawn or (), strict=False):
                if device.name in held_in_pool:
                    for (counter_set_name, counter), amount in draws.items():
                        left[pool, counter_set_name, counter] -= amount
    # Every device read, in order, with its pool, node and what it draws.
    devices = [d for _, s, _ in read_slices for d in s.spec.devices]
    pool_of = [pool for pool, s, _ in read_slices for _ in s.spec.devices]
    # Each device's node, "" where several nodes reach it.
    node_of = [
        node if node is not None else (s.node_of(device) or "")
        for _, s, _ in read_slices
        for node in (s.node_of_every_device(),)
        for device in s.spec.devices
    ]
    # Empty where no device draws on counters, as for most drivers.
    drawn_of = (
        [
            draws
            for _, s, drawn in read_slices
            for draws in (drawn if drawn is not None else [NO_DRAWS] * len(s.spec.devices))
        ]
        if any(drawn is not None for _, _, drawn in read_slices)
        else []
    )
    read = attribute_reader(wanted.names)(devices)
    slice_of = [s for _, s, _ in read_slices for _ in s.spec.devices] if read.unread else []
    for position in read.unread:
        invalid.append(
            InvalidObject(
                "ResourceSlice",
                slice_of[position].metadata.name,
                f"device {devices[position].name}: attributes do not decode",
            )
        )
    unit_of = [
        (pool, bus.string if bus is not None and bus.string else device.name)
        for pool, bus, device in zip(pool_of, read.columns[-1], devices, strict=True)
    ]
    held = [
        device.name in names
        for pool, s, _ in read_slices
        for names in (taken.get(pool, NOTHING_TAKEN),)
        for device in s.spec.devices
    ]
    taken_units = set(compress(unit_of, held))
    # The class's units, each on the node of its first device of the class ("" for several).
    node_of_unit: dict[tuple[str, str], str] = {}
    usable: set[tuple[str, str]] = set()
    for position in compress(range(len(devices)), candidates(read.columns, wanted)):
        unit = unit_of[position]
        device = devices[position]
        if unit not in node_of_unit:
            node_of_unit[unit] = node_of[position]
        if held[position] or unit in usable:
            continue
        taints = device.taints
        if rules:
            taints = (*taints, *ruled_taints(rules, pool_of[position], device.name))
        if taints and untolerated_taint(taints, tolerations) is not None:
            continue
        draws = drawn_of[position] if drawn_of else NO_DRAWS
        if not draws or fits(draws, pool_of[position], left):
            usable.add(unit)
    free_units = usable - taken_units
    units_on = Counter(node_of_unit.values())
    taken_on = Counter(node for unit, node in node_of_unit.items() if unit in taken_units)
    free_on = Counter(node for unit, node in node_of_unit.items() if unit in free_units)
    why_not = {node.metadata.name: ineligibility(node, tolerations) for node in nodes}

    def summed(name: str, reason: str | None) -> DraNode:
        return DraNode(name, reason, units_on[name], taken_on[name], free_on[name])

    return DraCapacity(
        publishing=bool(pools or incomplete),
        incomplete_pools=tuple(incomplete),
        nodes=tuple(
            summed(name, why_not.get(name, "not a known node"))
            for name in sorted(n for n in units_on if n)
        ),
        shared=summed("", None),
        invalid=tuple(invalid),
    )
