"""Subsets of Kubernetes objects, as msgspec Structs that declare only what the rules read.

Unknown fields are skipped by the decoder without being materialised, which is what keeps a
several-hundred-megabyte related map cheap. Quantities stay strings here: parsing them is a rule
(`rules.quantity`), so that one malformed value invalidates one object for one rule, not a request.
"""

from __future__ import annotations

import msgspec


def is_absent(raw: msgspec.Raw) -> bool:
    """A raw field that was not sent, or sent as null (the same thing to Metacontroller)."""
    return len(raw) == 0 or bytes(raw) == b"null"


class _Wire(msgspec.Struct, kw_only=True, rename="camel", frozen=True, gc=False):
    """Base of every decoded Kubernetes subset: camelCase on the wire, immutable in the rules
    (each subclass repeats `frozen=True` so that type checkers see it too). `gc=False`: these
    structs hold only strings, numbers and containers, so they can never form a reference cycle,
    and leaving millions of them out of the cyclic GC halves the decode time of a large request."""


class OwnerReference(_Wire, frozen=True):
    uid: str = ""
    kind: str = ""
    name: str = ""
    controller: bool = False


class ObjectMeta(_Wire, frozen=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    generation: int = 0
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    owner_references: list[OwnerReference] = []


class NameOnlyMeta(_Wire, frozen=True):
    """Nodes and pods are numerous and large: only their identity is kept."""

    name: str = ""
    namespace: str = ""


class Taint(_Wire, frozen=True):
    key: str = ""
    value: str = ""
    effect: str = ""


class NodeCondition(_Wire, frozen=True):
    type: str = ""
    status: str = ""


class NodeSpec(_Wire, frozen=True):
    unschedulable: bool = False
    taints: list[Taint] = []


class NodeStatus(_Wire, frozen=True):
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}
    conditions: list[NodeCondition] = []


class Node(_Wire, frozen=True):
    metadata: NameOnlyMeta = NameOnlyMeta()
    spec: NodeSpec = NodeSpec()
    status: NodeStatus = NodeStatus()


class ResourceRequirements(_Wire, frozen=True):
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}


class Container(_Wire, frozen=True):
    name: str = ""
    resources: ResourceRequirements = ResourceRequirements()
    restart_policy: str | None = None


class PodSpec(_Wire, frozen=True):
    node_name: str = ""
    containers: list[Container] = []
    init_containers: list[Container] = []
    overhead: dict[str, str] = {}


class PodStatus(_Wire, frozen=True):
    phase: str = ""


class Pod(_Wire, frozen=True):
    metadata: NameOnlyMeta = NameOnlyMeta()
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()


class NamespaceStatus(_Wire, frozen=True):
    phase: str = ""


class Namespace(_Wire, frozen=True):
    metadata: ObjectMeta = ObjectMeta()
    status: NamespaceStatus = NamespaceStatus()

    @property
    def terminating(self) -> bool:
        """Being deleted: nothing new may be made in it."""
        return self.metadata.deletion_timestamp is not None or self.status.phase == "Terminating"


class Secret(_Wire, frozen=True):
    metadata: ObjectMeta = ObjectMeta()
    type: str = ""
    data: dict[str, str] = {}


class ConfigMap(_Wire, frozen=True):
    """A ConfigMap of the budget report's name: whose it is, and what it holds (read only to
    keep the report's own as they are)."""

    metadata: ObjectMeta = ObjectMeta()
    data: dict[str, str] = {}


class Condition(_Wire, frozen=True):
    """A metav1.Condition, as the status carries it (read back from the parent, and written)."""

    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str
    observed_generation: int = 0


class GPUClassStatus(_Wire, frozen=True):
    """The part of a class's current status the hook reads back: its conditions."""

    conditions: list[Condition] = []


class GPUClass(_Wire, frozen=True):
    """A GPUClass as Metacontroller sends it. The spec is kept raw: people write it, and
    `hooks.wire.gpuclass.parse_spec` validates it with messages that name the field. The status is
    kept raw too: a malformed previous status must not fail the request (see `parse_status`)."""

    api_version: str = ""
    kind: str = ""
    metadata: ObjectMeta = ObjectMeta()
    spec: msgspec.Raw = msgspec.Raw()
    status: msgspec.Raw = msgspec.Raw()


class HostDevice(_Wire, frozen=True):
    resource_name: str = ""


class PermittedHostDevices(_Wire, frozen=True):
    pci_host_devices: list[HostDevice] = []
    mediated_devices: list[HostDevice] = []


class DeveloperConfiguration(_Wire, frozen=True):
    feature_gates: list[str] = []
    disabled_feature_gates: list[str] = []


class KubeVirtConfiguration(_Wire, frozen=True):
    permitted_host_devices: PermittedHostDevices = PermittedHostDevices()
    developer_configuration: DeveloperConfiguration = DeveloperConfiguration()


class KubeVirtSpec(_Wire, frozen=True):
    configuration: KubeVirtConfiguration = KubeVirtConfiguration()


class KubeVirtStatus(_Wire, frozen=True):
    observed_kube_virt_version: str = ""


class KubeVirt(_Wire, frozen=True):
    spec: KubeVirtSpec = KubeVirtSpec()
    status: KubeVirtStatus = KubeVirtStatus()


class InstancetypeGpu(_Wire, frozen=True):
    device_name: str


class InstancetypeSpec(_Wire, frozen=True):
    gpus: list[InstancetypeGpu] = []


class Instancetype(_Wire, frozen=True):
    """A KubeVirt cluster instance type (`VirtualMachineClusterInstancetype`): the GPUs it
    attaches to every VM that names it, by resource name."""

    metadata: NameOnlyMeta = NameOnlyMeta()
    spec: InstancetypeSpec = InstancetypeSpec()
