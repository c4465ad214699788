import base64
import hashlib
from typing import Any

import msgspec

from hooks.rules.invalid import InvalidObject
from hooks.rules.license import LicensePlan, is_managed_copy, plan_license
from hooks.wire.gpuclass import License
from hooks.wire.kube import Namespace, Secret
from tests.builders import (
    SOURCE_NS,
    TOKEN,
    TOKEN_KEY,
    as_wire,
    managed_copy,
    namespace,
    secret,
    source_secret,
)

ALLOWED = (SOURCE_NS,)


def plan(
    *,
    source: dict[str, Any] | None = None,
    namespaces: list[dict[str, Any]] = (),  # type: ignore[assignment]
    same_named: list[dict[str, Any]] = (),  # type: ignore[assignment]
    license: dict[str, Any] | None = None,
    undecodable_namespaces: tuple[str, ...] = (),
    undecodable_same_named: tuple[str, ...] = (),
    class_name: str = "l40s",
) -> LicensePlan:
    return plan_license(
        class_name=class_name,
        class_uid=f"uid-{class_name}",
        license=License.model_validate(license or {"secretRef": {"name": "nvidia-license"}}),
        allowed_namespaces=ALLOWED,
        entitlement_label="namespace.cozystack.io/vgpu",
        source=as_wire(source, Secret) if source else None,
        namespaces=[as_wire(n, Namespace) for n in namespaces],
        undecodable_namespaces=undecodable_namespaces,
        same_named=[as_wire(s, Secret) for s in same_named],
        undecodable_same_named=undecodable_same_named,
    )


def copies(result: LicensePlan) -> dict[str, dict[str, Any]]:
    return {c.metadata.namespace: msgspec.to_builtins(c) for c in result.copies}


def test_one_copy_per_entitled_namespace_with_the_exact_layout() -> None:
    result = plan(source=source_secret(), namespaces=[namespace("tenant-a"), namespace("tenant-b")])
    assert sorted(copies(result)) == ["tenant-a", "tenant-b"]
    assert copies(result)["tenant-a"] == {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": "gpuclass-l40s-license",
            "namespace": "tenant-a",
            "labels": {
                "gpuclass.cozystack.io/class": "l40s",
                "gpuclass.cozystack.io/license-copy": "true",
            },
            "annotations": {
                "gpuclass.cozystack.io/source": "cozy-gpu-operator/nvidia-license",
                "gpuclass.cozystack.io/token-sha256": hashlib.sha256(TOKEN).hexdigest(),
            },
        },
        "data": {
            TOKEN_KEY: base64.b64encode(TOKEN).decode(),
            "gridd.conf": base64.b64encode(b"FeatureType=1\n").decode(),
        },
    }
    assert result.source.usable and result.source.reason == "SecretFound"


def test_token_bytes_are_copied_verbatim_and_no_other_source_key() -> None:
    raw = b"\x00binary\xfftoken\n"
    [copy] = plan(source=source_secret(raw), namespaces=[namespace("t")]).copies
    assert base64.b64decode(copy.data[TOKEN_KEY]) == raw
    assert set(copy.data) == {TOKEN_KEY, "gridd.conf"}


def test_gridd_conf_carries_the_feature_type() -> None:
    license = {"secretRef": {"name": "nvidia-license"}, "featureType": 4}
    [copy] = plan(source=source_secret(), namespaces=[namespace("t")], license=license).copies
    assert base64.b64decode(copy.data["gridd.conf"]) == b"FeatureType=4\n"


def test_source_namespace_that_is_entitled_gets_a_copy_like_any_other() -> None:
    result = plan(source=source_secret(), namespaces=[namespace(SOURCE_NS)])
    assert list(copies(result)) == [SOURCE_NS]


def test_namespace_without_the_label_value_true_gets_no_copy() -> None:
    unlabelled = namespace("t")
    unlabelled["metadata"]["labels"]["namespace.cozystack.io/vgpu"] = "yes"
    assert (
        plan(source=source_secret(), namespaces=[unlabelled, namespace("u", entitled=False)]).copies
        == ()
    )


def test_terminating_namespace_gets_no_new_copy() -> None:
    result = plan(
        source=source_secret(),
        namespaces=[namespace("a", terminating=True), namespace("b", phase="Terminating")],
    )
    assert result.copies == ()
    assert result.terminating == ("a", "b")


def test_terminating_namespace_keeps_the_copy_it_has() -> None:
    result = plan(
        source=source_secret(),
        namespaces=[namespace("a", terminating=True)],
        same_named=[managed_copy("l40s", "a")],
    )
    assert list(copies(result)) == ["a"]


def test_foreign_secret_blocks_the_copy_and_is_reported() -> None:
    tenant_own = secret("gpuclass-l40s-license", "tenant-a", data={"x": b"mine"})
    result = plan(
        source=source_secret(),
        namespaces=[namespace("tenant-a"), namespace("tenant-b")],
        same_named=[tenant_own],
    )
    assert list(copies(result)) == ["tenant-b"]
    assert result.foreign == ("tenant-a",)


def test_copy_owned_by_another_class_uid_is_foreign() -> None:
    other = managed_copy("l40s", "tenant-a")
    other["metadata"]["ownerReferences"][0]["uid"] = "uid-of-a-deleted-class"
    other["metadata"]["labels"] = {}
    assert plan(
        source=source_secret(), namespaces=[namespace("tenant-a")], same_named=[other]
    ).foreign == ("tenant-a",)


def test_foreign_secret_outside_entitled_namespaces_is_not_reported() -> None:
    tenant_own = secret("gpuclass-l40s-license", "elsewhere")
    assert (
        plan(source=source_secret(), namespaces=[namespace("a")], same_named=[tenant_own]).foreign
        == ()
    )


def test_copy_with_our_labels_but_not_managed_is_unmanaged_and_never_overwritten() -> None:
    orphan = managed_copy("l40s", "tenant-a")
    del orphan["metadata"]["ownerReferences"]
    result = plan(source=source_secret(), namespaces=[namespace("tenant-a")], same_named=[orphan])
    assert result.copies == ()
    assert (result.foreign, result.unmanaged) == ((), ("tenant-a",))


def test_managed_copy_needs_owner_uid_and_decorator_annotation() -> None:
    copy = as_wire(managed_copy("l40s", "a"), Secret)
    assert is_managed_copy(copy, "uid-l40s")
    assert not is_managed_copy(copy, "uid-other")
    no_annotation = managed_copy("l40s", "a")
    del no_annotation["metadata"]["annotations"]["metacontroller.k8s.io/decorator-controller"]
    assert not is_managed_copy(as_wire(no_annotation, Secret), "uid-l40s")
    not_controller = managed_copy("l40s", "a")
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    assert not is_managed_copy(as_wire(not_controller, Secret), "uid-l40s")


def test_source_missing_keeps_managed_copies_in_entitled_namespaces_and_adds_none() -> None:
    result = plan(
        source=None,
        namespaces=[namespace("a"), namespace("b")],
        same_named=[managed_copy("l40s", "a", b"old-token")],
    )
    assert (result.source.usable, result.source.reason) == (False, "SecretNotFound")
    assert list(copies(result)) == ["a"]
    assert base64.b64decode(result.copies[0].data[TOKEN_KEY]) == b"old-token"


def test_token_absent_empty_or_whitespace_is_token_missing() -> None:
    for source in (
        secret("nvidia-license", SOURCE_NS, data={"other": b"x"}),
        source_secret(b""),
        source_secret(b" \n\t"),
    ):
        result = plan(
            source=source, namespaces=[namespace("a")], same_named=[managed_copy("l40s", "a")]
        )
        assert result.source.reason == "TokenMissing"
        assert len(result.copies) == 1


def test_source_namespace_outside_the_allowed_list_is_not_allowed() -> None:
    license = {"secretRef": {"name": "nvidia-license", "namespace": "tenant-evil"}}
    foreign_source = secret("nvidia-license", "tenant-evil", data={TOKEN_KEY: b"stolen"})
    result = plan(source=foreign_source, namespaces=[namespace("a")], license=license)
    assert result.source.reason == "NamespaceNotAllowed"
    assert result.copies == ()


def test_kept_copy_is_rebuilt_not_echoed() -> None:
    [kept] = plan(
        source=None, namespaces=[namespace("a")], same_named=[managed_copy("l40s", "a")]
    ).copies
    built = msgspec.to_builtins(kept)
    assert set(built) == {"apiVersion", "kind", "type", "metadata", "data"}
    assert set(built["metadata"]) == {"name", "namespace", "labels", "annotations"}
    assert not any(k.startswith("metacontroller.k8s.io/") for k in built["metadata"]["annotations"])
    assert set(built["metadata"]["annotations"]) == {
        "gpuclass.cozystack.io/source",
        "gpuclass.cozystack.io/token-sha256",
    }


def test_namespace_that_lost_the_label_loses_its_copy() -> None:
    result = plan(
        source=source_secret(), namespaces=[namespace("a")], same_named=[managed_copy("l40s", "b")]
    )
    assert list(copies(result)) == ["a"]


def test_token_rotation_reaches_copies_with_a_new_digest() -> None:
    old = plan(source=source_secret(b"token-1"), namespaces=[namespace("a")]).copies[0]
    new = plan(
        source=source_secret(b"token-2"),
        namespaces=[namespace("a")],
        same_named=[managed_copy("l40s", "a", b"token-1")],
    ).copies[0]
    assert base64.b64decode(new.data[TOKEN_KEY]) == b"token-2"
    digest = "gpuclass.cozystack.io/token-sha256"
    assert new.metadata.annotations[digest] == hashlib.sha256(b"token-2").hexdigest()
    assert new.metadata.annotations[digest] != old.metadata.annotations[digest]


def test_undecodable_namespace_keeps_its_managed_copy() -> None:
    result = plan(
        source=source_secret(),
        namespaces=[],
        undecodable_namespaces=("a",),
        same_named=[managed_copy("l40s", "a")],
    )
    assert list(copies(result)) == ["a"]


def test_undecodable_same_named_secret_is_treated_as_foreign() -> None:
    result = plan(
        source=source_secret(),
        namespaces=[namespace("a")],
        undecodable_same_named=("a/gpuclass-l40s-license",),
    )
    assert (result.copies, result.foreign) == ((), ("a",))


def test_invalid_copy_name_is_never_emitted() -> None:
    result = plan(source=source_secret(), namespaces=[namespace("a")], class_name="Bad_Name")
    assert result.copies == ()
    assert [o.reason for o in result.invalid] == ["copy name would be invalid"]


# --- what the conditions and logs say: every state, word for word ------------------------------


def test_source_states_word_for_word() -> None:
    from hooks.rules.license import source_state

    def state(source: dict[str, Any] | None, **ref: str) -> tuple[bool, str, str]:
        license = License.model_validate({"secretRef": {"name": "nvidia-license", **ref}})
        result = source_state(
            license, (SOURCE_NS, "cozy-other"), as_wire(source, Secret) if source else None
        )
        return result.usable, result.reason, result.message

    assert state(None, namespace="tenant-a") == (
        False,
        "NamespaceNotAllowed",
        "license Secret tenant-a/nvidia-license is outside the allowed namespaces "
        "(cozy-gpu-operator, cozy-other)",
    )
    assert state(None) == (
        False,
        "SecretNotFound",
        "license Secret cozy-gpu-operator/nvidia-license does not exist",
    )
    empty = source_secret(token=b" ")
    assert state(empty) == (
        False,
        "TokenMissing",
        "license Secret cozy-gpu-operator/nvidia-license has no usable token under key "
        + TOKEN_KEY,
    )
    assert state(source_secret()) == (
        True,
        "SecretFound",
        "license Secret cozy-gpu-operator/nvidia-license holds a token",
    )


def test_a_token_that_is_not_strict_base64_is_missing() -> None:
    # Lenient decoding would drop the "!" and read a token that is not what the hoster wrote.
    source = source_secret()
    source["data"][TOKEN_KEY] = "dG9r!ZW4="
    result = plan(source=source, namespaces=[namespace("tenant-a")])
    assert (result.source.usable, result.source.reason) == (False, "TokenMissing")


def test_a_class_whose_copy_name_would_be_invalid_gets_nothing_and_says_why() -> None:
    name = "x" * 64  # longer than a label value may be
    result = plan(source=source_secret(), namespaces=[namespace("tenant-a")], class_name=name)
    assert result == LicensePlan(
        result.source,
        (),
        0,
        (),
        (),
        (),
        (InvalidObject("Secret", f"gpuclass-{name}-license", "copy name would be invalid"),),
    )
    assert result.source.usable


def test_namespaces_not_entitled_are_passed_over_not_the_end_of_the_list() -> None:
    result = plan(
        source=source_secret(),
        namespaces=[
            namespace("elsewhere", entitled=False),
            namespace("tenant-a"),
            namespace("tenant-b"),
        ],
    )
    assert (sorted(copies(result)), result.new_copies) == (["tenant-a", "tenant-b"], 2)


def test_a_namespace_with_an_invalid_name_is_named_and_skipped() -> None:
    result = plan(source=source_secret(), namespaces=[namespace("UPPER"), namespace("tenant-a")])
    assert sorted(copies(result)) == ["tenant-a"]
    assert result.invalid == (InvalidObject("Namespace", "UPPER", "invalid name"),)


def test_a_kept_copy_without_a_type_is_rebuilt_opaque() -> None:
    from hooks.rules.license import rebuilt_copy

    kept = managed_copy("l40s", "tenant-a")
    kept.pop("type", None)
    assert rebuilt_copy(as_wire(kept, Secret)).type == "Opaque"
    kept["type"] = "example.com/kept"
    assert rebuilt_copy(as_wire(kept, Secret)).type == "example.com/kept"
