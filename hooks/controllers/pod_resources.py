"""DecoratorController `gpuclass-pod-resources`: labels that let each class relate only the pods
that name its resource (`hooks.rules.pod_resources`).

Its targets are the pods the chart's pod selector picks (the same selector the status's rules
use); it relates nothing, so a pod's sync carries that pod alone and a class's change re-syncs
none of them. The status controller's Pods rule adds the label of the class's resource to that
selector: a pod bound, started or deleted re-syncs the classes of the resources it names, not
every class, and each class's sync carries its own resource's pods, not every launcher pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hooks.rules.pod_resources import resource_labels
from hooks.settings import Settings
from hooks.wire.metacontroller import LabelsResponse, TargetPod


@dataclass(frozen=True)
class PodLabelsOutcome:
    response: LabelsResponse
    counts: dict[str, int] = field(default_factory=dict)


def sync(pod: TargetPod, settings: Settings) -> PodLabelsOutcome:
    labels = resource_labels(pod.spec, pod.metadata.labels, settings.enabled)
    written = sum(1 for value in labels.values() if value is not None)
    return PodLabelsOutcome(
        LabelsResponse(labels=labels, attachments=[], status=None),
        counts={"resources": written, "removed": len(labels) - written},
    )
