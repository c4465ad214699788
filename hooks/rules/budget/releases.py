"""HelmReleases of the tenancy as the budget rules read them: a Tenant or an App each, decoded
straight from the release's bytes (only the fields the rules read), and marked with what could
not be read and where when it does not decode, so that only the verdicts that need it fail
closed. The webhook's reads, the budget report's related releases and `plan` go through the
same function."""

from __future__ import annotations

import msgspec

from hooks.rules.budget.keys import quota_problem, tenant_declaration
from hooks.rules.budget.tenancy import (
    KUBERNETES,
    KUBERNETES_NODES,
    TENANT,
    App,
    Group,
    Tenant,
    group_of,
    tenant_from_release,
)
from hooks.wire.cozystack import (
    KIND_LABEL,
    NAME_LABEL,
    HelmRelease,
    NodeGroupSpec,
    ReleaseHead,
    TenantSpec,
    VMSpec,
    contributes_nothing_read,
    default_node_groups,
    node_group_specs,
    sets_reservation,
    tenant_spec,
)
from hooks.wire.problems import Undecodable, decoded

_RELEASE = msgspec.json.Decoder(HelmRelease)
_HEAD = msgspec.json.Decoder(ReleaseHead)
_VM = msgspec.json.Decoder(VMSpec)
_GROUP = msgspec.json.Decoder(NodeGroupSpec)


def release_object(raw: msgspec.Raw, platform_values: str) -> Tenant | App:
    """One HelmRelease of the tenancy as a Tenant or an App, marked when it cannot be read.
    `platform_values` names the platform's own values Secret, which every release Cozystack
    writes takes values from and which sets nothing the budgets read."""
    values: TenantSpec | tuple[Group, ...] | None = None
    try:
        release = decoded(_RELEASE, raw)
        head: ReleaseHead = release
        kind = release.metadata.labels.get(KIND_LABEL, "")
        if kind == TENANT:
            values = tenant_spec(release.spec.values, "spec.values")
        else:
            values = app_groups(release.spec.values, kind, "spec.values")
        problem = None
        # Its values are only partly here: never counted as holding nothing, unless its own
        # values set all its reservation reads (Flux merges them over the referenced ones). A
        # Tenant's quotas are a map, merged key by key: any may come from elsewhere.
        elsewhere = [
            ref
            for ref in release.spec.values_from
            if not contributes_nothing_read(ref, kind, platform_values)
        ]
        values_from = bool(elsewhere) and not sets_reservation(release.spec.values, kind)
        if values_from:
            ref = elsewhere[0]
            problem = (
                f"spec.valuesFrom: values from {ref.kind or 'an object'} {ref.name}, which the "
                "webhook does not read"
            )
    except Undecodable as error:
        problem, values_from = str(error), False
        try:
            head = decoded(_HEAD, raw)
        except Undecodable:
            # Not even where it lives: every verdict that reads the tenancy must fail closed.
            return Tenant("", None, unreadable=f"HelmRelease (unnamed): {problem}")
    meta = head.metadata
    where = f"HelmRelease {meta.namespace}/{meta.name}"
    kind = meta.labels.get(KIND_LABEL, "")
    # An empty name label says no more than a missing one.
    name = meta.labels.get(NAME_LABEL) or None
    if kind == TENANT:
        quotas = values.resource_quotas if isinstance(values, TenantSpec) else {}
        name = name or tenant_from_release(meta.name)
        if problem is None and name is None:
            problem = f"metadata.labels: no {NAME_LABEL}, and the release name names no tenant"
        if problem is None and (invalid := quota_problem(quotas)):
            problem = f"spec.values.{invalid}"
        unreadable = f"{where}: {problem}" if problem else None
        declaration = tenant_declaration(quotas)
        return Tenant(
            meta.namespace, name, declaration, unreadable, meta.name, values_from=values_from
        )
    unreadable = f"{where}: {problem}" if problem else None
    groups = values if isinstance(values, tuple) and unreadable is None else ()
    return App(
        meta.namespace,
        kind,
        name or "",
        groups,
        unreadable,
        meta.name,
        values_from=values_from,
    )


def app_groups(values: msgspec.Raw, kind: str, at: str) -> tuple[Group, ...]:
    """An app's groups, from its spec (`at` names where it sits, for the message): a Kubernetes
    app's node groups by name, else the one. Undecodable when what it attaches cannot be read. A
    worker pool's size that does not decode is marked on its group, so that it fails closed only
    where that group attaches a device: an app that asks for none (which the webhook's match
    conditions let through unjudged) never makes a pool unreadable, stored or under review."""
    if kind == KUBERNETES:
        raws = node_group_specs(values, at)
        if not raws:
            return tuple(group_of(spec) for spec in default_node_groups().values())
        return tuple(_pool(raws[name], f"{at}.nodeGroups.{name}") for name in sorted(raws))
    if kind == KUBERNETES_NODES:
        return (_pool(values, at),)
    return (group_of(decoded(_VM, values, at)),)


def _pool(raw: msgspec.Raw, at: str) -> Group:
    try:
        return group_of(decoded(_GROUP, raw, at))
    except Undecodable as problem:
        devices = group_of(decoded(_VM, raw, at))  # what it attaches, read alone
        return Group(devices.gpus, devices.instance_type, replicas=0, size_problem=str(problem))
