"""Cozystack's apps as the budget webhook reads them: the object under review, and the Flux
HelmRelease that stores each app (its values are the app's spec)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, TypeVar

import msgspec

from hooks.wire.kube import ObjectMeta, is_absent
from hooks.wire.problems import BadRequest, Undecodable, decoded

# Labels Cozystack puts on the HelmRelease of every app.
KIND_LABEL = "apps.cozystack.io/application.kind"
NAME_LABEL = "apps.cozystack.io/application.name"

# The kinds of app the budgets read.
TENANT = "Tenant"
VM_INSTANCE = "VMInstance"
KUBERNETES_NODES = "KubernetesNodes"
KUBERNETES = "Kubernetes"

# The defaults of the apps' ApplicationDefinition schemas for the fields the budgets read.
# Cozystack stores an app's spec as it was sent and applies these only when it reads a release
# back, so a stored release that leaves a field out means its default, never "unreadable". The
# tests hold them to Cozystack's own ApplicationDefinitions.
DEFAULT_INSTANCE_TYPE = "u1.medium"
DEFAULT_MAX_REPLICAS = 10
DEFAULT_MIN_REPLICAS = 0
# The node group the Kubernetes app's chart runs when `nodeGroups` is empty: the defaults above,
# no gpus entries.
DEFAULT_NODE_GROUP = "md0"

S = TypeVar("S")


class _Cozystack(msgspec.Struct, kw_only=True, rename="camel"):
    pass


class GpuEntry(_Cozystack):
    name: str = ""


# A quota as people write it in values: a quantity string, or a YAML number. The rules decide
# whether it is a whole number of devices; the wire only keeps it.
QuotaValue = str | int | float | bool | None

Size = Annotated[int, msgspec.Meta(ge=0)]


class VMSpec(_Cozystack):
    """What a VM attaches: its gpus entries and the cluster instance type it names (`null` or
    `""`: none, as the chart renders no instance type then)."""

    gpus: list[GpuEntry] = []
    instance_type: str | None = DEFAULT_INSTANCE_TYPE


class NodeGroupSpec(VMSpec):
    """A worker pool (KubernetesNodes, or one of a Kubernetes app's node groups): what each of
    its VMs attaches, and its size bounds (`null` removes a value from Helm's merge: read as
    its default, the larger)."""

    max_replicas: Size | None = DEFAULT_MAX_REPLICAS
    min_replicas: Size | None = DEFAULT_MIN_REPLICAS


class _RawGroups(_Cozystack):
    node_groups: dict[str, msgspec.Raw] | None = None


def default_node_groups() -> dict[str, NodeGroupSpec]:
    """What the Kubernetes app's chart runs when `nodeGroups` is empty or absent."""
    return {DEFAULT_NODE_GROUP: NodeGroupSpec()}


# What each kind's reservation reads of its values: a `valuesFrom` reference with a
# `targetPath` under none of these contributes nothing the budgets read.
READ_FIELDS = {
    TENANT: frozenset({"resourceQuotas"}),
    VM_INSTANCE: frozenset({"gpus", "instanceType"}),
    KUBERNETES_NODES: frozenset({"gpus", "instanceType", "maxReplicas", "minReplicas"}),
    KUBERNETES: frozenset({"nodeGroups"}),
}


class _Sizes(_Cozystack):
    """Which of the fields a VM's or a worker pool's reservation reads its values set at all."""

    gpus: list[msgspec.Raw] | msgspec.UnsetType | None = msgspec.UNSET
    instance_type: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    max_replicas: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    min_replicas: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


def sets_reservation(values: msgspec.Raw, kind: str) -> bool:
    """Whether an app's values set everything its reservation reads, so that nothing merged
    under them from elsewhere (Flux's `valuesFrom`) can change it. Flux merges a release's
    `values` over what it takes from elsewhere, a list or a scalar replaced whole, a map merged
    key by key: a VM's values decide when they set its `gpus` and `instanceType`; a
    KubernetesNodes' also its size bounds; a Kubernetes app's node groups (a map) never."""
    if kind not in (VM_INSTANCE, KUBERNETES_NODES):
        return False
    try:
        sizes = decoded(_SIZES, values)
    except Undecodable:
        return False
    unset = msgspec.UnsetType
    read = [sizes.gpus, sizes.instance_type]
    if kind == KUBERNETES_NODES:
        read += [sizes.max_replicas, sizes.min_replicas]
    return sizes.gpus is not None and not any(isinstance(field, unset) for field in read)


def object_sets_reservation(raw: msgspec.Raw, kind: str) -> bool:
    """`sets_reservation` of an app object's spec."""
    try:
        head = decoded(_OBJECT_HEAD, raw)
    except Undecodable:
        return False
    return sets_reservation(head.spec, kind)


class TenantSpec(_Cozystack):
    """The field of a Tenant's spec (or its HelmRelease's values) the budgets read."""

    resource_quotas: dict[str, QuotaValue] = {}


class ObjectHead(_Cozystack):
    """An app under review, its spec still raw: how it is read depends on its kind."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))


class TenantObject(_Cozystack):
    """A Tenant under review."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: TenantSpec = msgspec.field(default_factory=TenantSpec)


class ReleaseMeta(_Cozystack):
    name: str = ""
    namespace: str = ""
    labels: dict[str, str] = {}


class ReleaseHead(_Cozystack):
    """Where a HelmRelease is and which app it stores; decoded apart from its values, so that a
    release whose values do not decode can still be placed and named."""

    metadata: ReleaseMeta = msgspec.field(default_factory=ReleaseMeta)


class ValuesReference(_Cozystack):
    """One of Flux's `spec.valuesFrom`: values merged under `values` from a ConfigMap or Secret
    (at `targetPath`, else at the top)."""

    kind: str = ""
    name: str = ""
    target_path: str = ""


class HelmReleaseSpec(_Cozystack):
    # The app's spec, read as its kind (the release's labels) says.
    values: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))
    values_from: list[ValuesReference] = []


class HelmRelease(ReleaseHead):
    """How Cozystack stores an app: the app's spec is the HelmRelease's values."""

    spec: HelmReleaseSpec = msgspec.field(default_factory=HelmReleaseSpec)


_TARGET_HEAD = re.compile(r"(?:[^.\\[]|\\.)*")


def contributes_nothing_read(reference: ValuesReference, kind: str, platform_values: str) -> bool:
    """A reference to the platform's own values Secret (Cozystack's API writes it on every release
    as `{kind: Secret, name: cozystack-values}`) merged at the top or at a path outside what the
    budgets read of this kind. That Secret holds only `_`-prefixed keys (`_cluster`,
    `_namespace`), and Cozystack's API refuses such keys in a spec, so it sets nothing read."""
    if reference.kind != "Secret" or reference.name != platform_values:
        return False
    if not reference.target_path:
        return True
    # The first segment of a Helm `--set` style path: `a.b`, `a[0]`, with `\.` escaping a dot.
    head = _TARGET_HEAD.match(reference.target_path)
    top = head.group(0).replace("\\", "") if head else ""
    return top not in READ_FIELDS.get(kind, frozenset()) and top != ""


def node_group_specs(raw: msgspec.Raw, at: str) -> dict[str, msgspec.Raw]:
    """A Kubernetes app's node groups, each still raw (so that one that does not decode is
    named alone); Undecodable when the map itself is not one."""
    groups = decoded(_RAW_GROUPS, raw, at).node_groups
    return groups or {}


class _Quotas(_Cozystack):
    """A Tenant's quotas with their values still raw: which one does not decode."""

    resource_quotas: dict[str, msgspec.Raw] = {}


def tenant_spec(raw: msgspec.Raw, at: str) -> TenantSpec:
    """A Tenant's spec (`at` names where it sits, for the message). A quota whose value is no
    quantity (`[4]`, `{"a": 1}`) is named by its key."""
    try:
        return decoded(_TENANT_SPEC, raw, at)
    except Undecodable as whole:
        try:
            quotas = decoded(_QUOTAS, raw, at).resource_quotas
        except Undecodable:
            raise whole from None
        for key in sorted(quotas):
            decoded(_QUOTA_VALUE, quotas[key], f"{at}.resourceQuotas.{key}")
        raise


def decode_tenant_object(raw: msgspec.Raw, field: str) -> TenantObject | None:
    """A Tenant under review, as decode_app_object."""
    head = decode_object_head(raw, field)
    if head is None:
        return None
    return TenantObject(metadata=head.metadata, spec=_spec_of(tenant_spec, head, field))


def decode_object_head(raw: msgspec.Raw, field: str) -> ObjectHead | None:
    """An app under review with its spec still raw (how it is read depends on its kind); None
    when the field is absent; BadRequest naming the field when it is not an object."""
    if is_absent(raw):
        return None
    try:
        return decoded(_OBJECT_HEAD, raw)
    except Undecodable as error:
        raise BadRequest(f"{field} is not a valid app: {error}") from None


def _spec_of(read: Callable[[msgspec.Raw, str], S], head: ObjectHead, field: str) -> S:
    try:
        return read(head.spec, "spec")
    except Undecodable as error:
        raise BadRequest(f"{field} is not a valid app: {error}") from None


_OBJECT_HEAD = msgspec.json.Decoder(ObjectHead)
_RAW_GROUPS = msgspec.json.Decoder(_RawGroups)
_SIZES = msgspec.json.Decoder(_Sizes)
_TENANT_SPEC = msgspec.json.Decoder(TenantSpec)
_QUOTAS = msgspec.json.Decoder(_Quotas)
_QUOTA_VALUE: msgspec.json.Decoder[QuotaValue] = msgspec.json.Decoder(QuotaValue)
