"""Dynamic Resource Allocation (`resource.k8s.io/v1`): the parts of ResourceSlices and
ResourceClaims a DRA class's status reads, decoded straight from bytes like nodes and pods.

A slice publishes a pool's devices (a driver's whole inventory is the pool's slices of its latest
generation); a claim's status names the devices the scheduler allocated to it. Quantities stay
strings, as in `hooks.wire.kube`: parsing them is a rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter

import msgspec

from hooks.wire.kube import NameOnlyMeta, ObjectMeta, Taint, _Wire, is_absent
from hooks.wire.problems import Undecodable, decoded

DRA_API_VERSION = "resource.k8s.io/v1"
# DeviceTaintRules are beta (off by default) while the rest of DRA is GA.
DEVICE_TAINT_RULES_API_VERSION = "resource.k8s.io/v1beta2"


class DeviceAttribute(_Wire, frozen=True, rename={"integer": "int"}):
    """One typed value, of the types a class can equal. A driver sets exactly one type; its bool
    and version values are left unread, as a class's string or integer never equals them in CEL."""

    integer: int | None = None
    string: str | None = None


_NO_ATTRIBUTES = b"{}"
_ATTRIBUTES_OF = attrgetter("attributes")


Column = list[DeviceAttribute | None]


@dataclass(frozen=True)
class AttributesRead:
    """The attributes read, a column per name in the order asked: each device's value of that
    name, or None where it has none. A device whose attributes do not decode reads as having
    none, and is in `unread`."""

    columns: list[Column]
    unread: list[int]  # positions in the devices read


@lru_cache(maxsize=64)
def attribute_reader(names: tuple[str, ...]) -> Callable[[Sequence[Device]], AttributesRead]:
    """Reads these attributes of each device: one decode for all the devices, the other
    attributes skipped unread."""
    fields = [f"a{i}" for i in range(len(names))]
    wanted = msgspec.defstruct(
        "WantedAttributes",
        [(field, DeviceAttribute | None, None) for field in fields],
        rename=dict(zip(fields, names, strict=True)),
        frozen=True,
        gc=False,
    )
    # null attributes read as none, as an absent field does
    each = msgspec.json.Decoder(wanted | None)
    nothing = wanted()
    getters = [attrgetter(field) for field in fields]

    def read(devices: Sequence[Device]) -> AttributesRead:
        unread: list[int] = []
        try:
            # One value per device, one after another: a device without attributes sends none.
            every = each.decode_lines(b"\n".join(map(_ATTRIBUTES_OF, devices)))
        except (msgspec.DecodeError, RecursionError):  # as `decoded` catches: each on its own
            every = []
        if len(every) != len(devices) or None in every:
            # some device's attributes are absent, null or malformed: each on its own
            every = []
            for position, one in enumerate(map(_ATTRIBUTES_OF, devices)):
                try:
                    found = decoded(each, one or _NO_ATTRIBUTES)
                except Undecodable:
                    unread.append(position)
                    found = None
                every.append(nothing if found is None else found)
        return AttributesRead([list(map(getter, every)) for getter in getters], unread)

    return read


class CounterValue(_Wire, frozen=True):
    value: str = "0"


class CounterSet(_Wire, frozen=True):
    """A slice's shared counters (`spec.sharedCounters[]`): what devices of the set draw on."""

    name: str = ""
    counters: dict[str, CounterValue] = {}


class CounterConsumption(_Wire, frozen=True):
    counter_set: str = ""
    counters: dict[str, CounterValue] = {}


class Device(_Wire, frozen=True):
    name: str = ""
    # Kept raw: a class reads only its own few attributes of the many a driver publishes
    # (`attribute_reader`), which is most of what a slice holds.
    attributes: msgspec.Raw = msgspec.Raw()
    consumes_counters: tuple[CounterConsumption, ...] = ()
    taints: tuple[Taint, ...] = ()
    node_name: str | None = None
    all_nodes: bool | None = None
    # Kept raw: only whether it is set is read (such a device is reachable from several nodes).
    node_selector: msgspec.Raw = msgspec.Raw()

    @property
    def several_nodes(self) -> bool:
        return bool(self.all_nodes) or not is_absent(self.node_selector)


class Pool(_Wire, frozen=True):
    name: str = ""
    generation: int = 0
    resource_slice_count: int = 0


class ResourceSliceSpec(_Wire, frozen=True):
    driver: str = ""
    pool: Pool = Pool()
    node_name: str | None = None
    all_nodes: bool | None = None
    node_selector: msgspec.Raw = msgspec.Raw()
    # Set when each device says its own node (`nodeName`, `allNodes` or `nodeSelector`).
    per_device_node_selection: bool | None = None
    shared_counters: tuple[CounterSet, ...] = ()
    devices: tuple[Device, ...] = ()


class ResourceSlice(_Wire, frozen=True):
    metadata: NameOnlyMeta = NameOnlyMeta()
    spec: ResourceSliceSpec = ResourceSliceSpec()

    def node_of(self, device: Device) -> str | None:
        """The one node the device is on, or None where several nodes reach it."""
        if self.spec.per_device_node_selection:
            return None if device.several_nodes else device.node_name or None
        return self.node_of_every_device() or None

    def node_of_every_device(self) -> str | None:
        """The node every device of the slice is on, "" where several nodes reach them all,
        None where each device says its own."""
        spec = self.spec
        if spec.per_device_node_selection:
            return None
        if spec.all_nodes or not is_absent(spec.node_selector):
            return ""
        return spec.node_name or ""


class AllocationResult(_Wire, frozen=True):
    driver: str = ""
    pool: str = ""
    device: str = ""
    admin_access: bool | None = None


class DeviceAllocation(_Wire, frozen=True):
    results: tuple[AllocationResult, ...] = ()


class Allocation(_Wire, frozen=True):
    devices: DeviceAllocation = DeviceAllocation()


class ResourceClaimStatus(_Wire, frozen=True):
    allocation: Allocation | None = None


class ResourceClaim(_Wire, frozen=True):
    """Deleting claims count until they are gone: the driver holds their devices till then."""

    metadata: NameOnlyMeta = NameOnlyMeta()
    status: ResourceClaimStatus = ResourceClaimStatus()


class DeviceTaintSelector(_Wire, frozen=True):
    """Which devices a rule taints: those of every field that is set (none set: every device)."""

    driver: str | None = None
    pool: str | None = None
    device: str | None = None


class DeviceTaintRuleSpec(_Wire, frozen=True):
    # Without a selector a rule taints no device.
    device_selector: DeviceTaintSelector | None = None
    taint: Taint = Taint()


class DeviceTaintRule(_Wire, frozen=True):
    """A taint an administrator puts on devices, as if their driver had published it."""

    metadata: NameOnlyMeta = NameOnlyMeta()
    spec: DeviceTaintRuleSpec = DeviceTaintRuleSpec()


class DeviceClass(_Wire, frozen=True):
    """Only whose it is: a DRA class writes its own DeviceClass, and never over another's."""

    metadata: ObjectMeta = ObjectMeta()


class CelSelector(msgspec.Struct, frozen=True):
    expression: str


class DeviceSelector(msgspec.Struct, frozen=True):
    cel: CelSelector


class DeviceClassSpec(msgspec.Struct, frozen=True):
    selectors: list[DeviceSelector]


class ChildMeta(msgspec.Struct, frozen=True):
    name: str
    labels: dict[str, str]


class DeviceClassChild(msgspec.Struct, frozen=True, rename="camel"):
    """The DeviceClass a DRA class renders as its child, exactly as Metacontroller applies it."""

    metadata: ChildMeta
    spec: DeviceClassSpec
    api_version: str = DRA_API_VERSION
    kind: str = "DeviceClass"
