"""The budget report and the webhook agree on every tenancy (docs/gpu-budgets.md, "One membership
rule"): for each pool and key the report shows, a VM needing the report's `left` is admitted and
one needing `left + 1` is denied; a pool the report cannot figure, the webhook fails closed in.

The report is computed by its own sync (`hooks.controllers.budget_report.sync`) over every release
of the cluster, as Metacontroller sends them; the webhook reads only what its scoped reads ask for
(`hooks.rules.budget.scope`), from the same releases. The tenancies are generated with what a
long-lived cluster holds: namespaces whose Tenant release is gone, devices of a class the hoster
deleted or whose resource changed, worker pools, bounded and unbounded sub-tenants.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hooks.cli import offline
from hooks.controllers import budget_report
from hooks.controllers.budget import review_app, review_tenant
from hooks.rules.budget.instance_types import catalog_of
from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import App, Tenancy, Tenant
from hooks.rules.budget.usage import PoolUse, budget_usage
from hooks.rules.classes import ClassIdentity
from hooks.settings import Settings
from hooks.wire.metacontroller import decode_report_sync
from tests import cozystack
from tests.builders import inventory_of, scoped_tenancy
from tests.profiles import examples
from tests.rules.budget.test_invariant import (
    INSTANCE_TYPES,
    KIND_LABEL,
    NAME_LABEL,
    PLATFORM_VALUES,
    LegacyReleases,
    Release,
    decode,
    instance_type_objects,
    request,
)

L40S, H100, SPARE = "nvidia.com/L40S", "nvidia.com/H100", "nvidia.com/SPARE"
L40S_NEW = "nvidia.com/L40S-NEW"  # what class l40s names once its resource was changed
L40S_CLASS = ClassIdentity("l40s", "2026-01-01T00:00:00Z", False, L40S)
H100_CLASS = ClassIdentity("h100", "2026-01-02T00:00:00Z", False, H100)
# A class no tenant declares a key of: its devices grow the total key alone.
SPARE_CLASS = ClassIdentity("spare", "2026-01-03T00:00:00Z", False, SPARE)
KEYS = (TOTAL_KEY, class_key("l40s"), class_key("h100"))


@dataclass(frozen=True)
class Cluster:
    """A cluster's releases and classes, read by the report and by the webhook."""

    releases: tuple[Release, ...]
    classes_: tuple[ClassIdentity, ...] = (L40S_CLASS, H100_CLASS, SPARE_CLASS)

    # what the webhook reads
    def catalog(self) -> Catalog:
        return catalog_of(self.classes_, instance_type_objects(INSTANCE_TYPES))

    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        return scoped_tenancy(LegacyReleases(self.releases), namespaces, subtrees)

    # what the report's syncs are sent
    def items(self) -> list[dict[str, Any]]:
        def release(r: Release) -> dict[str, Any]:
            decoded: dict[str, Any] = json.loads(bytes(r.raw()))
            return {"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease", **decoded}

        def gpuclass(c: ClassIdentity) -> dict[str, Any]:
            meta = {"name": c.name, "creationTimestamp": c.created}
            return {
                "apiVersion": "cozystack.io/v1alpha1",
                "kind": "GPUClass",
                "metadata": meta,
                "spec": {"resourceName": c.resource_name},
            }

        return [*(release(r) for r in self.releases), *(gpuclass(c) for c in self.classes_)]

    def report(self) -> dict[str, PoolUse]:
        """Each pool's report, computed by the sync of the target that reports it from what its
        rules select once the labeller's syncs labelled every tenant namespace
        (`hooks.cli.offline.pool_requests`): no pool is reported twice."""
        requests = offline.pool_requests(inventory_of(self.items()), Settings())
        found: dict[str, PoolUse] = {}
        for body in requests.values():
            outcome = budget_report.sync(
                decode_report_sync(json.dumps(body).encode()),
                PLATFORM_VALUES,
                Settings().budget_classes_namespace,
            )
            assert outcome.pools is not None
            for pool in outcome.pools:
                assert pool.namespace not in found
                found[pool.namespace] = pool
        return found

    def whole(self) -> dict[str, PoolUse]:
        """Every pool computed at once over every release of the cluster."""
        objects = [release_object(msgspec.Raw(r.raw()), PLATFORM_VALUES) for r in self.releases]
        tenancy = Tenancy(
            tuple(o for o in objects if isinstance(o, Tenant)),
            tuple(o for o in objects if isinstance(o, App)),
        )
        return {pool.namespace: pool for pool in budget_usage(tenancy, self.catalog())}

    def declared(self, namespace: str) -> set[str]:
        """The budget keys the tenant owning the namespace declares."""
        return {
            key
            for r in self.releases
            if r.kind == "Tenant" and r.label and own(r.namespace, r.label) == namespace
            for key in r.values.get("resourceQuotas", {})
            if key in KEYS
        }

    def admits(self, namespace: str, resource: str, count: int) -> tuple[bool, str]:
        """The webhook's verdict on a new VM of `count` devices of `resource` there."""
        spec = {"gpus": [{"name": resource}] * count}
        verdict = review_app(decode(request("VMInstance", namespace, "probe", spec, None)), self)
        return verdict.verdict.allowed, verdict.verdict.message


def tenant_release(namespace: str, name: str, quotas: dict[str, int] | None = None) -> Release:
    values = {"resourceQuotas": {k: str(v) for k, v in quotas.items()}} if quotas else {}
    return Release(namespace, f"tenant-{name}", "Tenant", name, values)


def app(namespace: str, name: str, *gpus: str, **sizes: int) -> Release:
    kind = "KubernetesNodes" if sizes else "VMInstance"
    values = {"gpus": [{"name": g} for g in gpus], **sizes}
    return Release(namespace, cozystack.release_prefix(kind) + name, kind, name, values)


def own(release_namespace: str, name: str) -> str:
    if release_namespace == "tenant-root":
        return "tenant-root" if name == "root" else f"tenant-{name}"
    return f"{release_namespace}-{name}"


def probes(tenancy: Cluster) -> list[tuple[str, str]]:
    """Each key, and a resource whose devices grow it (and the total key) alone."""
    classed = {c.resource_name for c in tenancy.classes_}
    pairs = ((TOTAL_KEY, SPARE), (KEYS[1], L40S), (KEYS[2], H100))
    return [(key, resource) for key, resource in pairs if resource in classed]


def agreement(tenancy: Cluster) -> list[str]:
    """Every disagreement between the report and the webhook, in words."""
    found = []
    for namespace, pool in tenancy.report().items():
        if pool.unreadable is not None:
            # a device of a key the pool declares needs its figures: the webhook fails closed
            for key, resource in probes(tenancy):
                if key in tenancy.declared(namespace) and tenancy.admits(namespace, resource, 1)[0]:
                    found.append(f"{namespace}: the report cannot figure it, the webhook admitted")
            continue
        left = {use.key: max(use.left, 0) for use in pool.keys}
        for key, resource in probes(tenancy):
            if key not in left:
                continue
            grown = [k for k in (key, TOTAL_KEY) if k in left]
            for count in (left[key], left[key] + 1):
                if count == 0:
                    continue
                expected = all(count <= left[k] for k in grown)
                allowed, message = tenancy.admits(namespace, resource, count)
                if allowed != expected:
                    found.append(
                        f"{namespace} {key}: left {pool.keys}, {count} devices "
                        f"{'admitted' if allowed else 'denied: ' + message}"
                    )
    return found


@st.composite
def tenancies(draw: st.DrawFn) -> Cluster:
    """A root, tenants two levels deep (bounded or not, GPU keys or not, declarations that fit
    or not, some known by their release name only, some claimed twice), apps with devices of
    every class and of resources no class names, worker pools, namespaces whose Tenant release is
    gone, releases no reader decodes; and the hoster's classes as they came to be."""
    releases = [tenant_release("tenant-root", "root", draw(quotas()))]
    namespaces = ["tenant-root"]
    for name in draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4, unique=True)):
        where = draw(st.sampled_from(namespaces))
        made = tenant_release(where, name, draw(quotas()))
        if draw(st.integers(0, 4)) == 0:  # made before the name label: known by its release name
            made = replace(made, label=None)
        releases.append(made)
        if draw(st.integers(0, 9)) == 0:  # another release claiming the same namespace
            releases.append(Release(where, f"again-{name}", "Tenant", name, made.values))
        namespaces.append(own(where, name))
    gone = [f"{draw(st.sampled_from(namespaces))}-gone"]
    for index in range(draw(st.integers(0, 6))):
        where = draw(st.sampled_from(namespaces + gone))
        devices = draw(st.lists(st.sampled_from((L40S, H100, SPARE, L40S_NEW)), max_size=3))
        sizes = draw(st.sampled_from(({}, {"maxReplicas": 2}, {"minReplicas": 3})))
        made = app(where, f"app{index}", *devices, **sizes)
        if draw(st.integers(0, 9)) == 0:  # written before the webhook: no reader decodes it
            made = replace(made, values={"gpus": None})
        releases.append(made)
    l40s = draw(st.sampled_from(("as made", "deleted", "resource changed")))
    classes = {
        "as made": (L40S_CLASS, H100_CLASS, SPARE_CLASS),
        "deleted": (H100_CLASS, SPARE_CLASS),
        "resource changed": (replace(L40S_CLASS, resource_name=L40S_NEW), H100_CLASS, SPARE_CLASS),
    }[l40s]
    return Cluster(tuple(releases), classes)


def quotas() -> st.SearchStrategy[dict[str, int] | None]:
    budget = st.dictionaries(st.sampled_from((*KEYS, "requests.cpu")), st.integers(0, 8))
    return st.none() | budget


GONE = Cluster(
    (
        tenant_release("tenant-root", "root"),
        tenant_release("tenant-root", "a", {TOTAL_KEY: 4}),
        app("tenant-a-gone", "v", L40S, L40S, L40S),
    )
)
CLASS_DELETED = Cluster(
    (
        tenant_release("tenant-root", "root"),
        tenant_release("tenant-root", "a", {TOTAL_KEY: 4}),
        app("tenant-a", "v", L40S, L40S, L40S),
    ),
    (H100_CLASS, SPARE_CLASS),
)
RESOURCE_CHANGED = replace(
    CLASS_DELETED,
    classes_=(replace(L40S_CLASS, resource_name=L40S_NEW), H100_CLASS, SPARE_CLASS),
)
ON_TENANCIES = settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@ON_TENANCIES
@given(tenancy=tenancies())
@example(tenancy=GONE)
@example(tenancy=CLASS_DELETED)
@example(tenancy=RESOURCE_CHANGED)
def test_the_report_and_the_webhook_agree_on_every_pool_and_key(tenancy: Cluster) -> None:
    assert agreement(tenancy) == []


@ON_TENANCIES
@given(tenancy=tenancies())
@example(tenancy=GONE)
def test_each_pools_report_reads_all_its_figures_need(tenancy: Cluster) -> None:
    """A pool's report sees its claimants and the releases of the namespaces labelled into its
    subtree, nothing else: it gives the figures the arithmetic gives over every release at
    once, for every pool."""
    assert tenancy.report() == tenancy.whole()


# --- the ways they disagreed, each by name ----------------------------------------------------


def test_a_namespace_whose_tenant_release_is_gone_is_counted_by_neither() -> None:
    """`tenant-a-gone` is being deleted: its VM of 3 is in no pool, for the report as for the
    webhook (which never reads it), so `a` has 4 left and a VM of 4 is admitted."""
    [pool] = [p for p in GONE.report().values() if p.namespace == "tenant-a"]
    assert [(use.key, use.reserved, use.left) for use in pool.keys] == [(TOTAL_KEY, 0, 4)]
    assert GONE.admits("tenant-a", L40S, 4) == (True, "")


def test_a_deleted_class_frees_no_device() -> None:
    """A VM holds 3 of a class the hoster deleted: they count under the total key, and the pool
    cannot be filled with another class behind them; the report lists them apart."""
    pool = CLASS_DELETED.report()["tenant-a"]
    assert [(use.key, use.reserved, use.left) for use in pool.keys] == [(TOTAL_KEY, 3, 1)]
    assert pool.unclassed == ((L40S, 3),)
    assert CLASS_DELETED.admits("tenant-a", H100, 1) == (True, "")
    allowed, message = CLASS_DELETED.admits("tenant-a", H100, 2)
    assert not allowed and message.startswith(f"{TOTAL_KEY}: this VMInstance needs 2")


def test_a_class_whose_resource_changed_frees_no_device() -> None:
    """The CRD refuses the change now; a class changed before keeps the old devices counted."""
    pool = RESOURCE_CHANGED.report()["tenant-a"]
    assert [(use.key, use.reserved, use.left) for use in pool.keys] == [(TOTAL_KEY, 3, 1)]
    allowed, _ = RESOURCE_CHANGED.admits("tenant-a", L40S_NEW, 4)
    assert not allowed


def modelled_tenant_review(namespace: str, name: str, quotas: Any, old: Any = None) -> Any:
    spec = {"resourceQuotas": quotas}
    old_spec = None if old is None else {"resourceQuotas": old}
    return decode(request("Tenant", namespace, name, spec, old_spec))


def test_a_quota_no_reader_can_decode_is_refused_where_no_pool_lies_above() -> None:
    """`[4]` or `{"a": 1}` on a Tenant in tenant-root: stored, it would make the tenant's own
    pool unreadable and lock its growth; refused as "1500m" is, naming the key."""
    nothing = Cluster((tenant_release("tenant-root", "root"),))
    for value in ([4], {"a": 1}):
        verdict = review_tenant(
            modelled_tenant_review("tenant-root", "x", {TOTAL_KEY: value}), nothing
        )
        assert not verdict.verdict.allowed
        assert f"spec.resourceQuotas.{TOTAL_KEY}: expected" in verdict.verdict.message
        assert not verdict.read_inputs
    other = review_tenant(
        modelled_tenant_review("tenant-root", "x", {"requests.cpu": [1]}), nothing
    )
    assert not other.verdict.allowed and "spec.resourceQuotas.requests.cpu" in other.verdict.message


def test_an_updates_stored_object_is_only_its_baseline() -> None:
    """A legacy VM stored with `gpus: null` (its release without its name label, as migrations
    left it) is fixed to a list within its budget: what cannot be read of the stored release is
    a baseline of nothing, and the new object is judged as a create."""
    for label in (None, "", "legacy"):
        stored = Release("tenant-a", "vm-instance-legacy", "VMInstance", label, {"gpus": None})
        cluster = Cluster(
            (
                tenant_release("tenant-root", "root"),
                tenant_release("tenant-root", "a", {TOTAL_KEY: 4}),
                stored,
            )
        )
        fixed = {"gpus": [{"name": L40S}] * 4}
        review = decode(request("VMInstance", "tenant-a", "legacy", fixed, {"gpus": None}))
        assert review_app(review, cluster).verdict.allowed, label
        over = {"gpus": [{"name": L40S}] * 5}
        review = decode(request("VMInstance", "tenant-a", "legacy", over, {"gpus": None}))
        assert not review_app(review, cluster).verdict.allowed, label


def test_values_from_beside_values_gpus_counts_the_declared_gpus() -> None:
    """Flux merges `values` over `valuesFrom`: gpus and the instance type the values set are the
    ones installed; the platform's own values Secret, on every release, sets nothing read."""
    values = {"gpus": [{"name": L40S}] * 3, "instanceType": "u1.medium"}
    declared = Release("tenant-a", "vm-instance-v", "VMInstance", "v", values, {})
    cluster = Cluster(
        (
            tenant_release("tenant-root", "root"),
            tenant_release("tenant-root", "a", {TOTAL_KEY: 4}),
            declared,
        )
    )
    assert cluster.report()["tenant-a"].keys[0].left == 1
    assert cluster.admits("tenant-a", L40S, 1) == (True, "")
    assert not cluster.admits("tenant-a", L40S, 2)[0]
    for hidden in (
        replace(declared, values={}, hidden=values),
        # the gpus set, but the instance type, which may attach more, from elsewhere
        replace(declared, values={"gpus": values["gpus"]}, hidden={"instanceType": "gpu.l40s"}),
    ):
        cluster = replace(cluster, releases=(*cluster.releases[:2], hidden))
        assert cluster.report()["tenant-a"].unreadable is not None
        allowed, message = cluster.admits("tenant-a", L40S, 1)
        assert not allowed and message.endswith(
            "HelmRelease tenant-a/vm-instance-v: spec.valuesFrom: values from ConfigMap "
            "vm-instance-v-values, which the webhook does not read"
        )


def test_the_labels_the_generated_releases_carry() -> None:
    """The releases of these tests are labelled and written as Cozystack's API writes them."""
    labels = json.loads(bytes(app("tenant-a", "v", L40S).raw()))["metadata"]["labels"]
    written = cozystack.helmrelease("VMInstance", "tenant-a", "v", {})
    assert labels == written["metadata"]["labels"]
    assert labels[KIND_LABEL] == "VMInstance" and labels[NAME_LABEL] == "v"
    spec = msgspec.json.decode(tenant_release("tenant-root", "a", {TOTAL_KEY: 1}).raw())["spec"]
    assert spec["values"] == {"resourceQuotas": {TOTAL_KEY: "1"}}
    assert spec["valuesFrom"] == [cozystack.platform_values()]
