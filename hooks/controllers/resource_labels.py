"""DecoratorController `gpuclass-resource-labels`: labels that let each class relate only the
pods and nodes that name its resource (`hooks.rules.resource_labels`).

Its targets are the pods and nodes the chart's selectors pick (the same selectors the status's
rules use); it relates nothing, so a sync carries its target alone and no class's change re-syncs
any of them. The status controller's Pods and Nodes rules add the label of the class's resource
to those selectors: a pod bound or deleted, or a kubelet's status report, re-syncs the classes of
the resources it names, not every class, and each class's sync carries its own resource's pods
and nodes, not every VM and node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hooks.rules.resource_labels import node_resources, pod_resources, resource_labels
from hooks.settings import Settings
from hooks.wire.metacontroller import LabelsResponse, TargetNode, TargetPod


@dataclass(frozen=True)
class ResourceLabelsOutcome:
    response: LabelsResponse
    counts: dict[str, int] = field(default_factory=dict)


def sync(target: TargetPod | TargetNode, settings: Settings) -> ResourceLabelsOutcome:
    named = (
        pod_resources(target.spec)
        if isinstance(target, TargetPod)
        else node_resources(target.status)
    )
    labels = resource_labels(named, target.metadata.labels, settings.enabled)
    written = sum(1 for value in labels.values() if value is not None)
    return ResourceLabelsOutcome(
        LabelsResponse(labels=labels, attachments=[], status=None),
        counts={"resources": written, "removed": len(labels) - written},
    )
