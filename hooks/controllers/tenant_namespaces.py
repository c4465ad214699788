"""DecoratorController `gpuclass-tenant-namespaces`: labels that let the report targets select
their namespaces.

Its targets are every Namespace. A namespace a tenant could own (`tenant-root` and `tenant-*`)
gets `gpuclass.cozystack.io/tenant-namespace: "true"` (which makes it a target of the budget
report); below `tenant-root`, `gpuclass.cozystack.io/top-level-namespace: <the top-level tenant's
namespace it is in>` (itself at depth 1), a name's alone; and, while the root tenant is bounded,
`gpuclass.cozystack.io/pool-level-0: tenant-root` (the root's pool reads the whole tenancy, and
only then). The deeper `pool-level-<depth>` labels of earlier versions are removed.

Whether the root tenant is bounded is read once: `tenant-root` relates the Tenant releases that
could claim it, and every other tenant namespace relates the `tenant-root` Namespace and copies
its label. Metacontroller matches every related object against every target's rules, so a
release rule on every tenant namespace would cost a selector match per namespace for each release
it lists; a Namespace rule by name costs a comparison. Both are a name's alone, so
customize never depends on labels (Metacontroller caches its answer per generation, which a
label change does not bump). Any other namespace is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hooks.controllers import STALE_RULES_RETRY_SECONDS
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.subtrees import namespace_chain, root_bounded, top_level_namespace
from hooks.rules.budget.tenancy import ROOT_NAMESPACE, TENANT, Tenant, owner_of
from hooks.rules.invalid import InvalidObject
from hooks.wire.cozystack import KIND_LABEL, NAME_LABEL
from hooks.wire.metacontroller import (
    CustomizeResponse,
    LabelSelector,
    LabelsResponse,
    RelatedRule,
    TenantNamespaceSync,
)

TENANT_NAMESPACE_LABEL = "gpuclass.cozystack.io/tenant-namespace"
POOL_LEVEL_PREFIX = "gpuclass.cozystack.io/pool-level-"
TOP_LEVEL_LABEL = "gpuclass.cozystack.io/top-level-namespace"
HELMRELEASES_API_VERSION = "helm.toolkit.fluxcd.io/v2"

LabelsResult = Literal["ok", "not_a_tenant_namespace", "stale_related"]


def pool_level_label(depth: int) -> str:
    """The label naming the pool root at this depth above (or at) a namespace: only depth 0 is
    written (`tenant-root`, while bounded); deeper ones are removed."""
    return f"{POOL_LEVEL_PREFIX}{depth}"


def claimant_rules(namespace: str) -> list[RelatedRule]:
    """The Tenant releases that could claim the namespace: in its parent namespace, by the name
    label (`tenant-root` is claimed by the root tenant, named `root`), or by the release's name
    where the label is missing. Empty for a namespace no tenant could own."""
    owner = owner_of(namespace)
    if owner is None:
        return []
    where, name = owner
    release_name = ROOT_NAMESPACE if namespace == ROOT_NAMESPACE else f"tenant-{name}"
    return [
        RelatedRule(
            api_version=HELMRELEASES_API_VERSION,
            resource="helmreleases",
            label_selector=LabelSelector(match_labels={KIND_LABEL: TENANT, NAME_LABEL: name}),
            namespace=where,
        ),
        RelatedRule(
            api_version=HELMRELEASES_API_VERSION,
            resource="helmreleases",
            namespace=where,
            names=[release_name],
        ),
    ]


def customize(namespace: str) -> CustomizeResponse:
    if namespace == ROOT_NAMESPACE:
        return CustomizeResponse(related_resources=claimant_rules(ROOT_NAMESPACE))
    if not namespace_chain(namespace):
        return CustomizeResponse(related_resources=[])
    root = RelatedRule(api_version="v1", resource="namespaces", names=[ROOT_NAMESPACE])
    return CustomizeResponse(related_resources=[root])


@dataclass(frozen=True)
class LabelsOutcome:
    response: LabelsResponse
    outcome: LabelsResult = "ok"
    invalid: tuple[InvalidObject, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)


def sync(request: TenantNamespaceSync, platform_values: str) -> LabelsOutcome:
    chain = namespace_chain(request.namespace)
    if not chain:
        return LabelsOutcome(
            LabelsResponse(labels={}, attachments=[], status=None), "not_a_tenant_namespace"
        )
    in_root_pool, invalid = _in_root_pool(request, platform_values)
    if in_root_pool is None:
        # Selected by other rules than today's (or the root's Namespace did not decode): leave the
        # labels until customize is asked again.
        response = LabelsResponse(
            labels={}, attachments=[], status=None, resync_after_seconds=STALE_RULES_RETRY_SECONDS
        )
        return LabelsOutcome(response, "stale_related", invalid=invalid)
    labels: dict[str, str | None] = {
        TENANT_NAMESPACE_LABEL: "true",
        TOP_LEVEL_LABEL: top_level_namespace(request.namespace),
        pool_level_label(0): ROOT_NAMESPACE if in_root_pool else None,
    }
    for depth in range(1, len(chain)):
        labels[pool_level_label(depth)] = None
    return LabelsOutcome(
        LabelsResponse(labels=labels, attachments=[], status=None),
        invalid=invalid,
        counts={"depth": len(chain), "in_root_pool": int(in_root_pool)},
    )


def _in_root_pool(
    request: TenantNamespaceSync, platform_values: str
) -> tuple[bool | None, tuple[InvalidObject, ...]]:
    """Whether the root tenant is bounded: from its claimants for `tenant-root`, from the label
    `tenant-root` carries for the others; None when the request cannot tell. With the releases
    that did not decode."""
    if request.namespace == ROOT_NAMESPACE:
        if request.releases is None:
            return None, ()
        objects = [release_object(raw, platform_values) for raw in request.releases]
        tenants = [o for o in objects if isinstance(o, Tenant)]
        invalid = tuple(
            InvalidObject("HelmRelease", t.where, t.unreadable)
            for t in tenants
            if t.unreadable is not None
        )
        return root_bounded(tenants), invalid
    if request.namespaces is None or request.namespaces.invalid:
        unreadable = request.namespaces.invalid if request.namespaces else []
        return None, tuple(InvalidObject("Namespace", n, "does not decode") for n in unreadable)
    root = [n for n in request.namespaces.objects if n.metadata.name == ROOT_NAMESPACE]
    in_pool = any(n.metadata.labels.get(pool_level_label(0)) == ROOT_NAMESPACE for n in root)
    return in_pool, ()
