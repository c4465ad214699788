"""The common approach, for reference: `json.loads` of the whole body and dict walking, as
Metacontroller's example hooks do. Computes free and maxFreePerNode with the same rules (on the
generated cluster, whose GPU quantities are plain integers)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    key, operator = toleration.get("key", ""), toleration.get("operator", "")
    if key == "" and operator == "Exists":
        return True
    if key != taint.get("key", ""):
        return False
    if operator == "Exists":
        return True
    return operator in ("", "Equal") and toleration.get("value", "") == taint.get("value", "")


def _request(container: dict[str, Any], resource: str) -> int:
    resources = container.get("resources", {})
    for field in ("requests", "limits"):
        if resource in resources.get(field, {}):
            return int(resources[field][resource])
    return 0


def _effective(pod: dict[str, Any], resource: str) -> int:
    spec = pod["spec"]
    app = sum(_request(c, resource) for c in spec.get("containers", []))
    sidecars = peak = 0
    for container in spec.get("initContainers", []):
        request = _request(container, resource)
        if container.get("restartPolicy") == "Always":
            app += request
            sidecars += request
            use = sidecars
        else:
            use = request + sidecars
        peak = max(peak, use)
    return max(app, peak) + int(spec.get("overhead", {}).get(resource, 0))


def free_by_node(
    nodes: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    resource: str,
    tolerations: list[dict[str, Any]],
) -> dict[str, int]:
    """Each eligible node's units of the resource not requested by its pods (negative when
    over-committed)."""
    free: dict[str, int] = {}
    for node in nodes:
        status = node.get("status", {})
        if resource not in status.get("allocatable", {}):
            continue
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
        )
        taints = [
            t for t in node["spec"].get("taints", []) if t["effect"] in ("NoSchedule", "NoExecute")
        ]
        tolerated = all(any(_tolerates(t, taint) for t in tolerations) for taint in taints)
        if ready and not node["spec"].get("unschedulable") and tolerated:
            free[node["metadata"]["name"]] = int(status["allocatable"][resource])
    for pod in pods:
        name = pod["spec"].get("nodeName")
        if name in free and pod["status"].get("phase") not in ("Succeeded", "Failed"):
            free[name] -= _effective(pod, resource)
    return free


def free_units(body: bytes) -> tuple[int, int]:
    request = json.loads(body)
    spec = request["parent"]["spec"]
    related = request["related"]
    free = free_by_node(
        related["Node.v1"].values(),
        related["Pod.v1"].values(),
        spec["resourceName"],
        spec.get("tolerations", []),
    )
    per_node = [max(units, 0) for units in free.values()]
    return sum(per_node), max(per_node, default=0)
