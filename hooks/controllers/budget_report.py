"""DecoratorController `gpuclass-budget-pools`: every GPU budget pool's use, for people to read.

Its targets are the tenant namespaces (labelled by `gpuclass-tenant-namespaces`); each pool
root's attachment is a ConfigMap `gpu-budget` in its own namespace, holding its own pool's figures
(`hooks.rules.budget.usage`, the arithmetic the webhook applies) and the apps that reserve. A
target's related objects are what its pool's arithmetic reads and nothing more
(`hooks.rules.budget.subtrees`): the Tenant releases that could claim it, every Tenant, VMInstance
and KubernetesNodes release in the namespaces labelled into its subtree, those namespaces (one
labelled later re-syncs the report), the GPUClasses, and a ConfigMap `gpu-budget` in its own
namespace (one that is not its attachment is a tenant's own, and is never written over). So a
change re-syncs only the pools above it, each with its own subtree. The rules depend on the
namespace's name alone: a target that is not bounded selects no subtree and gets no report. The
webhook never reads the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import msgspec

from hooks.controllers import STALE_RULES_RETRY_SECONDS
from hooks.controllers.tenant_namespaces import (
    HELMRELEASES_API_VERSION,
    claimant_rules,
    pool_level_label,
)
from hooks.rules.budget.keys import TOTAL_KEY
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.subtrees import namespace_chain
from hooks.rules.budget.tenancy import (
    KUBERNETES_NODES,
    TENANT,
    VM_INSTANCE,
    App,
    Tenancy,
    Tenant,
)
from hooks.rules.budget.usage import PoolUse, pool_usage
from hooks.rules.classes import class_identity
from hooks.rules.invalid import InvalidObject
from hooks.wire.cozystack import KIND_LABEL
from hooks.wire.kube import ConfigMap
from hooks.wire.metacontroller import (
    GPUCLASS_API_VERSION,
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

ReportResult = Literal["ok", "stale_related"]


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
    invalid: tuple[InvalidObject, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)


def customize(namespace: str) -> CustomizeResponse:
    chain = namespace_chain(namespace)
    if not chain:
        return CustomizeResponse(related_resources=[])
    in_subtree = LabelSelector(match_labels={pool_level_label(len(chain) - 1): namespace})
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
                            values=[TENANT, VM_INSTANCE, KUBERNETES_NODES],
                        )
                    ]
                ),
                namespace_selector=in_subtree,
            ),
            RelatedRule(api_version="v1", resource="namespaces", label_selector=in_subtree),
            RelatedRule(api_version=GPUCLASS_API_VERSION, resource="gpuclasses"),
            RelatedRule(
                api_version="v1", resource="configmaps", namespace=namespace, names=[REPORT_NAME]
            ),
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


def sync(request: ReportSync) -> ReportOutcome:
    namespace = request.target.metadata.name
    attached = list(request.attached.objects) if request.attached else []
    if namespace_chain(namespace) and (
        request.releases is None
        or request.classes is None
        or request.same_named is None
        or not request.subtree_sent
    ):
        # Selected by other rules than today's: keep the report until customize is asked again.
        response = DecoratorSyncResponse(
            attachments=_kept(attached), status=None, resync_after_seconds=STALE_RULES_RETRY_SECONDS
        )
        return ReportOutcome(response, "stale_related", counts={"kept": len(attached)})
    objects = [release_object(raw) for raw in request.releases or []]
    tenancy = Tenancy(
        tuple(o for o in objects if isinstance(o, Tenant)),
        tuple(o for o in objects if isinstance(o, App)),
    )
    classes = [class_identity(c) for c in request.classes.objects] if request.classes else []
    own = pool_usage(tenancy, classes, namespace)
    pools: tuple[PoolUse, ...] = () if own is None else (own,)
    invalid = tuple(
        InvalidObject("GPUClass", name, "does not decode")
        for name in (request.classes.invalid if request.classes else [])
    )
    if invalid:
        # A device of that class maps to no key: every figure could be short.
        problem = f"GPUClass {invalid[0].name}: does not decode"
        pools = tuple(PoolUse(p.namespace, p.tenant, (), (), problem) for p in pools)
    same_named = request.same_named.objects if request.same_named else []
    taken = not attached and any(c.metadata.name == REPORT_NAME for c in same_named)
    writable = not request.target.terminating
    reports = [_report(p) for p in pools if not taken and writable]
    response = DecoratorSyncResponse(attachments=reports, status=None)
    return ReportOutcome(
        response,
        pools=pools,
        invalid=invalid,
        counts={
            "pools": len(pools),
            "over_budget": sum(1 for p in pools if p.over_budget),
            "unreadable": sum(1 for p in pools if p.unreadable is not None),
            "conflicts": len(pools) if taken else 0,
            "unwritable": 0 if writable else len(pools),
        },
    )


def retired_sync() -> DecoratorSyncResponse:
    """The answer to the report of versions before the per-pool one (its target the release's
    ClusterRole): no attachment, so Metacontroller deletes the reports it attached there, which
    the pool reports cannot write over (nothing adopts another owner's object). Its controller
    stays in the chart for upgrades from those versions."""
    return DecoratorSyncResponse(attachments=[], status=None)
