"""Which nodes a class's VMs can land on: node eligibility and toleration matching."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from hooks.wire.kube import Node, Taint

EXCLUDING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


class TolerationLike(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def operator(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def effect(self) -> str: ...


def tolerates(toleration: TolerationLike, taint: Taint) -> bool:
    """Kubernetes' ToleratesTaint; tolerationSeconds plays no part."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key == "" and toleration.operator == "Exists":
        return True
    if toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    if toleration.operator in ("Equal", ""):
        return toleration.value == taint.value
    return False


def untolerated_taint(
    taints: Iterable[Taint], tolerations: Iterable[TolerationLike]
) -> Taint | None:
    """The first NoSchedule/NoExecute taint (a node's or a device's) no toleration matches.
    PreferNoSchedule never counts: the scheduler only prefers other nodes, it never refuses this
    one."""
    tolerations = tuple(tolerations)
    for taint in taints:
        if taint.effect in EXCLUDING_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def is_ready(node: Node) -> bool:
    """Ready only when the Ready condition says "True"; False, Unknown or missing are not ready."""
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


def ineligibility(node: Node, tolerations: Iterable[TolerationLike]) -> str | None:
    """Why the node cannot take the class's VMs, or None when it can."""
    if not is_ready(node):
        return "not Ready"
    if node.spec.unschedulable:
        return "cordoned"
    taint = untolerated_taint(node.spec.taints, tolerations)
    if taint is not None:
        shown = f"{taint.key}={taint.value}" if taint.value else taint.key
        return f"taint {shown}:{taint.effect} not tolerated"
    return None
