"""The routes through Flask's test client, with Metacontroller-shaped requests."""

from __future__ import annotations

import json
import logging
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask.testing import FlaskClient

from hooks.serving import http
from hooks.serving.app import create_app
from hooks.serving.body import CUT_AFTER_SECONDS
from hooks.settings import Settings
from tests import EXAMPLES
from tests.builders import conditions_in_order, gpuclass, node, pod, status_sync_request

# Exactly the keys Metacontroller's v2 strict mode accepts in each response.
COMPOSITE_SYNC_KEYS = {"status", "children", "resyncAfterSeconds", "finalized"}
CUSTOMIZE_KEYS = {"relatedResources"}
RULE_KEYS = {"apiVersion", "resource", "labelSelector", "namespaceSelector", "namespace", "names"}
SELECTOR_KEYS = {"matchLabels", "matchExpressions"}


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
    # nodes and pods twice: those of the class's resource, those the labeller has not read yet
    assert [r["resource"] for r in response.json["relatedResources"]] == [
        "nodes",
        "nodes",
        "pods",
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
    assert [c["type"] for c in status["conditions"]] == conditions_in_order(licensed=False)
    assert status["conditions"][-1]["status"] == "True"


def test_status_sync_disabled(settings: Settings) -> None:
    client = create_app(settings.model_copy(update={"enabled": False})).test_client()
    response = post(client, "/status/sync", (EXAMPLES / "status-sync.json").read_bytes())
    assert (response.status_code, response.json) == (200, {"status": {}, "children": []})


def test_kubevirt_unreadable_answers_with_resync(client: FlaskClient, apiserver: Any) -> None:
    from tests.fake_apiserver import KUBEVIRT_PATH

    apiserver.serve(KUBEVIRT_PATH, 503, {"kind": "Status"})
    response = post(client, "/status/sync", (EXAMPLES / "status-sync.json").read_bytes())
    assert response.status_code == 200
    assert set(response.json) == {"status", "children", "resyncAfterSeconds"}
    assert response.json["status"]["conditions"][-1]["reason"] == "KubeVirtUnreadable"


def test_probes_and_metrics_are_not_served_with_the_hooks(client: FlaskClient) -> None:
    """They have ports of their own (hooks.serving.listeners), never queued behind hook calls."""
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


class Trickle:
    """A body that arrives too late: each read waits, then gives a byte."""

    def __init__(self, wait_seconds: float) -> None:
        self.wait_seconds = wait_seconds

    def read(self, size: int = -1) -> bytes:
        time.sleep(self.wait_seconds)
        return b"{"


class Late:
    """A body that arrives whole, after a wait."""

    def __init__(self, body: bytes, wait_seconds: float) -> None:
        self.body, self.wait_seconds = body, wait_seconds

    def read(self, size: int = -1) -> bytes:
        time.sleep(self.wait_seconds)
        body, self.body = self.body, b""
        return body


class Watched:
    """A body that arrives at once, noting the connection's timeout while it is read; closing
    the connection after it when told to."""

    def __init__(self, body: bytes, connection: socket.socket, close_after: bool = False) -> None:
        self.body, self.connection, self.close_after = body, connection, close_after
        self.timeouts: list[float | None] = []

    def read(self, size: int = -1) -> bytes:
        self.timeouts.append(self.connection.gettimeout())
        body, self.body = self.body, b""
        if self.close_after:
            self.connection.close()
        return body


def test_a_body_that_arrives_late_but_within_its_deadline_is_served(settings: Settings) -> None:
    """The connection is cut only a moment after the deadline, never before it."""
    body = (EXAMPLES / "status-sync.json").read_bytes()
    patient = settings.model_copy(update={"body_timeout_seconds": CUT_AFTER_SECONDS + 0.5})
    wait = patient.body_deadline_seconds(len(body)) - 0.5 * CUT_AFTER_SECONDS
    environ = {"wsgi.input": Late(body, wait), "CONTENT_LENGTH": str(len(body))}
    response = create_app(patient).test_client().post("/status/sync", environ_overrides=environ)
    assert response.status_code == 200, response.json


def test_the_connection_times_out_at_the_body_deadline_and_gets_its_own_timeout_back(
    settings: Settings,
) -> None:
    """The socket's timeout is what ends a stalled body on time; after the body, gunicorn's
    keep-alive timeout is the connection's again."""
    body = (EXAMPLES / "status-sync.json").read_bytes()
    ours, theirs = socket.socketpair()
    ours.settimeout(7.0)
    watched = Watched(body, ours)
    environ = {"wsgi.input": watched, "CONTENT_LENGTH": str(len(body)), "gunicorn.socket": ours}
    response = create_app(settings).test_client().post("/status/sync", environ_overrides=environ)
    try:
        assert response.status_code == 200, response.json
        deadline = settings.body_deadline_seconds(len(body))
        assert watched.timeouts
        assert all(timeout == pytest.approx(deadline) for timeout in watched.timeouts)
        assert ours.gettimeout() == 7.0
    finally:
        ours.close()
        theirs.close()


def test_a_connection_closed_once_its_body_has_arrived_still_gets_the_answer_computed(
    settings: Settings,
) -> None:
    """Giving the connection its timeout back is best effort: a socket already closed is left."""
    body = (EXAMPLES / "status-sync.json").read_bytes()
    ours, theirs = socket.socketpair()
    watched = Watched(body, ours, close_after=True)
    environ = {"wsgi.input": watched, "CONTENT_LENGTH": str(len(body)), "gunicorn.socket": ours}
    response = create_app(settings).test_client().post("/status/sync", environ_overrides=environ)
    theirs.close()
    assert response.status_code == 200, response.json


@pytest.mark.parametrize("connection", [False, True], ids=["no-socket", "socket"])
def test_a_body_past_its_deadline_is_a_408_naming_the_settings(
    settings: Settings, caplog: pytest.LogCaptureFixture, connection: bool
) -> None:
    """The read side of the connection is shut when the body is out of time (a socket that
    cannot be shut is no error), and the caller is told what to raise."""
    fast = settings.model_copy(update={"body_timeout_seconds": 0.2})
    client = create_app(fast).test_client()
    environ: dict[str, Any] = {
        "wsgi.input": Trickle(0.2 + CUT_AFTER_SECONDS + 0.3),
        "CONTENT_LENGTH": "100",
    }
    ours, theirs = socket.socketpair()
    if connection:
        environ["gunicorn.socket"] = ours
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        response = client.post("/status/sync", environ_overrides=environ)
    if connection:
        ours.settimeout(0.5)
        assert ours.recv(1) == b""  # its read side was shut
        unconnected = socket.socket()  # shutting one that is not connected fails, harmlessly
        environ["gunicorn.socket"] = unconnected
        with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
            assert client.post("/status/sync", environ_overrides=environ).status_code == 408
        unconnected.close()
    ours.close()
    theirs.close()
    assert response.status_code == 408, response.json
    [call] = [r.fields for r in caplog.records if r.getMessage() == "hook call"][:1]  # type: ignore[attr-defined]
    assert (call["outcome"], call["error"]) == ("refused", "Request Timeout")
    assert response.json == {
        "error": f"the request body did not arrive within {fast.body_deadline_seconds(100):g} s "
        "(GPUCLASS_BODY_TIMEOUT_SECONDS, GPUCLASS_BODY_MIN_BYTES_PER_SECOND)"
    }
    assert "alarm failed" not in caplog.text


def test_an_http_error_without_a_description_answers_its_name(client: FlaskClient) -> None:
    response = client.put("/status/sync")
    assert response.status_code == 405
    assert response.json == {"error": "The method is not allowed for the requested URL."}


def test_an_unexpected_error_is_a_500_logged_by_type_and_frames_only(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hooks.serving.app
    from hooks.routes import COMPOSITE_SYNCED, Hook

    def broken(service: Any, body: bytes) -> Any:
        raise KeyError(body.decode())  # a message that quotes the input

    monkeypatch.setattr(
        hooks.serving.app,
        "HOOKS",
        (Hook("/status/sync", "metacontroller", broken, COMPOSITE_SYNCED),),
    )
    client = create_app(settings, apart_from_bytes=None).test_client()
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        response = client.post("/status/sync", data=b'{"token": "secret-token-value"}')
    assert (response.status_code, response.json) == (500, {"error": "internal error"})
    [error] = [r.fields for r in caplog.records if r.getMessage() == "unexpected error"]  # type: ignore[attr-defined]
    assert (error["route"], error["error"]) == ("/status/sync", "KeyError")
    assert 1 <= len(error["frames"]) <= 3 and "in broken" in error["frames"][-1]
    assert "secret-token-value" not in repr(error)


@pytest.mark.parametrize("code", [401, 403, 408, 411, 413, 429])
def test_a_refusal_closes_the_connection_its_body_was_not_read_from(code: int) -> None:
    assert http.error_response("no", code).headers["Connection"] == "close"


@pytest.mark.parametrize("code", [400, 404, 405, 409, 412, 430, 500])
def test_other_errors_keep_the_connection(code: int) -> None:
    assert "Connection" not in http.error_response("no", code).headers


@pytest.mark.parametrize("apart_from_bytes", [None, 0], ids=["in-thread", "apart"])
def test_the_warning_of_skipped_objects_names_the_class_and_route(
    settings: Settings, caplog: pytest.LogCaptureFixture, apart_from_bytes: int | None
) -> None:
    client = create_app(settings, apart_from_bytes=apart_from_bytes).test_client()
    request = status_sync_request(gpuclass("l40s"), nodes=[node("bad", gpus="x")])
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        post(client, "/status/sync", request)
    [warning] = [r for r in caplog.records if r.getMessage() == "skipped unreadable objects"]
    assert warning.fields["class"] == "l40s"  # type: ignore[attr-defined]
    assert warning.fields["route"] == "/status/sync"  # type: ignore[attr-defined]
    [call] = [r.fields for r in caplog.records if r.getMessage() == "hook call"]  # type: ignore[attr-defined]
    assert call.get("computed_apart", False) is (apart_from_bytes is not None)


def test_the_default_clock_is_utc_whatever_the_machines_zone(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # nine hours from UTC
    time.tzset()
    try:
        client = create_app(settings).test_client()
        answer = post(client, "/status/sync", status_sync_request(gpuclass("l40s"))).json
    finally:
        monkeypatch.undo()
        time.tzset()
    stamps = {c["lastTransitionTime"] for c in answer["status"]["conditions"]}
    now = datetime.now(UTC)
    for stamp in stamps:
        assert abs(datetime.fromisoformat(stamp.replace("Z", "+00:00")) - now) < timedelta(
            minutes=5
        )
