"""Request decoding: the one typed pass and the per-object fallback agree."""

from __future__ import annotations

import json
from unittest import mock

import msgspec
import pytest

from hooks.wire.admission import decode_review
from hooks.wire.metacontroller import (
    GPUCLASSES,
    NODES,
    PODS,
    CompositeSyncRequest,
    _decode_groups,
    decode_composite_sync,
    decode_decorator_sync,
    decode_envelope,
)
from hooks.wire.names import is_dns_label, is_label_value
from hooks.wire.problems import BadRequest, Undecodable, decoded, decoder_for
from tests.builders import (
    gpuclass,
    license_sync_request,
    licensed_class,
    managed_copy,
    namespace,
    node,
    pod,
    status_sync_request,
)


def test_one_typed_pass_equals_object_by_object_decoding() -> None:
    body = json.dumps(
        status_sync_request(gpuclass("a"), nodes=[node("n1"), node("n2")], pods=[pod("p")])
    ).encode()
    fast = decode_composite_sync(body)
    slow = _decode_groups(decode_envelope(body, CompositeSyncRequest).related)
    assert dict(fast.related) == slow
    assert [n.metadata.name for n in fast.related[NODES].objects] == ["n1", "n2"]


def test_a_valid_request_is_decoded_in_one_pass_never_again_object_by_object() -> None:
    """The second pass is what a large request must not cost when every object fits."""
    composite = status_sync_request(gpuclass("a"), nodes=[node("n1")], pods=[pod("p")])
    decorator = license_sync_request(
        licensed_class(), secrets=[], namespaces=[namespace("a")], attachments=[]
    )
    with mock.patch(
        "hooks.wire.metacontroller.decode_envelope", side_effect=AssertionError("a second pass")
    ):
        assert decode_composite_sync(json.dumps(composite).encode()).related[NODES].objects
        assert decode_decorator_sync(json.dumps(decorator).encode()).related


def test_one_bad_object_falls_back_and_keeps_the_others() -> None:
    request = status_sync_request(gpuclass("a"), nodes=[node("n1"), node("n2")], pods=[pod("p")])
    request["related"]["Node.v1"]["n2"]["spec"] = "not an object"
    decoded = decode_composite_sync(json.dumps(request).encode())
    assert [n.metadata.name for n in decoded.related[NODES].objects] == ["n1"]
    assert decoded.related[NODES].invalid == ["n2"]
    assert len(decoded.related[PODS].objects) == 1
    assert decoded.related[GPUCLASSES].invalid == []


def test_absent_groups_stay_absent_and_unknown_groups_are_skipped() -> None:
    request = status_sync_request(gpuclass("a"))
    del request["related"]["Pod.v1"]
    request["related"]["Widget.example.com/v1"] = {"w": {"spec": [1]}}
    decoded = decode_composite_sync(json.dumps(request).encode())
    assert set(decoded.related) == {NODES, GPUCLASSES}


def test_decorator_attachments_absent_differs_from_empty() -> None:
    request = license_sync_request(
        licensed_class(),
        secrets=[],
        namespaces=[namespace("a")],
        attachments=[managed_copy("l40s", "a")],
    )
    decoded = decode_decorator_sync(json.dumps(request).encode())
    assert decoded.attachments is not None
    assert len(decoded.attachments["Secret.v1"].objects) == 1
    del request["attachments"]
    assert decode_decorator_sync(json.dumps(request).encode()).attachments is None


def test_a_denial_message_is_cut_to_its_bound_and_no_shorter() -> None:
    from hooks.wire.admission import MAX_MESSAGE, review_response

    def message(text: str) -> str:
        return str(review_response("u", False, text)["response"]["status"]["message"])

    at_bound = "x" * MAX_MESSAGE
    assert message(at_bound) == at_bound
    over = message("y" * (MAX_MESSAGE + 1))
    assert len(over) == MAX_MESSAGE and over == "y" * (MAX_MESSAGE - 1) + "…"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
            "AdmissionReview has no request",
        ),
        (
            b'{"apiVersion": "v1", "kind": "AdmissionReview", "request": {"uid": "u"}}',
            "not an admission.k8s.io/v1 AdmissionReview",
        ),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
            "invalid AdmissionReview: request: object missing required field uid",
        ),
        (b"{", "request body is not valid JSON"),
    ],
)
def test_an_unusable_review_is_refused_in_words_that_name_what_is_wrong(
    body: bytes, problem: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        decode_review(body)
    assert str(refused.value) == problem


class _Shaped(msgspec.Struct):
    X: list[int] | None = None  # a name made of the letters the path is trimmed of


def test_a_field_problem_names_the_field_whole_and_each_allowed_type_in_words() -> None:
    with pytest.raises(Undecodable) as problem:
        decoded(decoder_for(_Shaped), b'{"X": "s"}')
    assert str(problem.value) == "X: expected a list or null, got a string"


def test_a_problem_at_the_top_level_is_the_reason_alone() -> None:
    with pytest.raises(Undecodable) as problem:
        decoded(decoder_for(_Shaped), b"5")
    assert str(problem.value) == "expected a map, got an integer"


def test_a_dns_label_is_at_most_63_characters() -> None:
    assert is_dns_label("a" * 63) and not is_dns_label("a" * 64)
    assert not is_dns_label("") and not is_dns_label("A") and not is_dns_label("a-")


def test_a_label_value_is_at_most_63_characters_and_may_be_empty() -> None:
    assert is_label_value("a" * 63) and is_label_value("") and is_label_value("A.b_c-9")
    assert not is_label_value("a" * 64)
    assert not is_label_value("-a") and not is_label_value("a_")
