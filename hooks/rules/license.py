"""The license copy plan: which namespaces get a copy of a licensed class's token, and why not.

One pure function serves both hooks: the license hook emits `plan.copies`, the status hook
reports `plan.source` and the conflicts, so the status always describes what the copier does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgspec

from hooks.rules.invalid import InvalidObject
from hooks.wire.gpuclass import GRIDD_KEY, License
from hooks.wire.kube import Namespace, Secret
from hooks.wire.names import is_dns_label, is_dns_subdomain, is_label_value, namespaced_key

CLASS_LABEL = "gpuclass.cozystack.io/class"
COPY_LABEL = "gpuclass.cozystack.io/license-copy"
SOURCE_ANNOTATION = "gpuclass.cozystack.io/source"
DIGEST_ANNOTATION = "gpuclass.cozystack.io/token-sha256"
# Metacontroller marks what a DecoratorController attached with this annotation, whose value is
# the controller's name. A constant: templating it would orphan every copy on a rename.
DECORATOR_ANNOTATION = "metacontroller.k8s.io/decorator-controller"
DECORATOR_NAME = "gpuclass-license"

SECRET_FOUND = "SecretFound"
SECRET_NOT_FOUND = "SecretNotFound"
TOKEN_MISSING = "TokenMissing"
NAMESPACE_NOT_ALLOWED = "NamespaceNotAllowed"

_OUR_LABELS = (CLASS_LABEL, COPY_LABEL)
_OUR_ANNOTATIONS = (SOURCE_ANNOTATION, DIGEST_ANNOTATION)


def copy_name(class_name: str) -> str:
    return f"gpuclass-{class_name}-license"


def source_location(license: License, allowed_namespaces: tuple[str, ...]) -> tuple[str, str]:
    """(namespace, name) of the source Secret; the first allowed namespace is the default."""
    return (license.secret_ref.namespace or allowed_namespaces[0], license.secret_ref.name)


class CopyMetadata(msgspec.Struct, kw_only=True):
    name: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]


class SecretCopy(msgspec.Struct, kw_only=True, rename="camel"):
    """A desired attachment: exactly the fields we own, never a server-written one (an echoed
    uid or resourceVersion would change the last-applied annotation on every pass)."""

    api_version: str = "v1"
    kind: str = "Secret"
    type: str = "Opaque"
    metadata: CopyMetadata
    data: dict[str, str]


@dataclass(frozen=True)
class SourceState:
    usable: bool
    reason: str
    message: str


@dataclass(frozen=True)
class LicensePlan:
    source: SourceState
    copies: tuple[SecretCopy, ...]
    new_copies: int  # copies written from the source (the rest are kept as observed)
    foreign: tuple[str, ...]  # namespaces holding a Secret of the copy's name that is not ours
    unmanaged: tuple[str, ...]  # namespaces holding a copy with our labels that is not managed
    terminating: tuple[str, ...]  # entitled namespaces that get no new copy
    invalid: tuple[InvalidObject, ...] = ()


def is_managed_copy(secret: Secret, class_uid: str) -> bool:
    """Metacontroller's own rule for a decorator's attachment: a controller owner reference to the
    class and the decorator annotation. Name and labels alone prove nothing."""
    owned = any(ref.controller and ref.uid == class_uid for ref in secret.metadata.owner_references)
    return owned and secret.metadata.annotations.get(DECORATOR_ANNOTATION) == DECORATOR_NAME


def _has_our_labels(secret: Secret) -> bool:
    return secret.metadata.labels.get(COPY_LABEL) == "true"


def is_entitled(namespace: Namespace, label: str) -> bool:
    return namespace.metadata.labels.get(label) == "true"


def _decoded_token(value: str) -> bytes | None:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def source_state(
    license: License, allowed_namespaces: tuple[str, ...], source: Secret | None
) -> SourceState:
    namespace, name = source_location(license, allowed_namespaces)
    where = f"{namespace}/{name}"
    if namespace not in allowed_namespaces:
        return SourceState(
            False,
            NAMESPACE_NOT_ALLOWED,
            f"license Secret {where} is outside the allowed namespaces "
            f"({', '.join(allowed_namespaces)})",
        )
    if source is None:
        return SourceState(False, SECRET_NOT_FOUND, f"license Secret {where} does not exist")
    key = license.secret_ref.key
    token = _decoded_token(source.data[key]) if key in source.data else None
    if token is None or not token.strip():
        return SourceState(
            False, TOKEN_MISSING, f"license Secret {where} has no usable token under key {key}"
        )
    return SourceState(True, SECRET_FOUND, f"license Secret {where} holds a token")


def _fresh_copy(
    class_name: str, namespace: str, license: License, source: Secret, where: str
) -> SecretCopy:
    token_b64 = source.data[license.secret_ref.key]
    token = _decoded_token(token_b64) or b""
    gridd = f"FeatureType={license.feature_type}\n".encode()
    return SecretCopy(
        metadata=CopyMetadata(
            name=copy_name(class_name),
            namespace=namespace,
            labels={CLASS_LABEL: class_name, COPY_LABEL: "true"},
            annotations={
                SOURCE_ANNOTATION: where,
                DIGEST_ANNOTATION: hashlib.sha256(token).hexdigest(),
            },
        ),
        # The source's base64 value unchanged: tokens may be binary and end in a newline.
        data={license.secret_ref.key: token_b64, GRIDD_KEY: base64.b64encode(gridd).decode()},
    )


def rebuilt_copy(observed: Secret) -> SecretCopy:
    """A kept copy rebuilt from the fields we own, its data verbatim; never echoed."""
    metadata = observed.metadata
    return SecretCopy(
        type=observed.type or "Opaque",
        metadata=CopyMetadata(
            name=metadata.name,
            namespace=metadata.namespace,
            labels={k: metadata.labels[k] for k in _OUR_LABELS if k in metadata.labels},
            annotations={
                k: metadata.annotations[k] for k in _OUR_ANNOTATIONS if k in metadata.annotations
            },
        ),
        data=dict(observed.data),
    )


def emittable(class_name: str) -> bool:
    """Class names are DNS labels of at most 63 characters, so this holds; the hook still checks,
    because it must never hand Metacontroller an object the API server will refuse."""
    name = copy_name(class_name)
    return is_dns_subdomain(name) and is_label_value(class_name)


def plan_license(
    *,
    class_name: str,
    class_uid: str,
    license: License,
    allowed_namespaces: tuple[str, ...],
    entitlement_label: str,
    source: Secret | None,
    namespaces: Iterable[Namespace],
    undecodable_namespaces: Iterable[str],
    same_named: Iterable[Secret],
    undecodable_same_named: Iterable[str],
) -> LicensePlan:
    """Copies for a licensed class.

    - Source usable: a fresh copy in every entitled, non-terminating namespace without a foreign
      Secret of the copy's name (terminating ones keep a copy they already have).
    - Source unusable: managed copies in still-entitled namespaces are kept, rebuilt; no new ones.
    - Managed copies elsewhere (label removed) are not returned, so Metacontroller deletes them.
    - A Namespace that did not decode keeps its managed copy; a same-named Secret that did not
      decode is treated as foreign (it may be a tenant's).
    """
    state = source_state(license, allowed_namespaces, source)
    where = namespaced_key(*source_location(license, allowed_namespaces))
    if not emittable(class_name):
        refused = InvalidObject("Secret", copy_name(class_name), "copy name would be invalid")
        return LicensePlan(state, (), 0, (), (), (), (refused,))

    managed: dict[str, Secret] = {}
    foreign: set[str] = set(_namespace_of(key) for key in undecodable_same_named)
    unmanaged: set[str] = set()
    for secret in same_named:
        holder = secret.metadata.namespace
        if is_managed_copy(secret, class_uid):
            managed[holder] = secret
        elif _has_our_labels(secret):
            unmanaged.add(holder)
        else:
            foreign.add(holder)

    copies: list[SecretCopy] = []
    terminating: list[str] = []
    invalid: list[InvalidObject] = []
    new_copies = 0
    entitled = []
    for candidate in namespaces:
        if not is_entitled(candidate, entitlement_label):
            continue
        if not is_dns_label(candidate.metadata.name):
            # The API server would refuse a copy there: skip it rather than fail the whole apply.
            invalid.append(InvalidObject("Namespace", candidate.metadata.name, "invalid name"))
            continue
        entitled.append(candidate)
    entitled.sort(key=lambda n: n.metadata.name)
    # A tenant's Secret of that name outside the entitled namespaces is none of our business;
    # an unmanaged copy anywhere still holds a token, so it is always reported.
    foreign &= {n.metadata.name for n in entitled}
    for namespace in entitled:
        name = namespace.metadata.name
        if name in foreign or name in unmanaged:
            continue
        kept = managed.get(name)
        if namespace.terminating:
            terminating.append(name)
            if kept is not None:
                copies.append(rebuilt_copy(kept))
        elif state.usable and source is not None:
            copies.append(_fresh_copy(class_name, name, license, source, where))
            new_copies += 1
        elif kept is not None:
            copies.append(rebuilt_copy(kept))
    for name in sorted(set(undecodable_namespaces)):
        if name in managed:
            copies.append(rebuilt_copy(managed[name]))
    return LicensePlan(
        source=state,
        copies=tuple(copies),
        new_copies=new_copies,
        foreign=tuple(sorted(foreign)),
        unmanaged=tuple(sorted(unmanaged - foreign)),
        terminating=tuple(terminating),
        invalid=tuple(invalid),
    )


def _namespace_of(key: str) -> str:
    return key.partition("/")[0]


def keep_all(observed: Mapping[str, Secret]) -> tuple[SecretCopy, ...]:
    """Every managed copy as it is: the answer when the plan cannot be computed safely."""
    return tuple(rebuilt_copy(observed[key]) for key in sorted(observed))
