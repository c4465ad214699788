"""The routes through Flask's test client, with Metacontroller-shaped requests."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from hooks.app import create_app
from hooks.settings import Settings
from tests.builders import gpuclass, node, pod, status_sync_request

EXAMPLES = Path(__file__).parent.parent / "examples"
# Exactly the keys Metacontroller's v2 strict mode accepts in each response.
COMPOSITE_SYNC_KEYS = {"status", "children", "resyncAfterSeconds", "finalized"}
CUSTOMIZE_KEYS = {"relatedResources"}
RULE_KEYS = {"apiVersion", "resource", "labelSelector", "namespaceSelector", "namespace", "names"}
SELECTOR_KEYS = {"matchLabels", "matchExpressions"}


@pytest.fixture
def client(settings: Settings) -> FlaskClient:
    return create_app(settings).test_client()


def post(client: FlaskClient, route: str, body: Any, **kwargs: Any) -> Any:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(
        route, data=data, content_type=kwargs.pop("content_type", "application/json"), **kwargs
    )


def assert_strict_customize(payload: dict[str, Any]) -> None:
    assert set(payload) <= CUSTOMIZE_KEYS
    for rule in payload["relatedResources"]:
        assert set(rule) <= RULE_KEYS
        for selector in ("labelSelector", "namespaceSelector"):
            assert set(rule.get(selector, {})) <= SELECTOR_KEYS
            assert rule.get(selector, None) != {}
        assert rule.get("names", None) != []
        assert not ("names" in rule and "labelSelector" in rule)


def test_status_customize_example(client: FlaskClient) -> None:
    response = post(client, "/status/customize", (EXAMPLES / "status-customize.json").read_bytes())
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    assert_strict_customize(response.json)
    assert [r["resource"] for r in response.json["relatedResources"]] == [
        "nodes",
        "pods",
        "gpuclasses",
    ]


def test_status_sync_example(client: FlaskClient) -> None:
    response = post(client, "/status/sync", (EXAMPLES / "status-sync.json").read_bytes())
    assert response.status_code == 200
    assert set(response.json) <= COMPOSITE_SYNC_KEYS
    assert set(response.json) == {"status", "children"}
    assert response.json["children"] == []
    status = response.json["status"]
    assert (status["free"], status["maxFreePerNode"]) == (1, 1)
    assert set(status) == {"free", "maxFreePerNode", "conditions"}
    assert [c["type"] for c in status["conditions"]] == [
        "ResourceNameConflict",
        "ResourceNameNotPermitted",
        "ResourceNotAdvertised",
        "Ready",
    ]
    assert status["conditions"][-1]["status"] == "True"


def test_status_sync_disabled(settings: Settings) -> None:
    client = create_app(settings.model_copy(update={"enabled": False})).test_client()
    response = post(client, "/status/sync", (EXAMPLES / "status-sync.json").read_bytes())
    assert (response.status_code, response.json) == (200, {"status": {}, "children": []})


def test_kubevirt_unreadable_answers_with_resync(client: FlaskClient, apiserver: Any) -> None:
    from tests.apiserver import KUBEVIRT_PATH

    apiserver.serve(KUBEVIRT_PATH, 503, {"kind": "Status"})
    response = post(client, "/status/sync", (EXAMPLES / "status-sync.json").read_bytes())
    assert response.status_code == 200
    assert set(response.json) == {"status", "children", "resyncAfterSeconds"}
    assert response.json["status"]["conditions"][-1]["reason"] == "KubeVirtUnreadable"


def test_probes_and_metrics_are_not_served_with_the_hooks(client: FlaskClient) -> None:
    """They have ports of their own (hooks.ops), never queued behind hook calls."""
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.get(path).status_code == 404


@pytest.mark.parametrize("route", ["/status/sync", "/status/customize"])
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "not valid JSON"),
        (b'{"parent": ', "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[]", "invalid request envelope"),
        (b"{}", "no parent"),
        (b'{"parent": null}', "no parent"),
        (b'{"parent": "GPUClass"}', "parent is not a valid object"),
        (
            b'{"parent": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}}',
            "not a cozystack.io/v1alpha1 GPUClass",
        ),
        (
            b'{"parent": {"apiVersion": "cozystack.io/v1beta1", "kind": "GPUClass", '
            b'"metadata": {"name": "a"}}}',
            "not a cozystack.io/v1alpha1 GPUClass",
        ),
        (
            b'{"parent": {"apiVersion": "cozystack.io/v1alpha1", "kind": "GPUClass", '
            b'"metadata": {}}}',
            "no metadata.name",
        ),
    ],
)
def test_bad_envelopes_get_400_with_a_json_error(
    client: FlaskClient, route: str, body: bytes, message: str
) -> None:
    response = post(client, route, body)
    assert response.status_code == 400
    assert set(response.json) == {"error"}
    assert message in response.json["error"]


def test_related_of_the_wrong_shape_is_a_bad_envelope(client: FlaskClient) -> None:
    response = post(client, "/status/sync", {"parent": gpuclass("a"), "related": {"Node.v1": []}})
    assert response.status_code == 400


def test_invalid_objects_are_skipped_with_one_warning_naming_them(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    request = status_sync_request(
        gpuclass("a"),
        nodes=[node("gpu-1"), node("gpu-bad", gpus="many")],
        pods=[pod("vm", gpus="x"), pod("ok", gpus=1)],
    )
    request["related"]["Node.v1"]["weird"] = {"metadata": {"name": "weird"}, "status": []}
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        response = post(client, "/status/sync", request)
    assert response.status_code == 200
    assert response.json["status"]["free"] == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    fields = warnings[0].fields  # type: ignore[attr-defined]
    assert fields["count"] == 3
    assert any("gpu-bad" in o for o in fields["objects"])
    assert any("tenant-a/vm" in o for o in fields["objects"])
    assert any("weird" in o for o in fields["objects"])


def test_invalid_spec_answers_200_with_invalid_spec(client: FlaskClient) -> None:
    response = post(client, "/status/sync", status_sync_request(gpuclass("a", resource=None)))
    assert response.status_code == 200
    assert response.json["status"]["conditions"][0]["reason"] == "InvalidSpec"


def test_unknown_route_and_method_are_json_errors(client: FlaskClient) -> None:
    assert client.get("/status/sync").status_code == 405
    assert "error" in client.get("/status/sync").json
    assert client.post("/nope").status_code == 404
    assert "error" in client.post("/nope").json


def test_one_log_line_per_hook_call(client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        post(client, "/status/sync", (EXAMPLES / "status-sync.json").read_bytes())
        post(client, "/status/sync", b"nope")
    calls = [r.fields for r in caplog.records if r.getMessage() == "hook call"]  # type: ignore[attr-defined]
    assert [c["code"] for c in calls] == [200, 400]
    first = calls[0]
    assert first["route"] == "/status/sync"
    assert first["class"] == "l40s-24q"
    assert first["outcome"] == "ok"
    assert first["body_bytes"] > 0
    assert {"duration_ms", "eligible_nodes", "counted_pods"} <= set(first)
