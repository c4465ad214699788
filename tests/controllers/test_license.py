import json
from typing import Any

import msgspec
import pytest

from hooks.controllers import license
from hooks.settings import Settings
from hooks.wire.metacontroller import (
    BadRequest,
    CustomizeRequest,
    decode_decorator_sync,
    decode_envelope,
    encode,
)
from tests.builders import (
    SOURCE_NAME,
    SOURCE_NS,
    gpuclass,
    license_sync_request,
    licensed_class,
    managed_copy,
    namespace,
    orphaned_copy,
    secret,
    source_secret,
)


def run(request: dict[str, Any], settings: Settings | None = None) -> dict[str, Any]:
    decoded = decode_decorator_sync(json.dumps(request).encode())
    return msgspec.json.decode(encode(license.sync(decoded, settings or Settings()).response))


def as_observed(
    response: dict[str, Any], class_name: str, resource_version: str
) -> list[dict[str, Any]]:
    """What Metacontroller would show after applying the response: server fields added."""
    observed = []
    for copy in response["attachments"]:
        applied = json.loads(json.dumps(copy))
        meta = applied["metadata"]
        meta.update(
            uid=f"uid-{meta['namespace']}",
            resourceVersion=resource_version,
            creationTimestamp="2026-03-01T00:00:00Z",
            managedFields=[{"manager": "mc"}],
            ownerReferences=[
                {
                    "apiVersion": "cozystack.io/v1alpha1",
                    "kind": "GPUClass",
                    "name": class_name,
                    "uid": f"uid-{class_name}",
                    "controller": True,
                }
            ],
        )
        meta["annotations"]["metacontroller.k8s.io/decorator-controller"] = "gpuclass-license"
        meta["annotations"]["metacontroller.k8s.io/last-applied-configuration"] = json.dumps(copy)
        observed.append(applied)
    return observed


def test_sync_answers_exactly_attachments_and_null_status() -> None:
    response = run(
        license_sync_request(
            licensed_class(), secrets=[source_secret()], namespaces=[namespace("tenant-a")]
        )
    )
    assert list(response) == ["attachments", "status"]
    assert response["status"] is None
    assert [a["metadata"]["namespace"] for a in response["attachments"]] == ["tenant-a"]


def test_response_fed_back_as_observed_copies_yields_the_same_response() -> None:
    request = license_sync_request(
        licensed_class(),
        secrets=[source_secret()],
        namespaces=[namespace("tenant-a"), namespace("tenant-b")],
    )
    first = run(request)
    for version in ("11", "12"):
        observed = as_observed(first, "l40s", version)
        fed = license_sync_request(
            licensed_class(),
            secrets=[source_secret(), *observed],
            namespaces=[namespace("tenant-a"), namespace("tenant-b")],
            attachments=observed,
        )
        assert run(fed) == first


def test_kept_copies_are_stable_while_the_source_is_missing() -> None:
    observed = [managed_copy("l40s", "tenant-a")]
    request = license_sync_request(
        licensed_class(), secrets=observed, namespaces=[namespace("tenant-a")], attachments=observed
    )
    first = run(request)
    [kept] = first["attachments"]
    assert (kept["metadata"]["namespace"], kept["data"]) == ("tenant-a", observed[0]["data"])
    refed = as_observed(first, "l40s", "99")
    again = license_sync_request(
        licensed_class(), secrets=refed, namespaces=[namespace("tenant-a")], attachments=refed
    )
    assert run(again) == first


def test_attachment_missing_from_related_is_still_recognised_as_managed() -> None:
    attached = [managed_copy("l40s", "tenant-a")]
    request = license_sync_request(
        licensed_class(), secrets=[], namespaces=[namespace("tenant-a")], attachments=attached
    )
    [kept] = run(request)["attachments"]
    assert (kept["metadata"]["namespace"], kept["data"]) == ("tenant-a", attached[0]["data"])


def test_unlicensed_class_returns_no_attachments() -> None:
    attached = [managed_copy("l40s", "tenant-a")]
    request = license_sync_request(
        gpuclass("l40s"),
        secrets=[source_secret()],
        namespaces=[namespace("tenant-a")],
        attachments=attached,
    )
    assert run(request) == {"attachments": [], "status": None}


def test_gpu_features_off_returns_no_attachments() -> None:
    attached = [managed_copy("l40s", "tenant-a")]
    request = license_sync_request(
        licensed_class(),
        secrets=[source_secret()],
        namespaces=[namespace("tenant-a")],
        attachments=attached,
    )
    assert run(request, Settings(enabled=False)) == {"attachments": [], "status": None}


def test_missing_related_group_keeps_every_managed_copy_and_asks_for_resync() -> None:
    attached = [managed_copy("l40s", "tenant-a"), managed_copy("l40s", "tenant-b")]
    request = license_sync_request(
        licensed_class(), secrets=[source_secret()], attachments=attached
    )
    response = run(request)
    assert [a["metadata"]["namespace"] for a in response["attachments"]] == ["tenant-a", "tenant-b"]
    assert response["resyncAfterSeconds"] == license.STALE_RULES_RETRY_SECONDS


def test_invalid_spec_keeps_every_managed_copy() -> None:
    attached = [managed_copy("l40s", "tenant-a")]
    broken = licensed_class(spec={"resourceName": "nvidia.com/X", "license": {"featureType": 3}})
    response = run(license_sync_request(broken, attachments=attached))
    assert [a["metadata"]["namespace"] for a in response["attachments"]] == ["tenant-a"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"object": None, "attachments": {}}, "no object"),
        ({"object": gpuclass("a")}, "no attachments"),
        (
            {"object": gpuclass("a"), "attachments": {"Secret.v1": {"a/x": {"data": 5}}}},
            "attachments do not decode",
        ),
    ],
)
def test_unusable_requests_are_refused(body: dict[str, Any], message: str) -> None:
    decoded = decode_decorator_sync(json.dumps(body).encode())
    with pytest.raises(BadRequest, match=message):
        license.sync(decoded, Settings())


def customize(parent: dict[str, Any], settings: Settings | None = None) -> list[dict[str, Any]]:
    request = decode_envelope(json.dumps({"parent": parent}).encode(), CustomizeRequest)
    return msgspec.json.decode(encode(license.customize(request, settings or Settings())))[
        "relatedResources"
    ]


def test_customize_asks_for_source_entitled_namespaces_and_same_named_secrets() -> None:
    assert customize(licensed_class()) == [
        {"apiVersion": "v1", "resource": "secrets", "namespace": SOURCE_NS, "names": [SOURCE_NAME]},
        {
            "apiVersion": "v1",
            "resource": "namespaces",
            "labelSelector": {"matchLabels": {"namespace.cozystack.io/vgpu": "true"}},
        },
        {"apiVersion": "v1", "resource": "secrets", "names": ["gpuclass-l40s-license"]},
    ]


def test_customize_uses_the_configured_label_and_skips_a_disallowed_source() -> None:
    parent = licensed_class(license={"secretRef": {"name": "tok", "namespace": "tenant-x"}})
    rules = customize(parent, Settings(vgpu_namespace_label="example.com/gpu"))
    assert [r["resource"] for r in rules] == ["namespaces", "secrets"]
    assert rules[0]["labelSelector"] == {"matchLabels": {"example.com/gpu": "true"}}


def test_customize_for_unlicensed_invalid_or_disabled_asks_for_nothing() -> None:
    assert customize(gpuclass("plain")) == []
    assert customize(licensed_class(spec={"license": {}})) == []
    assert customize(licensed_class(), Settings(enabled=False)) == []


def test_secret_in_source_namespace_with_another_name_is_not_the_source() -> None:
    impostor = secret("other", SOURCE_NS, data={"client_configuration_token.tok": b"x"})
    response = run(
        license_sync_request(licensed_class(), secrets=[impostor], namespaces=[namespace("a")])
    )
    assert response["attachments"] == []


# --- what the route logs and exports: the outcome beside the response ---------------------------


def outcome_of(request: dict[str, Any], settings: Settings | None = None) -> license.LicenseOutcome:
    return license.sync(decode_decorator_sync(json.dumps(request).encode()), settings or Settings())


ENTITLED = [namespace("tenant-a"), namespace("tenant-b")]


def test_outcome_of_each_early_answer_names_the_class() -> None:
    copies = [managed_copy("l40s", "tenant-a")]
    request = license_sync_request(
        licensed_class(), secrets=[source_secret()], namespaces=ENTITLED, attachments=copies
    )
    disabled = outcome_of(request, Settings(enabled=False))
    assert (disabled.class_name, disabled.outcome, disabled.counts) == ("l40s", "disabled", {})
    invalid = licensed_class()
    invalid["spec"]["resourceName"] = "no-slash"
    edited = outcome_of(
        license_sync_request(invalid, secrets=[], namespaces=ENTITLED, attachments=copies)
    )
    assert (edited.class_name, edited.outcome, edited.counts) == (
        "l40s",
        "invalid_spec",
        {"kept": 1},
    )
    unlicensed = outcome_of(license_sync_request(gpuclass("plain"), secrets=[], namespaces=[]))
    assert (unlicensed.class_name, unlicensed.outcome) == ("plain", "unlicensed")
    stale = outcome_of(
        license_sync_request(licensed_class(), secrets=None, namespaces=None, attachments=copies)
    )
    assert (stale.class_name, stale.outcome, stale.counts) == ("l40s", "stale_related", {"kept": 1})


def test_outcome_of_a_plan_counts_copies_new_copies_and_conflicts() -> None:
    copies = [managed_copy("l40s", "tenant-a")]
    foreign = secret("gpuclass-l40s-license", "tenant-b", data={"x": b"y"})
    orphan = orphaned_copy("l40s", "elsewhere")
    request = license_sync_request(
        licensed_class(),
        secrets=[source_secret(), foreign, orphan, *copies],
        namespaces=[*ENTITLED, namespace("tenant-c")],
        attachments=copies,
    )
    outcome = outcome_of(request)
    assert (outcome.class_name, outcome.outcome) == ("l40s", "ok")
    # a usable source writes every copy afresh, the kept one in tenant-a included
    assert outcome.counts == {"copies": 2, "new_copies": 2, "conflicts": 2}
    missing = outcome_of(license_sync_request(licensed_class(), secrets=[], namespaces=ENTITLED))
    assert missing.outcome == "source_unusable"


def test_foreign_secrets_in_several_namespaces_are_each_a_conflict() -> None:
    request = license_sync_request(
        licensed_class(),
        secrets=[
            source_secret(),
            secret("gpuclass-l40s-license", "tenant-a", data={"x": b"y"}),
            secret("gpuclass-l40s-license", "tenant-b", data={"x": b"y"}),
        ],
        namespaces=ENTITLED,
    )
    outcome = outcome_of(request)
    assert outcome.plan is not None and sorted(outcome.plan.foreign) == ["tenant-a", "tenant-b"]
    assert outcome.counts["conflicts"] == 2 and outcome.counts["copies"] == 0


def test_objects_that_do_not_decode_are_named_with_their_kind() -> None:
    request = license_sync_request(licensed_class(), secrets=[source_secret()], namespaces=ENTITLED)
    request["related"]["Secret.v1"]["tenant-x/odd"] = {"data": []}
    request["related"]["Namespace.v1"]["odd"] = {"metadata": []}
    invalid = outcome_of(request).invalid
    assert [(o.kind, o.name, o.reason) for o in invalid] == [
        ("Secret", "tenant-x/odd", "does not decode"),
        ("Namespace", "odd", "does not decode"),
    ]


def test_bad_requests_say_what_is_missing() -> None:
    request = license_sync_request(licensed_class(), secrets=[], namespaces=[])
    del request["attachments"]
    with pytest.raises(BadRequest, match=r"^request has no attachments$"):
        outcome_of(request)
    nameless = CustomizeRequest(parent=msgspec.Raw(json.dumps(gpuclass("")).encode()))
    with pytest.raises(BadRequest, match=r"^parent has no metadata\.name$"):
        license.customize(nameless, Settings())
