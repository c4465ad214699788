"""Which GPU-class resources a pod asks for and a node advertises, as labels a class's related
rules can select by.

Metacontroller selects related objects by label alone, and neither a pod's resource requests nor
a node's capacity is a label: without one, every class relates every pod and node the chart's
selectors pick, and every change to any of them re-syncs every class with all of them. The
resource labeller writes one label per extended resource an object names, so that a class
relates only the pods and nodes that name its resource.

A resource `<domain>/<name>` becomes the label `<domain>.resources.gpuclass.cozystack.io/<name>`:
both halves of an extended resource name are valid halves of a label key, so the key is readable
and no two resources share one. A resource whose domain is too long for the key gets no label;
its class then relates pods and nodes by the chart's selectors alone, as before.

Every object the labeller has read also carries `gpuclass.cozystack.io/resources-labelled`, and
a class relates besides the selected objects without it: a pod made a moment ago, or every pod
and node before the labeller first runs (an upgrade, a Metacontroller that may not update them),
reaches every class at once, as every one did before the labels, and only the classes of its
resources once it is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from hooks.wire.gpuclass import check_resource_name
from hooks.wire.kube import NodeStatus, PodSpec

LABEL_PREFIX_SUFFIX = ".resources.gpuclass.cozystack.io"
LABELLED = "gpuclass.cozystack.io/resources-labelled"
NAMED = "true"
_MAX_PREFIX = 253


def resource_label(resource: str) -> str | None:
    """The label that marks an object naming this extended resource; None when the name is not
    one a class could name, or its domain leaves no room for the key's prefix."""
    try:
        check_resource_name(resource)
    except ValueError:
        return None
    domain, _, name = resource.partition("/")
    prefix = domain + LABEL_PREFIX_SUFFIX
    if len(prefix) > _MAX_PREFIX:
        return None
    return f"{prefix}/{name}"


def is_resource_label(key: str) -> bool:
    """One of the labels the labeller writes (whatever resource it names)."""
    prefix, slash, _ = key.partition("/")
    return bool(slash) and prefix.endswith(LABEL_PREFIX_SUFFIX)


def pod_resources(spec: PodSpec) -> Iterator[str]:
    """Every resource a pod names where the status rules read its request: a container's or an
    init container's requests or limits, and the overhead."""
    for container in (*spec.containers, *spec.init_containers):
        yield from container.resources.requests
        yield from container.resources.limits
    yield from spec.overhead


def node_resources(status: NodeStatus) -> Iterator[str]:
    """Every resource a node lists where the status rules read it: capacity and allocatable."""
    yield from status.capacity
    yield from status.allocatable


def resource_labels(
    named: Iterable[str], current: Mapping[str, str], enabled: bool
) -> dict[str, str | None]:
    """The labeller's answer for an object: a label for each extended resource it names, whatever
    the quantity says, so that a class reads exactly the objects its rules would count (and still
    warns about a malformed quantity); and the removal of any other label of this kind the object
    carries (one a tenant set on its VM, which KubeVirt copies to the pod); and the mark that the
    object was read. With GPU features off, every one is removed, the mark too."""
    wanted = {resource_label(r) for r in named} if enabled else set()
    labels: dict[str, str | None] = {key: NAMED for key in sorted(k for k in wanted if k)}
    for key in sorted(current):
        if is_resource_label(key) and key not in labels:
            labels[key] = None
    if enabled:
        labels[LABELLED] = NAMED
    elif LABELLED in current:
        labels[LABELLED] = None
    return labels
