"""DecoratorControllers of the budget report: every GPU budget pool's use, for people to read.

`gpuclass-budget-pools`: its targets are the tenant namespaces (labelled by
`gpuclass-tenant-namespaces`), and what each reports is a name's alone
(`hooks.rules.budget.subtrees.report_group`):
- a top-level namespace (a child of `tenant-root`) reports every pool of its subtree: it relates
  the Tenant releases that could claim it, every Tenant, VMInstance and KubernetesNodes release
  in the namespaces labelled into its subtree, those namespaces (one labelled later re-syncs the
  reports), the class index, and the ConfigMaps labelled as reports in its subtree; each pool
  root's attachment is a ConfigMap `gpu-budget` in the pool's namespace, holding its own pool's
  figures (`hooks.rules.budget.usage`, the arithmetic the webhook applies) and the apps that
  reserve. A labelled `gpu-budget` that is not its own attachment (an earlier version's, or a
  tenant's) is never written over. So a change re-syncs its top-level subtree, never the tenancy.
- `tenant-root` reports the root's pool: it relates the releases in the namespaces labelled into
  the root's pool, which are all of them while the root tenant is bounded and none otherwise.
- a namespace deeper down reports nothing and relates nothing: its pool is its top-level
  namespace's to report, and what it attached in earlier versions (its own report) goes.
The webhook never reads the report.

`gpuclass-budget-report`: its one target is the release's ClusterRole, and its attachment the
class index, a ConfigMap `gpuclass-budget-classes` in the release's namespace holding what the
arithmetic reads of each GPUClass (name, age, deletion, resource) and what each cluster instance
type attaches. The pools relate that ConfigMap (by its namespace and name: a ConfigMap of that
name elsewhere is not it) instead of the GPUClasses and instance types: a class's status is
written whenever its free units change, and each write would re-sync every report target; the
index changes only when a class's identity or an instance type's devices do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from hooks.controllers import STALE_RULES_RETRY_SECONDS
from hooks.controllers.tenant_namespaces import (
    HELMRELEASES_API_VERSION,
    TOP_LEVEL_LABEL,
    claimant_rules,
    pool_level_label,
)
from hooks.rules.budget.instance_types import attached_by_type
from hooks.rules.budget.keys import TOTAL_KEY
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.subtrees import ReportGroup, report_group
from hooks.rules.budget.tenancy import (
    KUBERNETES,
    KUBERNETES_NODES,
    TENANT,
    VM_INSTANCE,
    App,
    Tenancy,
    Tenant,
)
from hooks.rules.budget.usage import PoolUse, pool_usage
from hooks.rules.classes import ClassIdentity, class_identity
from hooks.rules.invalid import InvalidObject
from hooks.wire.cozystack import KIND_LABEL
from hooks.wire.kube import ConfigMap
from hooks.wire.metacontroller import (
    GPUCLASS_API_VERSION,
    INSTANCE_TYPES_API_VERSION,
    ClassIndexSync,
    CustomizeResponse,
    DecoratorSyncResponse,
    LabelSelector,
    RelatedRule,
    ReportSync,
    Requirement,
)
from hooks.wire.text import table

REPORT_NAME = "gpu-budget"
REPORT_LABEL = "gpuclass.cozystack.io/budget-report"
CLASS_INDEX_NAME = "gpuclass-budget-classes"
CLASS_INDEX_KEY = "classes.json"

ReportResult = Literal["ok", "stale_related", "no_class_index"]


class ReportMetadata(msgspec.Struct, kw_only=True):
    name: str
    namespace: str
    labels: dict[str, str]


class ReportConfigMap(msgspec.Struct, kw_only=True, rename="camel"):
    """A desired attachment: exactly the fields we own."""

    api_version: str = "v1"
    kind: str = "ConfigMap"
    metadata: ReportMetadata
    data: dict[str, str]


@dataclass(frozen=True)
class ReportOutcome:
    response: DecoratorSyncResponse
    outcome: ReportResult = "ok"
    pools: tuple[PoolUse, ...] | None = None  # None: the sync could not tell
    reported: tuple[str, ...] = ()  # whose pools it decided: a pool elsewhere is another target's
    invalid: tuple[InvalidObject, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)


class IndexedClass(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    name: str
    created: str | None
    deleting: bool
    resource_name: str | None


class ClassIndex(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What the budget arithmetic reads of the GPUClasses: each class's identity, and the names
    of those that do not decode (a device of one maps to no key, so no pool's figures can be
    known); and of the cluster instance types: the devices each attaches (those that attach none
    left out), and why each that does not decode could not be read. An index written before
    instance types were read has none: they attach nothing until it is written again."""

    classes: list[IndexedClass]
    undecodable: list[str]
    instance_types: dict[str, list[str]] = {}
    undecodable_instance_types: dict[str, str] = {}

    def catalog(self) -> Catalog:
        return Catalog(
            tuple(
                ClassIdentity(c.name, c.created, c.deleting, c.resource_name) for c in self.classes
            ),
            {name: tuple(devices) for name, devices in self.instance_types.items()},
            self.undecodable_instance_types,
        )


_INDEX = msgspec.json.Decoder(ClassIndex)


def index_customize() -> CustomizeResponse:
    return CustomizeResponse(
        related_resources=[
            RelatedRule(api_version=GPUCLASS_API_VERSION, resource="gpuclasses"),
            RelatedRule(
                api_version=INSTANCE_TYPES_API_VERSION,
                resource="virtualmachineclusterinstancetypes",
            ),
        ]
    )


@dataclass(frozen=True)
class IndexOutcome:
    response: DecoratorSyncResponse
    index: ClassIndex | None  # None: the request could not be trusted


def unnamed_gpu_instance_types(index: ClassIndex, named: Iterable[str]) -> tuple[str, ...]:
    """The instance types that attach GPUs but that the webhook's match conditions do not name:
    a VM naming one and listing no gpus entries is admitted without a budget check."""
    return tuple(sorted(set(index.instance_types) - set(named)))


def index_sync(request: ClassIndexSync, namespace: str) -> IndexOutcome:
    """The class index in the release's namespace (`namespace`). Attaching it also drops what
    the ClusterRole owned before, the one-target reports of earlier versions, which the pool
    reports could not write over (nothing adopts another owner's object). Without the classes or
    the instance types the request cannot be trusted: no attachment is kept, none is written."""
    if request.classes is None or request.instance_types is None:
        response = DecoratorSyncResponse(
            attachments=[], status=None, resync_after_seconds=STALE_RULES_RETRY_SECONDS
        )
        return IndexOutcome(response, None)
    devices, problems = attached_by_type(request.instance_types)
    index = ClassIndex(
        classes=sorted(
            (
                IndexedClass(
                    name=i.name,
                    created=i.created,
                    deleting=i.deleting,
                    resource_name=i.resource_name,
                )
                for i in map(class_identity, request.classes.objects)
            ),
            key=lambda c: c.name,
        ),
        undecodable=sorted(request.classes.invalid),
        instance_types={name: list(devices[name]) for name in sorted(devices)},
        undecodable_instance_types=dict(sorted(problems.items())),
    )
    attachment = ReportConfigMap(
        metadata=ReportMetadata(name=CLASS_INDEX_NAME, namespace=namespace, labels={}),
        data={CLASS_INDEX_KEY: msgspec.json.encode(index).decode()},
    )
    return IndexOutcome(DecoratorSyncResponse(attachments=[attachment], status=None), index)


def read_class_index(config_maps: list[ConfigMap], namespace: str) -> ClassIndex | str | None:
    """The class index among a pool's related ConfigMaps: the one of its name in the release's
    namespace (`namespace`) and no other (a tenant may label a ConfigMap of that name as a report
    in its own namespace); None when there is none, the problem when it cannot be read."""
    for config_map in config_maps:
        meta = config_map.metadata
        if meta.name == CLASS_INDEX_NAME and meta.namespace == namespace:
            try:
                return _INDEX.decode(config_map.data.get(CLASS_INDEX_KEY, ""))
            except msgspec.DecodeError:
                return f"{CLASS_INDEX_KEY} does not decode"
    return None


def customize(namespace: str, index_namespace: str) -> CustomizeResponse:
    group = report_group(namespace)
    if group is None or group == "below_top_level":
        return CustomizeResponse(related_resources=[])
    if group == "root":
        in_group = LabelSelector(match_labels={pool_level_label(0): namespace})
        reports = RelatedRule(
            api_version="v1", resource="configmaps", namespace=namespace, names=[REPORT_NAME]
        )
    else:
        in_group = LabelSelector(match_labels={TOP_LEVEL_LABEL: namespace})
        reports = RelatedRule(
            api_version="v1",
            resource="configmaps",
            label_selector=LabelSelector(match_labels={REPORT_LABEL: "true"}),
            namespace_selector=in_group,
        )
    return CustomizeResponse(
        related_resources=[
            *claimant_rules(namespace),
            RelatedRule(
                api_version=HELMRELEASES_API_VERSION,
                resource="helmreleases",
                label_selector=LabelSelector(
                    match_expressions=[
                        Requirement(
                            key=KIND_LABEL,
                            operator="In",
                            values=[TENANT, VM_INSTANCE, KUBERNETES_NODES, KUBERNETES],
                        )
                    ]
                ),
                namespace_selector=in_group,
            ),
            RelatedRule(api_version="v1", resource="namespaces", label_selector=in_group),
            RelatedRule(
                api_version="v1",
                resource="configmaps",
                namespace=index_namespace,
                names=[CLASS_INDEX_NAME],
            ),
            reports,
        ]
    )


def report_document(pool: PoolUse) -> dict[str, object]:
    """What a tenant reads of its own pool, as JSON: each key's figures and the apps that
    reserve; an unreadable pool says why instead."""
    return {
        "tenant": pool.tenant,
        "namespace": pool.namespace,
        "keys": [
            {
                "key": use.key,
                "budget": use.budget,
                "carvedOut": use.carved_out,
                "reserved": use.reserved,
                "left": use.left,
            }
            for use in pool.keys
        ],
        "apps": [
            {
                "kind": app.kind,
                "namespace": app.namespace,
                "name": app.name,
                "reserves": dict(app.units),
            }
            for app in pool.apps
        ],
        "unclassed": [
            {"resource": resource, "devices": devices} for resource, devices in pool.unclassed
        ],
        "unreadable": pool.unreadable,
    }


def report_table(pool: PoolUse) -> str:
    """The same figures as a table, as `kubectl get configmap gpu-budget -o yaml` shows them."""
    if pool.unreadable is not None:
        return f"the figures of this pool cannot be known: {pool.unreadable}\n"
    rows = [("KEY", "BUDGET", "CARVED OUT", "RESERVED", "LEFT")]
    rows += [
        (u.key, str(u.budget), str(u.carved_out), str(u.reserved), str(u.left)) for u in pool.keys
    ]
    lines = [table(rows)]
    for app in pool.apps:
        reserves = ", ".join(f"{key} {units}" for key, units in app.units)
        lines.append(f"{app.kind} {app.namespace}/{app.name}: {reserves}")
    if pool.unclassed:
        held = ", ".join(f"{resource} {devices}" for resource, devices in pool.unclassed)
        lines.append(f"devices no GPUClass names, counted under {TOTAL_KEY}: {held}")
    return "\n".join(lines) + "\n"


def _report(pool: PoolUse) -> ReportConfigMap:
    return ReportConfigMap(
        metadata=ReportMetadata(
            name=REPORT_NAME, namespace=pool.namespace, labels={REPORT_LABEL: "true"}
        ),
        data={
            "budget.json": msgspec.json.encode(report_document(pool)).decode(),
            "budget.txt": report_table(pool),
        },
    )


def _kept(attached: list[ConfigMap]) -> list[ReportConfigMap]:
    """The report as it is: the answer while the request cannot be trusted."""
    return [
        ReportConfigMap(
            metadata=ReportMetadata(
                name=c.metadata.name, namespace=c.metadata.namespace, labels={REPORT_LABEL: "true"}
            ),
            data=dict(c.data),
        )
        for c in attached
    ]


def sync(request: ReportSync, platform_values: str, index_namespace: str) -> ReportOutcome:
    """A report target's reports. `platform_values` names the platform's values Secret (which
    sets nothing the budgets read), `index_namespace` where the class index is."""
    namespace = request.target.metadata.name
    group = report_group(namespace)
    attached = list(request.attached.objects) if request.attached else []
    if group == "below_top_level":
        # Its pool is its top-level namespace's to report; its own report of earlier versions goes.
        return ReportOutcome(DecoratorSyncResponse(attachments=[], status=None), pools=())
    if group is not None and (
        request.releases is None or request.config_maps is None or request.group is None
    ):
        # Selected by other rules than today's: keep the reports until customize is asked again.
        response = DecoratorSyncResponse(
            attachments=_kept(attached), status=None, resync_after_seconds=STALE_RULES_RETRY_SECONDS
        )
        return ReportOutcome(response, "stale_related", counts={"kept": len(attached)})
    config_maps = request.config_maps.objects if request.config_maps else []
    index = read_class_index(config_maps, index_namespace)
    if group is not None and not isinstance(index, ClassIndex):
        # Not written yet (a first install), or unreadable: keep the reports as they are. Writing
        # the index re-syncs every report target.
        unreadable = () if index is None else (InvalidObject("ConfigMap", CLASS_INDEX_NAME, index),)
        response = DecoratorSyncResponse(attachments=_kept(attached), status=None)
        return ReportOutcome(
            response, "no_class_index", invalid=unreadable, counts={"kept": len(attached)}
        )
    objects = [release_object(raw, platform_values) for raw in request.releases or []]
    tenancy = Tenancy(
        tuple(o for o in objects if isinstance(o, Tenant)),
        tuple(o for o in objects if isinstance(o, App)),
    )
    catalog = index.catalog() if isinstance(index, ClassIndex) else Catalog()
    reported = reported_namespaces(namespace, group, request.group or (), tenancy.tenants)
    found = (pool_usage(tenancy, catalog, n) for n in reported)
    pools = tuple(pool for pool in found if pool is not None)
    undecodable = index.undecodable if isinstance(index, ClassIndex) else []
    invalid = tuple(InvalidObject("GPUClass", name, "does not decode") for name in undecodable)
    if invalid:
        # A device of that class maps to no key: every figure could be short.
        problem = f"GPUClass {invalid[0].name}: does not decode"
        pools = tuple(PoolUse(p.namespace, p.tenant, (), (), problem) for p in pools)
    ours = {c.metadata.namespace for c in attached}
    taken = {
        c.metadata.namespace
        for c in config_maps
        if c.metadata.name == REPORT_NAME and c.metadata.namespace not in ours
    }
    # A report goes only where its namespace stands and is not being deleted: nothing can be
    # made in a namespace that does not exist yet, or in one being deleted.
    standing = {namespace, *(request.group or ())} - set(request.terminating)
    if request.target.terminating:
        standing = set()
    written = [p for p in pools if p.namespace in standing]
    reports = [_report(p) for p in written if p.namespace not in taken]
    response = DecoratorSyncResponse(attachments=reports, status=None)
    return ReportOutcome(
        response,
        pools=pools,
        reported=reported,
        invalid=invalid,
        counts={
            "pools": len(pools),
            "over_budget": sum(1 for p in pools if p.over_budget),
            "unreadable": sum(1 for p in pools if p.unreadable is not None),
            "conflicts": sum(1 for p in written if p.namespace in taken),
            # A report first asked for, or one Metacontroller cannot create because an unlabelled
            # `gpu-budget` (a tenant's own, which no rule here can name) already stands there:
            # the second stays above zero sync after sync.
            "unattached": sum(1 for r in reports if r.metadata.namespace not in ours),
            "unwritable": len(pools) - len(written),
        },
    )


def reported_namespaces(
    namespace: str, group: ReportGroup | None, in_group: Iterable[str], tenants: Iterable[Tenant]
) -> tuple[str, ...]:
    """The namespaces whose pools a target's sync decides: every namespace of a top-level subtree
    (itself included, labelled or not yet, and those a Tenant release names that are not made
    yet), the root's own, or none."""
    if group == "top_level":
        named = {t.owned_namespace for t in tenants if t.owned_namespace is not None}
        below = {n for n in named if n.startswith(f"{namespace}-")}
        return tuple(sorted({namespace, *in_group, *below}))
    return (namespace,) if group == "root" else ()
