"""Metacontroller's hook envelopes (v2): requests decoded from bytes, responses exact.

Responses are Structs so that no unknown key can ever reach Metacontroller, whose v2 strict mode
fails a sync on one. Fields that would be empty are omitted, never sent empty: `names: []` means
"every object" to Metacontroller, and `labelSelector: {}` next to `names` fails the sync.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec

from hooks.wire.cozystack import HelmRelease
from hooks.wire.dra import (
    DEVICE_TAINT_RULES_API_VERSION,
    DRA_API_VERSION,
    DeviceClass,
    DeviceTaintRule,
    ResourceClaim,
    ResourceSlice,
)
from hooks.wire.kube import (
    Condition,
    ConfigMap,
    GPUClass,
    Instancetype,
    NameOnlyMeta,
    Namespace,
    Node,
    NodeStatus,
    ObjectMeta,
    Pod,
    PodSpec,
    Secret,
    is_absent,
)
from hooks.wire.problems import BadRequest, Undecodable, decode_request, decoded, decoder_for

GPUCLASS_API_VERSION = "cozystack.io/v1alpha1"
GPUCLASS_KIND = "GPUClass"

# Group keys of `related`, `children` and `attachments` maps: Kind.version for core kinds.
NODES = "Node.v1"
PODS = "Pod.v1"
NAMESPACES = "Namespace.v1"
SECRETS = "Secret.v1"
CONFIGMAPS = "ConfigMap.v1"
GPUCLASSES = f"{GPUCLASS_KIND}.{GPUCLASS_API_VERSION}"
HELMRELEASES = "HelmRelease.helm.toolkit.fluxcd.io/v2"
INSTANCE_TYPES_API_VERSION = "instancetype.kubevirt.io/v1beta1"
INSTANCE_TYPES = f"VirtualMachineClusterInstancetype.{INSTANCE_TYPES_API_VERSION}"

RESOURCE_SLICES = f"ResourceSlice.{DRA_API_VERSION}"
RESOURCE_CLAIMS = f"ResourceClaim.{DRA_API_VERSION}"
DEVICE_CLASSES = f"DeviceClass.{DRA_API_VERSION}"
DEVICE_TAINT_RULES = f"DeviceTaintRule.{DEVICE_TAINT_RULES_API_VERSION}"

RawGroups = dict[str, dict[str, msgspec.Raw]]


class _Envelope(msgspec.Struct, kw_only=True, rename="camel"):
    pass


class CustomizeRequest(_Envelope):
    parent: msgspec.Raw = msgspec.Raw()


class CompositeSyncRequest(_Envelope):
    parent: msgspec.Raw = msgspec.Raw()
    related: RawGroups = {}
    finalizing: bool = False


class DecoratorSyncRequest(_Envelope):
    object: msgspec.Raw = msgspec.Raw()
    attachments: RawGroups | None = None
    related: RawGroups | None = None
    finalizing: bool = False


class Requirement(_Envelope, omit_defaults=True):
    key: str
    operator: str
    values: list[str] | None = None


class LabelSelector(_Envelope, omit_defaults=True):
    match_labels: dict[str, str] | None = None
    match_expressions: list[Requirement] | None = None


class RelatedRule(_Envelope, omit_defaults=True):
    api_version: str
    resource: str
    label_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    namespace: str | None = None
    names: list[str] | None = None


class CustomizeResponse(_Envelope):
    related_resources: list[RelatedRule]


class ClassStatus(_Envelope, omit_defaults=True):
    free: int
    max_free_per_node: int
    conditions: list[Condition]
    device_class: str | None = None  # a DRA class's


class CompositeSyncResponse(_Envelope, omit_defaults=True):
    # `status` replaces the parent's whole status; `{}` clears it. A Raw is the previous status
    # kept verbatim. `children` has no default so it is always sent: missing means "delete all".
    status: ClassStatus | dict[str, Any] | msgspec.Raw
    children: list[Any]
    resync_after_seconds: float | None = None


class DecoratorSyncResponse(_Envelope, omit_defaults=True):
    # `status` has no default so it is always sent as null: null leaves the status alone.
    attachments: list[Any]
    status: None
    resync_after_seconds: float | None = None


class LabelsResponse(_Envelope, omit_defaults=True):
    """A decorator's answer that sets its target's labels (null removes one; a label it does not
    name is left alone) and attaches nothing."""

    labels: dict[str, str | None]
    attachments: list[Any]
    status: None
    resync_after_seconds: float | None = None


_ENCODER = msgspec.json.Encoder()
T = TypeVar("T")


def encode(response: msgspec.Struct) -> bytes:
    return _ENCODER.encode(response)


def decode_envelope(body: bytes, envelope: type[T]) -> T:
    """Decode the envelope only; related objects stay raw until each is decoded on its own."""
    return decode_request(decoder_for(envelope), body, "request envelope")


_GPUCLASS = msgspec.json.Decoder(GPUClass)


class _Addressed(Protocol):
    @property
    def api_version(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def metadata(self) -> Any: ...


A = TypeVar("A", bound=_Addressed)


def _named_object(
    raw: msgspec.Raw, field: str, decoder: msgspec.json.Decoder[A], api_version: str, kind: str
) -> A:
    """A request's parent or target: an object of that kind with a name, or BadRequest."""
    if is_absent(raw):
        raise BadRequest(f"request has no {field}")
    try:
        found = decoded(decoder, raw)
    except Undecodable as error:
        raise BadRequest(f"{field} is not a valid object: {error}") from None
    if (found.api_version, found.kind) != (api_version, kind):
        raise BadRequest(f"{field} is not a {api_version} {kind}")
    if not found.metadata.name:
        raise BadRequest(f"{field} has no metadata.name")
    return found


def decode_gpuclass(raw: msgspec.Raw, field: str) -> GPUClass:
    """The parent (or decorator target): it must be a GPUClass with a name."""
    return _named_object(raw, field, _GPUCLASS, GPUCLASS_API_VERSION, GPUCLASS_KIND)


class DecodedGroup(msgspec.Struct, frozen=True):
    """The objects of one related group that decoded, and the keys of those that did not."""

    objects: list[Any]
    invalid: list[str]


@dataclass(frozen=True)
class RelatedKind:
    """A kind the hooks read as a related object: how rules name it, and its group key."""

    api_version: str
    kind: str
    resource: str
    group_key: str
    type: type
    namespaced: bool = False


RELATED_KINDS = (
    RelatedKind("v1", "Node", "nodes", NODES, Node),
    RelatedKind("v1", "Pod", "pods", PODS, Pod, namespaced=True),
    RelatedKind("v1", "Namespace", "namespaces", NAMESPACES, Namespace),
    RelatedKind("v1", "Secret", "secrets", SECRETS, Secret, namespaced=True),
    RelatedKind(GPUCLASS_API_VERSION, GPUCLASS_KIND, "gpuclasses", GPUCLASSES, GPUClass),
    RelatedKind(
        "helm.toolkit.fluxcd.io/v2", "HelmRelease", "helmreleases", HELMRELEASES, HelmRelease, True
    ),
    RelatedKind(
        INSTANCE_TYPES_API_VERSION,
        "VirtualMachineClusterInstancetype",
        "virtualmachineclusterinstancetypes",
        INSTANCE_TYPES,
        Instancetype,
    ),
    RelatedKind(DRA_API_VERSION, "ResourceSlice", "resourceslices", RESOURCE_SLICES, ResourceSlice),
    RelatedKind(
        DRA_API_VERSION, "ResourceClaim", "resourceclaims", RESOURCE_CLAIMS, ResourceClaim, True
    ),
    RelatedKind(DRA_API_VERSION, "DeviceClass", "deviceclasses", DEVICE_CLASSES, DeviceClass),
    RelatedKind(
        DEVICE_TAINT_RULES_API_VERSION,
        "DeviceTaintRule",
        "devicetaintrules",
        DEVICE_TAINT_RULES,
        DeviceTaintRule,
    ),
)
# The kinds the hooks read, by group key; any other group is skipped unread.
GROUP_KINDS: dict[str, type] = {related.group_key: related.type for related in RELATED_KINDS}


class _TypedGroups(msgspec.Struct):
    nodes: dict[str, Node] | None = msgspec.field(default=None, name=NODES)
    pods: dict[str, Pod] | None = msgspec.field(default=None, name=PODS)
    classes: dict[str, GPUClass] | None = msgspec.field(default=None, name=GPUCLASSES)
    secrets: dict[str, Secret] | None = msgspec.field(default=None, name=SECRETS)
    namespaces: dict[str, Namespace] | None = msgspec.field(default=None, name=NAMESPACES)
    slices: dict[str, ResourceSlice] | None = msgspec.field(default=None, name=RESOURCE_SLICES)
    claims: dict[str, ResourceClaim] | None = msgspec.field(default=None, name=RESOURCE_CLAIMS)
    device_classes: dict[str, DeviceClass] | None = msgspec.field(default=None, name=DEVICE_CLASSES)
    taint_rules: dict[str, DeviceTaintRule] | None = msgspec.field(
        default=None, name=DEVICE_TAINT_RULES
    )

    def as_groups(self) -> dict[str, DecodedGroup]:
        present = {
            NODES: self.nodes,
            PODS: self.pods,
            GPUCLASSES: self.classes,
            SECRETS: self.secrets,
            NAMESPACES: self.namespaces,
            RESOURCE_SLICES: self.slices,
            RESOURCE_CLAIMS: self.claims,
            DEVICE_CLASSES: self.device_classes,
            DEVICE_TAINT_RULES: self.taint_rules,
        }
        return {k: DecodedGroup(list(v.values()), []) for k, v in present.items() if v is not None}


class _TypedCompositeSync(msgspec.Struct):
    parent: msgspec.Raw = msgspec.Raw()
    related: _TypedGroups = msgspec.field(default_factory=_TypedGroups)


class _TypedDecoratorSync(msgspec.Struct):
    object: msgspec.Raw = msgspec.Raw()
    attachments: _TypedGroups | None = None
    related: _TypedGroups = msgspec.field(default_factory=_TypedGroups)


@dataclass(frozen=True)
class CompositeSync:
    """A decoded sync request: the parent still raw, each group present decoded."""

    parent: msgspec.Raw
    related: Mapping[str, DecodedGroup]


@dataclass(frozen=True)
class DecoratorSync:
    object: msgspec.Raw
    attachments: Mapping[str, DecodedGroup] | None
    related: Mapping[str, DecodedGroup]


def _decode_groups(groups: Mapping[str, Mapping[str, msgspec.Raw]]) -> dict[str, DecodedGroup]:
    decoded = {}
    for key, kind in GROUP_KINDS.items():
        group = decode_group(groups, key, kind)
        if group is not None:
            decoded[key] = group
    return decoded


_COMPOSITE = msgspec.json.Decoder(_TypedCompositeSync)
_DECORATOR = msgspec.json.Decoder(_TypedDecoratorSync)


def _typed_pass(decoder: msgspec.json.Decoder[T], body: bytes) -> T | None:
    """One typed pass over the body; None when it does not decode, and the envelope pass that
    follows says whether the body or only some object is at fault."""
    try:
        return decoded(decoder, body)
    except Undecodable:
        return None


def decode_composite_sync(body: bytes) -> CompositeSync:
    """One typed pass over the body, which is what a large request costs. Only when some object
    does not fit its type is the request decoded again, object by object, so that one bad object
    is skipped instead of sinking the request."""
    typed = _typed_pass(_COMPOSITE, body)
    if typed is not None:
        return CompositeSync(typed.parent, typed.related.as_groups())
    raw = decode_envelope(body, CompositeSyncRequest)
    return CompositeSync(raw.parent, _decode_groups(raw.related))


def decode_decorator_sync(body: bytes) -> DecoratorSync:
    """Like decode_composite_sync, for a DecoratorController's sync request."""
    typed = _typed_pass(_DECORATOR, body)
    if typed is not None:
        attachments = typed.attachments.as_groups() if typed.attachments is not None else None
        return DecoratorSync(typed.object, attachments, typed.related.as_groups())
    raw = decode_envelope(body, DecoratorSyncRequest)
    return DecoratorSync(
        raw.object,
        _decode_groups(raw.attachments) if raw.attachments is not None else None,
        _decode_groups(raw.related or {}),
    )


def decode_group(
    groups: Mapping[str, Mapping[str, msgspec.Raw]], key: str, kind: type[T]
) -> DecodedGroup | None:
    """Decode each object of a group on its own, so one bad object does not sink the request.
    None when the group is absent (Metacontroller sends every requested group, even empty)."""
    group = groups.get(key)
    return None if group is None else decode_objects(group, kind)


def decode_objects(group: Mapping[str, msgspec.Raw], kind: type[T]) -> DecodedGroup:
    """Each object of one group on its own: those that decode, and the keys of the others."""
    decoder = decoder_for(kind)
    objects: list[Any] = []
    invalid: list[str] = []
    for name, raw in group.items():
        try:
            objects.append(decoded(decoder, raw))
        except Undecodable:
            invalid.append(name)
    return DecodedGroup(objects, invalid)


class _ReportGroups(msgspec.Struct):
    releases: dict[str, msgspec.Raw] | None = msgspec.field(default=None, name=HELMRELEASES)
    config_maps: dict[str, msgspec.Raw] | None = msgspec.field(default=None, name=CONFIGMAPS)
    namespaces: dict[str, msgspec.Raw] | None = msgspec.field(default=None, name=NAMESPACES)


class _ReportSync(msgspec.Struct):
    object: msgspec.Raw = msgspec.Raw()
    attachments: _ReportGroups | None = None
    related: _ReportGroups = msgspec.field(default_factory=_ReportGroups)


class TargetNamespace(Namespace, frozen=True):
    """A decorator's target Namespace: its name, and whether it is being deleted."""

    api_version: str = ""
    kind: str = ""


_NAMESPACE = msgspec.json.Decoder(TargetNamespace)


def decode_namespace(raw: msgspec.Raw, field: str) -> TargetNamespace:
    """The parent (or decorator target): a Namespace with a name, or BadRequest."""
    return _named_object(raw, field, _NAMESPACE, "v1", "Namespace")


@dataclass(frozen=True)
class ReportSync:
    """A report target's sync request: its namespace, each release still raw (the budget rules
    read each on its own, and mark what does not decode), the ConfigMaps decoded (the reports it
    can see and the class index), the names of the namespaces labelled into its group and those
    of them being deleted; a group is None when the request did not carry it."""

    target: TargetNamespace
    releases: list[msgspec.Raw] | None
    config_maps: DecodedGroup | None
    group: tuple[str, ...] | None
    attached: DecodedGroup | None
    terminating: frozenset[str] = frozenset()


_REPORT = msgspec.json.Decoder(_ReportSync)

REPORT_TARGET_API_VERSION = "rbac.authorization.k8s.io/v1"
REPORT_TARGET_KIND = "ClusterRole"


class _Target(msgspec.Struct, rename="camel"):
    api_version: str = ""
    kind: str = ""
    metadata: NameOnlyMeta = NameOnlyMeta()


_TARGET = msgspec.json.Decoder(_Target)


def check_report_target(raw: msgspec.Raw, field: str) -> str:
    """The class index's target (the release's ClusterRole): its name, or BadRequest for
    anything else."""
    target = _named_object(raw, field, _TARGET, REPORT_TARGET_API_VERSION, REPORT_TARGET_KIND)
    name: str = target.metadata.name
    return name


class _IndexGroups(msgspec.Struct):
    classes: dict[str, msgspec.Raw] | None = msgspec.field(default=None, name=GPUCLASSES)
    instance_types: dict[str, msgspec.Raw] | None = msgspec.field(default=None, name=INSTANCE_TYPES)


class _ClassIndexSync(msgspec.Struct):
    object: msgspec.Raw = msgspec.Raw()
    attachments: dict[str, msgspec.Raw] | None = None
    related: _IndexGroups = msgspec.field(default_factory=_IndexGroups)


_CLASS_INDEX = msgspec.json.Decoder(_ClassIndexSync)


@dataclass(frozen=True)
class ClassIndexSync:
    """The class index's sync request: the GPUClasses decoded and the cluster instance types
    still raw (the budget rules read each on its own), each None when the request did not carry
    them (the attachments are not read: the index is rebuilt whole)."""

    classes: DecodedGroup | None
    instance_types: list[msgspec.Raw] | None


def decode_class_index_sync(body: bytes) -> ClassIndexSync:
    """A sync of the release's ClusterRole, with its attachments, or BadRequest."""
    request = decode_request(_CLASS_INDEX, body, "request envelope")
    check_report_target(request.object, "object")
    if request.attachments is None:
        raise BadRequest("request has no attachments")
    related = request.related
    instance_types = related.instance_types
    return ClassIndexSync(
        _decoded_each(related.classes, GPUClass),
        list(instance_types.values()) if instance_types is not None else None,
    )


def _decoded_each(group: Mapping[str, msgspec.Raw] | None, kind: type) -> DecodedGroup | None:
    return None if group is None else decode_objects(group, kind)


def decode_report_sync(body: bytes) -> ReportSync:
    """One pass over the body, each related object kept as its bytes: one object that does not
    decode never sinks the request."""
    request = decode_request(_REPORT, body, "request envelope")
    target = decode_namespace(request.object, "object")
    if request.attachments is None:
        raise BadRequest("request has no attachments")
    related = request.related
    namespaces = _decoded_each(related.namespaces, Namespace)
    return ReportSync(
        target,
        list(related.releases.values()) if related.releases is not None else None,
        _decoded_each(related.config_maps, ConfigMap),
        tuple(related.namespaces) if related.namespaces is not None else None,
        _decoded_each(request.attachments.config_maps, ConfigMap) or DecodedGroup([], []),
        frozenset(
            n.metadata.name for n in (namespaces.objects if namespaces else ()) if n.terminating
        ),
    )


class _TenantReleases(msgspec.Struct):
    releases: dict[str, msgspec.Raw] | None = msgspec.field(default=None, name=HELMRELEASES)
    namespaces: dict[str, msgspec.Raw] | None = msgspec.field(default=None, name=NAMESPACES)


class _TenantNamespaceSync(msgspec.Struct):
    object: msgspec.Raw = msgspec.Raw()
    related: _TenantReleases = msgspec.field(default_factory=_TenantReleases)


@dataclass(frozen=True)
class TenantNamespaceSync:
    """The tenant namespace labeller's sync request: the namespace's name, the Tenant releases its
    rules select (each still raw) and the Namespaces (decoded each on its own); a group is None
    when the request did not carry it."""

    namespace: str
    releases: list[msgspec.Raw] | None
    namespaces: DecodedGroup | None = None


_TENANT_NAMESPACE = msgspec.json.Decoder(_TenantNamespaceSync)


def decode_tenant_namespace_sync(body: bytes) -> TenantNamespaceSync:
    """The labeller's sync: a Namespace target, or BadRequest."""
    request = decode_request(_TENANT_NAMESPACE, body, "request envelope")
    target = decode_namespace(request.object, "object")
    releases = request.related.releases
    return TenantNamespaceSync(
        target.metadata.name,
        list(releases.values()) if releases is not None else None,
        _decoded_each(request.related.namespaces, Namespace),
    )


class TargetPod(msgspec.Struct, kw_only=True, rename="camel", frozen=True):
    """A resource labeller's target pod: its resources (what the labels say) and its labels."""

    metadata: ObjectMeta = ObjectMeta()
    spec: PodSpec = PodSpec()


class TargetNode(msgspec.Struct, kw_only=True, rename="camel", frozen=True):
    """A resource labeller's target node: what it lists (what the labels say) and its labels."""

    metadata: ObjectMeta = ObjectMeta()
    status: NodeStatus = NodeStatus()


class _LabelledTargetSync(msgspec.Struct):
    object: msgspec.Raw = msgspec.Raw()


_LABELLED_TARGET_SYNC = msgspec.json.Decoder(_LabelledTargetSync)
_LABELLED_TARGETS: dict[str, msgspec.json.Decoder[Any]] = {
    "Pod": msgspec.json.Decoder(TargetPod),
    "Node": msgspec.json.Decoder(TargetNode),
}


def decode_resource_target_sync(body: bytes) -> TargetPod | TargetNode:
    """The resource labeller's sync: a Pod or a Node target with a name, or BadRequest (it
    relates nothing)."""
    request = decode_request(_LABELLED_TARGET_SYNC, body, "request envelope")
    if is_absent(request.object):
        raise BadRequest("request has no object")
    try:
        target = decoded(_TARGET, request.object)
    except Undecodable as error:
        raise BadRequest(f"object is not a valid object: {error}") from None
    decoder = _LABELLED_TARGETS.get(target.kind) if target.api_version == "v1" else None
    if decoder is None:
        raise BadRequest("object is not a v1 Pod or Node")
    if not target.metadata.name:
        raise BadRequest("object has no metadata.name")
    try:
        found: TargetPod | TargetNode = decoded(decoder, request.object)
    except Undecodable as error:
        raise BadRequest(f"object is not a valid {target.kind}: {error}") from None
    return found
