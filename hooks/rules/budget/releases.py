"""HelmReleases of the tenancy as the budget rules read them: a Tenant or an App each, decoded
straight from the release's bytes (only the fields the rules read), and marked with what could
not be read and where when it does not decode, so that only the verdicts that need it fail
closed. The webhook's reads and the budget report's related releases go through the same
function."""

from __future__ import annotations

import msgspec

from hooks.rules.budget.keys import quota_problem, tenant_declaration
from hooks.rules.budget.tenancy import (
    KUBERNETES_NODES,
    TENANT,
    App,
    Tenant,
    app_from,
    tenant_from_release,
)
from hooks.wire.cozystack import (
    KIND_LABEL,
    NAME_LABEL,
    AppSpec,
    HelmRelease,
    ReleaseHead,
    TenantSpec,
    app_spec,
    sets_reservation,
    tenant_spec,
)
from hooks.wire.problems import Undecodable, decoded

_RELEASE = msgspec.json.Decoder(HelmRelease)
_HEAD = msgspec.json.Decoder(ReleaseHead)


def release_object(raw: msgspec.Raw) -> Tenant | App:
    """One HelmRelease of the tenancy as a Tenant or an App, marked when it cannot be read."""
    values: AppSpec | TenantSpec | None = None
    try:
        release = decoded(_RELEASE, raw)
        head: ReleaseHead = release
        kind = release.metadata.labels.get(KIND_LABEL, "")
        read_values = tenant_spec if kind == TENANT else app_spec
        values = read_values(release.spec.values, "spec.values")
        problem = None
        # Its values are only partly here: never counted as holding nothing, unless its own
        # values set all its reservation reads (Flux merges them over the referenced ones). A
        # Tenant's quotas are a map, merged key by key: any may come from elsewhere.
        values_from = bool(release.spec.values_from) and (
            kind == TENANT or not sets_reservation(release.spec.values, kind == KUBERNETES_NODES)
        )
        if values_from:
            problem = (
                "spec.valuesFrom: values from a ConfigMap or Secret, which the webhook does not "
                "read"
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
    spec = values if isinstance(values, AppSpec) else AppSpec()
    return app_from(
        spec,
        meta.namespace,
        kind,
        name or "",
        unreadable,
        release=meta.name,
        values_from=values_from,
    )
