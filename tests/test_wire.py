"""Request decoding: the one typed pass and the per-object fallback agree."""

from __future__ import annotations

import json

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
