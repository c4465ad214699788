"""gpuclass-hooks plan: what the hooks would do on a cluster, from a dump, offline.

It runs the hooks' own code, not a second implementation: each class's customize answers select
the related objects with Metacontroller's semantics, the sync requests are built as Metacontroller
would send them, and the status and license controllers answer them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import yaml

from hooks.controllers import budget_report, license, resource_labels, status, tenant_namespaces
from hooks.controllers.license import LicenseOutcome
from hooks.controllers.status import StatusOutcome
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.subtrees import namespace_chain
from hooks.rules.budget.tenancy import ROOT_NAMESPACE, Tenant
from hooks.rules.budget.usage import PoolUse
from hooks.rules.class_status import CONDITIONS
from hooks.rules.conditions import READY
from hooks.rules.dra import DraCapacity
from hooks.rules.license import GRIDD_KEY, LicensePlan, is_managed_copy
from hooks.rules.permitted_devices import KubeVirtFound, KubeVirtUnreadable, KubeVirtView
from hooks.rules.selectors import check_rule, rule_selects, selector_matches
from hooks.settings import Settings
from hooks.wire.kube import KubeVirt, ObjectMeta, Secret
from hooks.wire.metacontroller import (
    CONFIGMAPS,
    GPUCLASS_API_VERSION,
    GPUCLASSES,
    INSTANCE_TYPES,
    INSTANCE_TYPES_API_VERSION,
    RELATED_KINDS,
    REPORT_TARGET_API_VERSION,
    REPORT_TARGET_KIND,
    SECRETS,
    CustomizeRequest,
    RelatedKind,
    RelatedRule,
    decode_class_index_sync,
    decode_composite_sync,
    decode_decorator_sync,
    decode_report_sync,
    decode_resource_target_sync,
    decode_tenant_namespace_sync,
)
from hooks.wire.names import namespaced_key
from hooks.wire.problems import BadRequest, Undecodable, decoded, decoder_for
from hooks.wire.text import table

# The kinds plan reads are the ones the hooks read, by (apiVersion, kind) as a dump names them.
KINDS = {(related.api_version, related.kind): related for related in RELATED_KINDS}
BY_RESOURCE = {(related.api_version, related.resource): related for related in RELATED_KINDS}
REDACTED = "<redacted: compare the token-sha256 annotation>"
# The conditions whose True (or Unknown) status is a problem; Ready is a problem when not True.
PROBLEMS = tuple(rule.type for rule in CONDITIONS)


class PlanInputError(ValueError):
    """Unreadable input: the message is one line naming the file and the problem."""


@dataclass
class Inventory:
    objects: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    kubevirt: dict[str, Any] | None = None
    unknown: int = 0
    _by_namespace: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = field(
        default_factory=dict, repr=False
    )

    def in_namespace(self, resource: tuple[str, str], namespace: str) -> list[dict[str, Any]]:
        """The objects of a resource in one namespace (indexed once per resource)."""
        if resource not in self._by_namespace:
            index: dict[str, list[dict[str, Any]]] = {}
            for obj in self.objects.get(resource, []):
                index.setdefault(obj["metadata"].get("namespace", ""), []).append(obj)
            self._by_namespace[resource] = index
        return self._by_namespace[resource].get(namespace, [])


def _documents(path: Path) -> list[Any]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise PlanInputError(
            f"{path}: cannot read: {getattr(error, 'strerror', None) or error}"
        ) from None
    try:
        if text.lstrip().startswith(("{", "[")):
            return [json.loads(text)]
        return list(yaml.safe_load_all(text))
    except (ValueError, yaml.YAMLError) as error:
        problem = str(error).splitlines()[0]
        raise PlanInputError(f"{path}: not JSON or YAML: {problem}") from None


def _objects(path: Path, document: Any) -> Iterator[dict[str, Any]]:
    if document is None:
        return
    if isinstance(document, list):
        for item in document:
            yield from _objects(path, item)
        return
    if not isinstance(document, dict):
        raise PlanInputError(
            f"{path}: expected Kubernetes objects, found {type(document).__name__}"
        )
    if str(document.get("kind", "")).endswith("List") and isinstance(document.get("items"), list):
        for item in document["items"]:
            yield from _objects(path, item)
        return
    metadata = document.get("metadata")
    if not (
        isinstance(document.get("kind"), str)
        and isinstance(document.get("apiVersion"), str)
        and isinstance(metadata, dict)
        and isinstance(metadata.get("name"), str)
        and metadata["name"]
    ):
        raise PlanInputError(f"{path}: an object has no kind, apiVersion or metadata.name")
    yield document


def load(paths: Iterable[Path], settings: Settings) -> Inventory:
    """Every object of the files, by resource; the KubeVirt CR the settings name; a count of the
    objects of other kinds (ignored)."""
    inventory = Inventory()
    for path in paths:
        for obj in (o for document in _documents(path) for o in _objects(path, document)):
            api_version, kind, metadata = obj["apiVersion"], obj["kind"], obj["metadata"]
            if api_version.startswith("kubevirt.io/") and kind == "KubeVirt":
                if (metadata.get("namespace"), metadata["name"]) == (
                    settings.kubevirt_namespace,
                    settings.kubevirt_name,
                ):
                    _check(path, obj, KubeVirt)
                    inventory.kubevirt = obj
                continue
            related = KINDS.get((api_version, kind))
            if related is None:
                inventory.unknown += 1
                continue
            _check(path, obj, related.type)
            inventory.objects.setdefault((api_version, related.resource), []).append(obj)
    return inventory


class _Placed(msgspec.Struct):
    """What plan itself reads of every object: where it is, its labels (selectors), its uid."""

    metadata: ObjectMeta


def _check(path: Path, obj: dict[str, Any], kind: type) -> None:
    """An object of a kind plan reads must be of that kind's shape: where the hooks would skip
    it with a warning, plan refuses the input, so that what it shows is the whole cluster."""
    encoded = msgspec.json.encode(obj)
    try:
        decoded(decoder_for(_Placed), encoded)
        decoded(decoder_for(kind), encoded)
    except Undecodable as error:
        metadata = obj["metadata"]
        where = namespaced_key(str(metadata.get("namespace") or ""), metadata["name"])
        raise PlanInputError(f"{path}: {obj['kind']} {where.lstrip('/')}: {error}") from None


def _key(obj: dict[str, Any], related: RelatedKind) -> str:
    metadata = obj["metadata"]
    return (
        namespaced_key(metadata.get("namespace", ""), metadata["name"])
        if related.namespaced
        else metadata["name"]
    )


def select_related(
    rules: Iterable[RelatedRule], inventory: Inventory
) -> dict[str, dict[str, dict[str, Any]]]:
    """The related map Metacontroller would send: a group for every rule, even when nothing
    matched. Raises RuleError for a rule Metacontroller refuses."""
    namespace_labels = {
        ns["metadata"]["name"]: ns["metadata"].get("labels") or {}
        for ns in inventory.objects.get(("v1", "namespaces"), [])
    }
    related: dict[str, dict[str, dict[str, Any]]] = {}
    for rule in rules:
        check_rule(rule)
        resource = (rule.api_version, rule.resource)
        kind = BY_RESOURCE[resource]
        group = related.setdefault(kind.group_key, {})
        for obj in _candidates(rule, inventory, namespace_labels):
            metadata = obj["metadata"]
            namespace = metadata.get("namespace", "")
            if rule_selects(
                rule,
                metadata["name"],
                namespace,
                metadata.get("labels") or {},
                namespace_labels.get(namespace, {}),
            ):
                group[_key(obj, kind)] = obj
    return related


def _candidates(
    rule: RelatedRule, inventory: Inventory, namespace_labels: dict[str, dict[str, str]]
) -> Iterable[dict[str, Any]]:
    """The objects a rule could select: those of its namespace, or of the namespaces its
    namespace selector matches, found through the inventory's index by namespace."""
    resource = (rule.api_version, rule.resource)
    if rule.namespace:
        return inventory.in_namespace(resource, rule.namespace)
    if rule.namespace_selector is not None:
        return [
            obj
            for namespace, labels in namespace_labels.items()
            if selector_matches(rule.namespace_selector, labels)
            for obj in inventory.in_namespace(resource, namespace)
        ]
    return inventory.objects.get(resource, [])


def _bytes(obj: Any) -> bytes:
    return msgspec.json.encode(obj)


@dataclass(frozen=True)
class OfflineClass:
    name: str
    status: StatusOutcome
    license: LicenseOutcome

    @property
    def license_plan(self) -> LicensePlan | None:
        return self.license.plan


def kubevirt_view(inventory: Inventory, settings: Settings) -> KubeVirtView:
    location = f"{settings.kubevirt_namespace}/{settings.kubevirt_name}"
    if inventory.kubevirt is None:
        return KubeVirtUnreadable(f"KubeVirt {location} is not in the input files")
    # load() has checked its shape
    return KubeVirtFound(msgspec.convert(inventory.kubevirt, KubeVirt), location)


def run_offline(inventory: Inventory, settings: Settings, now: datetime) -> list[OfflineClass]:
    """Each class through both hooks, as Metacontroller would call them, once the resource
    labeller has labelled the pods and nodes."""
    view = kubevirt_view(inventory, settings)
    inventory = resources_labelled(inventory, settings)
    secrets = inventory.objects.get(("v1", "secrets"), [])
    plans = []
    classes = inventory.objects.get((GPUCLASS_API_VERSION, "gpuclasses"), [])
    for gpuclass in sorted(classes, key=lambda c: c["metadata"]["name"]):
        customize = CustomizeRequest(parent=msgspec.Raw(_bytes(gpuclass)))
        related = select_related(status.customize(customize, settings).related_resources, inventory)
        status_body = _bytes({"parent": gpuclass, "related": related})
        status_outcome = status.sync(
            decode_composite_sync(status_body), settings, lambda: view, now
        )

        uid = gpuclass["metadata"].get("uid", "")
        attached = {
            _key(s, KINDS["v1", "Secret"]): s
            for s in secrets
            if is_managed_copy(msgspec.convert(s, Secret), uid)
        }
        license_related = select_related(
            license.customize(customize, settings).related_resources, inventory
        )
        license_body = _bytes(
            {"object": gpuclass, "attachments": {SECRETS: attached}, "related": license_related}
        )
        license_outcome = license.sync(decode_decorator_sync(license_body), settings)
        plans.append(OfflineClass(gpuclass["metadata"]["name"], status_outcome, license_outcome))
    return plans


# --- output -----------------------------------------------------------------------------------


def redacted(attachment: dict[str, Any]) -> dict[str, Any]:
    """An attachment as plan shows it: every data value but the generated gridd.conf hidden."""
    data = {k: v if k == GRIDD_KEY else REDACTED for k, v in attachment["data"].items()}
    return {**attachment, "data": data}


def status_of(plan: OfflineClass) -> dict[str, Any]:
    built: dict[str, Any] = msgspec.to_builtins(plan.status.response.status)
    return built


def problems(status_doc: dict[str, Any]) -> list[str]:
    """`Type: Reason` of every condition that is not fine."""
    found = []
    for condition in status_doc.get("conditions", []):
        kind, state = condition["type"], condition["status"]
        if (kind == READY and state != "True") or (kind in PROBLEMS and state != "False"):
            found.append(f"{kind}: {condition['reason']}")
    return found


def _ready(status_doc: dict[str, Any]) -> str:
    ready = [c for c in status_doc.get("conditions", []) if c["type"] == READY]
    return ready[0]["status"] if ready else "-"


def license_summary(plan: OfflineClass) -> dict[str, Any] | None:
    license_plan = plan.license_plan
    if license_plan is None:
        return None
    skipped = [
        *(
            {"namespace": n, "why": "holds a Secret of the copy's name that is not a managed copy"}
            for n in license_plan.foreign
        ),
        *(
            {"namespace": n, "why": "holds a copy with our labels that no class manages"}
            for n in license_plan.unmanaged
        ),
        *({"namespace": n, "why": "terminating: no new copy"} for n in license_plan.terminating),
        *(
            {"namespace": o.name, "why": o.reason}
            for o in license_plan.invalid
            if o.kind == "Namespace"
        ),
    ]
    return {
        "source": {
            "usable": license_plan.source.usable,
            "reason": license_plan.source.reason,
            "message": license_plan.source.message,
        },
        "copies": sorted(c.metadata.namespace for c in license_plan.copies),
        "skipped": sorted(skipped, key=lambda s: s["namespace"]),
    }


def explain(plan: OfflineClass) -> list[dict[str, Any]]:
    capacity = plan.status.computation.capacity
    if capacity is None:
        return []
    if isinstance(capacity, DraCapacity):
        return [
            {
                "node": node.name or None,  # None: units that several nodes reach
                "counts": node.eligible,
                "whyNot": node.not_eligible_because,
                "units": node.units,
                "taken": node.taken,
                "free": node.free if node.eligible else None,
            }
            for node in (*capacity.nodes, capacity.shared)
            if node.units
        ]
    return [
        {
            "node": node.name,
            "counts": node.eligible,
            "whyNot": node.not_eligible_because,
            "allocatable": node.allocatable,
            "used": node.used,
            "free": node.free if node.eligible else None,
            "pods": [{"pod": use.pod, "units": use.units} for use in node.pods],
        }
        for node in capacity.nodes
    ]


RELEASES = ("helm.toolkit.fluxcd.io/v2", "helmreleases")
NAMESPACES_RESOURCE = ("v1", "namespaces")
PODS_RESOURCE = ("v1", "pods")
NODES_RESOURCE = ("v1", "nodes")


def _tenant_namespaces(inventory: Inventory, settings: Settings) -> list[str]:
    """Every namespace a tenant could own that the dump names: as a Namespace, as where a release
    lives, as what a Tenant release claims, and every namespace above those."""
    named = {ns["metadata"]["name"] for ns in inventory.objects.get(NAMESPACES_RESOURCE, [])}
    for release in inventory.objects.get(RELEASES, []):
        named.add(release["metadata"].get("namespace", ""))
        claimed = release_object(msgspec.Raw(_bytes(release)), settings.platform_values_secret)
        if isinstance(claimed, Tenant) and claimed.owned_namespace is not None:
            named.add(claimed.owned_namespace)
    return sorted({n for name in named for n in namespace_chain(name)})


def _labelled(inventory: Inventory, namespaces: list[str], settings: Settings) -> Inventory:
    """The inventory with its tenant namespaces (made where the dump has none) labelled as the
    tenant namespace labeller's syncs would label them: `tenant-root` first, whose label the
    others copy."""
    found = {ns["metadata"]["name"]: ns for ns in inventory.objects.get(NAMESPACES_RESOURCE, [])}
    labelled: list[dict[str, Any]] = []
    for name in sorted(namespaces, key=lambda n: n != ROOT_NAMESPACE):
        namespace = found.pop(
            name, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
        seen = {**inventory.objects, NAMESPACES_RESOURCE: [*found.values(), *labelled]}
        rules = tenant_namespaces.customize(name).related_resources
        related = select_related(rules, Inventory(seen, inventory.kubevirt, inventory.unknown))
        body = {"object": namespace, "related": related}
        request = decode_tenant_namespace_sync(_bytes(body))
        answer = tenant_namespaces.sync(request, settings.platform_values_secret).response
        labelled.append(_with_labels(namespace, answer.labels))
    objects = {**inventory.objects, NAMESPACES_RESOURCE: [*found.values(), *labelled]}
    return Inventory(objects, inventory.kubevirt, inventory.unknown)


def _with_labels(obj: dict[str, Any], answer: dict[str, str | None]) -> dict[str, Any]:
    """The object as Metacontroller leaves it after a decorator's labels (null removes one)."""
    labels = dict(obj["metadata"].get("labels") or {})
    for key, value in answer.items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    return {**obj, "metadata": {**obj["metadata"], "labels": labels}}


def resources_labelled(inventory: Inventory, settings: Settings) -> Inventory:
    """The inventory with the pods and nodes the selectors pick labelled as the resource
    labeller's syncs would label them; an object the labeller could not read keeps its labels."""
    objects = dict(inventory.objects)
    for resource, selector in (
        (PODS_RESOURCE, settings.pod_label_selector),
        (NODES_RESOURCE, settings.node_label_selector),
    ):
        labelled = []
        for obj in inventory.objects.get(resource, []):
            if selector_matches(selector, obj["metadata"].get("labels") or {}):
                try:
                    target = decode_resource_target_sync(_bytes({"object": obj}))
                except BadRequest:
                    labelled.append(obj)
                    continue
                obj = _with_labels(obj, resource_labels.sync(target, settings).response.labels)
            labelled.append(obj)
        objects[resource] = labelled
    return Inventory(objects, inventory.kubevirt, inventory.unknown)


def class_index(inventory: Inventory, settings: Settings) -> dict[str, Any]:
    """The class index as the index controller's sync writes it from the dump's GPUClasses and
    cluster instance types."""
    classes = inventory.objects.get((GPUCLASS_API_VERSION, "gpuclasses"), [])
    instance_types = inventory.objects.get(
        (INSTANCE_TYPES_API_VERSION, "virtualmachineclusterinstancetypes"), []
    )
    body = {
        "object": {
            "apiVersion": REPORT_TARGET_API_VERSION,
            "kind": REPORT_TARGET_KIND,
            "metadata": {"name": "plan"},
        },
        "attachments": {},
        "related": {
            GPUCLASSES: {c["metadata"]["name"]: c for c in classes},
            INSTANCE_TYPES: {t["metadata"]["name"]: t for t in instance_types},
        },
    }
    outcome = budget_report.index_sync(
        decode_class_index_sync(_bytes(body)), settings.budget_classes_namespace
    )
    [index] = outcome.response.attachments
    built: dict[str, Any] = msgspec.to_builtins(index)
    return built


def pool_requests(inventory: Inventory, settings: Settings) -> dict[str, dict[str, Any]]:
    """Each tenant namespace's report sync request, as Metacontroller would send it once the
    labeller's syncs labelled every tenant namespace and the class index is written: what the
    report's rules select (of ConfigMaps, the class index alone: no `gpu-budget` is in a dump plan
    reads)."""
    namespaces = _tenant_namespaces(inventory, settings)
    labelled = _labelled(inventory, namespaces, settings)
    by_name = {ns["metadata"]["name"]: ns for ns in labelled.objects[NAMESPACES_RESOURCE]}
    index = class_index(inventory, settings)
    index_key = f"{index['metadata']['namespace']}/{index['metadata']['name']}"
    requests = {}
    for name in namespaces:
        rules = [
            rule
            for rule in budget_report.customize(
                name, settings.budget_classes_namespace
            ).related_resources
            if (rule.api_version, rule.resource) in BY_RESOURCE
        ]
        related = {**select_related(rules, labelled), CONFIGMAPS: {index_key: index}}
        requests[name] = {
            "object": by_name[name],
            "attachments": {CONFIGMAPS: {}},
            "related": related,
        }
    return requests


def budget_pools(inventory: Inventory, settings: Settings) -> tuple[PoolUse, ...] | None:
    """The budget report's pools on the dump's releases and classes, each computed by the
    report's own sync from what Metacontroller would send it (`pool_requests`); None when the dump
    holds no HelmRelease. ConfigMaps are not read: a tenant's own `gpu-budget` changes where the
    report is written, not its figures."""
    if not inventory.objects.get(RELEASES):
        return None
    return tuple(
        pool
        for body in pool_requests(inventory, settings).values()
        for pool in budget_report.sync(
            decode_report_sync(_bytes(body)),
            settings.platform_values_secret,
            settings.budget_classes_namespace,
        ).pools
        or ()
    )


def document(
    plans: list[OfflineClass],
    inventory: Inventory,
    settings: Settings,
    explain_class: str | None,
) -> dict[str, Any]:
    """The machine-readable plan: the exact status and (redacted) attachments of each class."""
    classes = []
    for plan in plans:
        entry: dict[str, Any] = {
            "name": plan.name,
            "resource": plan.status.computation.resource,
            "status": status_of(plan),
            "attachments": [
                redacted(msgspec.to_builtins(a)) for a in plan.license.response.attachments
            ],
            "license": license_summary(plan),
        }
        if plan.name == explain_class:
            entry["nodes"] = explain(plan)
        classes.append(entry)
    pools = budget_pools(inventory, settings)
    budgets = None if pools is None else [budget_report.report_document(pool) for pool in pools]
    return {
        "classes": classes,
        "budgets": budgets,
        "kubevirtFound": inventory.kubevirt is not None,
        "ignoredObjects": inventory.unknown,
    }


def render_text(
    plans: list[OfflineClass], inventory: Inventory, settings: Settings, explain_class: str | None
) -> str:
    doc = document(plans, inventory, settings, explain_class)
    rows = [["CLASS", "RESOURCE", "FREE", "MAX/NODE", "READY", "NOT FINE"]]
    for entry in doc["classes"]:
        status_doc = entry["status"]
        rows.append(
            [
                entry["name"],
                entry["resource"] or "-",
                str(status_doc.get("free", "-")),
                str(status_doc.get("maxFreePerNode", "-")),
                _ready(status_doc),
                ", ".join(problems(status_doc)) or "-",
            ]
        )
    out = [table(rows)]
    for entry in doc["classes"]:
        summary = entry["license"]
        if summary is None:
            continue
        source = summary["source"]
        state = "usable" if source["usable"] else f"NOT usable ({source['reason']})"
        out.append(f"\nLicense copies of {entry['name']}: source {state}: {source['message']}")
        out.append(f"  copy in:  {', '.join(summary['copies']) or '-'}")
        skipped = [f"{s['namespace']} ({s['why']})" for s in summary["skipped"]]
        out.append(f"  skipped:  {'; '.join(skipped) or '-'}")
    if doc["budgets"] is not None:
        out.append(render_budgets(doc["budgets"]))
    for entry in doc["classes"]:
        if "nodes" in entry:
            out.append(render_explain(entry))
    if not doc["kubevirtFound"]:
        out.append("\nNo KubeVirt CR in the input: ResourceNameNotPermitted is Unknown.")
    if doc["ignoredObjects"]:
        count = doc["ignoredObjects"]
        out.append(f"\nIgnored {count} object{'s' if count != 1 else ''} of other kinds.")
    return "\n".join(out) + "\n"


def render_budgets(budgets: list[dict[str, Any]]) -> str:
    """Every GPU budget pool, a row per key: the figures its ConfigMap gpu-budget holds."""
    rows = [["TENANT", "NAMESPACE", "KEY", "BUDGET", "CARVED OUT", "RESERVED", "LEFT"]]
    unknown, unclassed = [], []
    for pool in budgets:
        if pool["unreadable"] is not None:
            unknown.append(f"  {pool['tenant']} ({pool['namespace']}): {pool['unreadable']}")
        held = ", ".join(f"{u['resource']} {u['devices']}" for u in pool["unclassed"])
        if held:
            unclassed.append(f"  {pool['tenant']} ({pool['namespace']}): {held}")
        for use in pool["keys"]:
            figures = [use["budget"], use["carvedOut"], use["reserved"], use["left"]]
            rows.append([pool["tenant"], pool["namespace"], use["key"], *map(str, figures)])
    if len(rows) == 1 and not unknown:
        return "\nGPU budgets: none"
    out = ["\nGPU budgets:", table(rows)] if len(rows) > 1 else ["\nGPU budgets:"]
    if unknown:
        out += ["Pools whose figures cannot be known:", *unknown]
    if unclassed:
        out += ["Devices no GPUClass names (counted under the total key):", *unclassed]
    return "\n".join(out)


def render_explain(entry: dict[str, Any]) -> str:
    if any("units" in node for node in entry["nodes"]):
        return render_dra_explain(entry)
    rows = [["NODE", "COUNTS", "WHY NOT", "ALLOCATABLE", "USED", "FREE", "PODS"]]
    for node in entry["nodes"]:
        pods = ", ".join(f"{p['pod']} ({p['units']})" for p in node["pods"]) or "-"
        rows.append(
            [
                node["node"],
                "yes" if node["counts"] else "no",
                node["whyNot"] or "-",
                str(node["allocatable"]),
                str(node["used"]),
                "-" if node["free"] is None else str(node["free"]),
                pods,
            ]
        )
    header = f"\nNodes advertising {entry['resource']} for {entry['name']}:"
    if len(rows) == 1:
        return f"{header} none"
    return f"{header}\n{table(rows)}"


def render_dra_explain(entry: dict[str, Any]) -> str:
    rows = [["NODE", "COUNTS", "WHY NOT", "UNITS", "TAKEN", "FREE"]]
    for node in entry["nodes"]:
        rows.append(
            [
                node["node"] or "(several nodes)",
                "yes" if node["counts"] else "no",
                node["whyNot"] or "-",
                str(node["units"]),
                str(node["taken"]),
                "-" if node["free"] is None else str(node["free"]),
            ]
        )
    return f"\nNodes with devices of {entry['resource']} for {entry['name']}:\n{table(rows)}"
