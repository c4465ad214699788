"""Free units of a class's resource: node allocatable minus effective pod requests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hooks.rules.invalid import InvalidObject
from hooks.rules.quantity import QuantityError, parse_units
from hooks.rules.scheduling import TolerationLike, ineligibility
from hooks.wire.kube import Container, Node, Pod
from hooks.wire.names import namespaced_key

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PodUse:
    pod: str  # namespace/name
    units: int


@dataclass(frozen=True)
class NodeUse:
    name: str
    not_eligible_because: str | None
    allocatable: int
    used: int
    pods: tuple[PodUse, ...]

    @property
    def eligible(self) -> bool:
        return self.not_eligible_because is None

    @property
    def free(self) -> int:
        return max(self.allocatable - self.used, 0)


@dataclass(frozen=True)
class Capacity:
    """What the nodes that advertise the resource hold, and what the status reports."""

    advertised: bool
    nodes: tuple[NodeUse, ...]
    invalid: tuple[InvalidObject, ...]

    @property
    def eligible_nodes(self) -> tuple[NodeUse, ...]:
        return tuple(n for n in self.nodes if n.eligible)

    @property
    def free(self) -> int:
        return sum(n.free for n in self.eligible_nodes)

    @property
    def max_free_per_node(self) -> int:
        return max((n.free for n in self.eligible_nodes), default=0)

    @property
    def counted_pods(self) -> int:
        return sum(len(n.pods) for n in self.nodes)

    def totals(self, *, eligible: bool) -> tuple[int, int]:
        """(allocatable, used) summed over eligible nodes, or over the other advertising nodes."""
        chosen = [n for n in self.nodes if n.eligible is eligible]
        return sum(n.allocatable for n in chosen), sum(n.used for n in chosen)


def _container_request(container: Container, resource: str) -> int:
    """requests[R] if present, else limits[R] if present, else 0."""
    resources = container.resources
    if resource in resources.requests:
        return parse_units(resources.requests[resource])
    if resource in resources.limits:
        return parse_units(resources.limits[resource])
    return 0


def effective_request(pod: Pod, resource: str) -> int:
    """The scheduler's effective request of a pod, sidecar init containers and overhead included.

    Raises QuantityError when a quantity the rule reads is malformed.
    """
    app = sum(_container_request(c, resource) for c in pod.spec.containers)
    sidecars = 0
    init_peak = 0
    for container in pod.spec.init_containers:
        request = _container_request(container, resource)
        if container.restart_policy == "Always":
            app += request
            sidecars += request
            use = sidecars
        else:
            use = request + sidecars
        init_peak = max(init_peak, use)
    overhead = pod.spec.overhead
    return max(app, init_peak) + (parse_units(overhead[resource]) if resource in overhead else 0)


def pod_counts(pod: Pod) -> bool:
    """Bound and not finished; terminating pods still hold their devices, so they count."""
    return bool(pod.spec.node_name) and pod.status.phase not in FINISHED_PHASES


def _units(quantities: Mapping[str, str], resource: str) -> int:
    return parse_units(quantities[resource]) if resource in quantities else 0


def compute_capacity(
    nodes: Iterable[Node],
    pods: Iterable[Pod],
    resource: str,
    tolerations: Iterable[TolerationLike],
) -> Capacity:
    """Per advertising node: allocatable, effective requests of the pods that count, eligibility.

    A node holding the resource in its capacity or allocatable is listed; the resource is
    advertised only when some node lists it in `status.capacity`. An object with a malformed
    quantity counts as 0 for this rule and is reported in `invalid`.
    """
    tolerations = tuple(tolerations)
    invalid: list[InvalidObject] = []
    advertised = False
    allocatable: dict[str, int] = {}
    why_not: dict[str, str | None] = {}
    for node in nodes:
        status = node.status
        if resource not in status.capacity and resource not in status.allocatable:
            continue
        name = node.metadata.name
        advertised = advertised or resource in status.capacity
        try:
            allocatable[name] = _units(status.allocatable, resource)
        except QuantityError as error:
            invalid.append(InvalidObject("Node", name, f"allocatable {resource}: {error}"))
            allocatable[name] = 0
        why_not[name] = ineligibility(node, tolerations)

    uses: dict[str, list[PodUse]] = {name: [] for name in allocatable}
    for pod in pods:
        on_node = uses.get(pod.spec.node_name)
        if on_node is None or not pod_counts(pod):
            continue
        pod_name = namespaced_key(pod.metadata.namespace, pod.metadata.name)
        try:
            units = effective_request(pod, resource)
        except QuantityError as error:
            invalid.append(InvalidObject("Pod", pod_name, f"request of {resource}: {error}"))
            continue
        if units:
            on_node.append(PodUse(pod_name, units))

    node_uses = tuple(
        NodeUse(
            name=name,
            not_eligible_because=why_not[name],
            allocatable=allocatable[name],
            used=sum(u.units for u in uses[name]),
            pods=tuple(uses[name]),
        )
        for name in sorted(allocatable)
    )
    return Capacity(advertised=advertised, nodes=node_uses, invalid=tuple(invalid))
