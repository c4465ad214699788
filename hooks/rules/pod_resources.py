"""Which GPU-class resources a pod asks for, as labels a class's related rule can select by.

Metacontroller selects related objects by label alone, and a pod's resource requests are not a
label: without one, every class relates every pod the chart's selector picks, and every change to
any of them re-syncs every class. The pod labeller writes one label per extended resource a pod
names, so that a class relates only the pods that name its resource.

A resource `<domain>/<name>` becomes the label `<domain>.requests.gpuclass.cozystack.io/<name>`:
both halves of an extended resource name are valid halves of a label key, so the key is readable
and no two resources share one. A resource whose domain is too long for the key gets no label;
its class then relates pods by the chart's selector alone, as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from hooks.wire.gpuclass import check_resource_name
from hooks.wire.kube import PodSpec

LABEL_PREFIX_SUFFIX = ".requests.gpuclass.cozystack.io"
REQUESTED = "true"
_MAX_PREFIX = 253


def resource_label(resource: str) -> str | None:
    """The label that marks a pod naming this extended resource; None when the name is not one
    a class could name, or its domain leaves no room for the key's prefix."""
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


def _named_resources(spec: PodSpec) -> Iterator[str]:
    for container in (*spec.containers, *spec.init_containers):
        yield from container.resources.requests
        yield from container.resources.limits
    yield from spec.overhead


def resource_labels(
    spec: PodSpec, current: Mapping[str, str], enabled: bool
) -> dict[str, str | None]:
    """The labeller's answer for a pod: a label for each extended resource it names anywhere the
    status rules read (a container's requests or limits, an init container's, the overhead),
    whatever the quantity says, so that the class's status sees exactly the pods it would have
    counted; and the removal of any other label of this kind the pod carries (one a tenant set on
    its VM, which KubeVirt copies to the pod). With GPU features off, every one is removed."""
    wanted = {resource_label(r) for r in _named_resources(spec)} if enabled else set()
    labels: dict[str, str | None] = {key: REQUESTED for key in sorted(k for k in wanted if k)}
    for key in sorted(current):
        if is_resource_label(key) and key not in labels:
            labels[key] = None
    return labels
