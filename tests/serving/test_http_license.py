"""The license routes through the test client, and the token never leaking anywhere."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
from flask.testing import FlaskClient

from hooks.serving.app import create_app
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from tests import EXAMPLES
from tests.builders import (
    license_sync_request,
    licensed_class,
    managed_copy,
    namespace,
    node,
    secret,
    source_secret,
    status_sync_request,
)
from tests.serving.test_http import assert_strict_customize, post

DECORATOR_SYNC_KEYS = {
    "labels",
    "annotations",
    "status",
    "attachments",
    "resyncAfterSeconds",
    "finalized",
}


def test_license_customize_example(client: FlaskClient) -> None:
    response = post(
        client, "/license/customize", (EXAMPLES / "license-customize.json").read_bytes()
    )
    assert response.status_code == 200
    assert_strict_customize(response.json)
    # the source Secret, the entitled namespaces, and the copy's name in every namespace
    assert response.json["relatedResources"] == [
        {
            "apiVersion": "v1",
            "resource": "secrets",
            "namespace": "cozy-gpu-operator",
            "names": ["nvidia-license"],
        },
        {
            "apiVersion": "v1",
            "resource": "namespaces",
            "labelSelector": {"matchLabels": {"namespace.cozystack.io/vgpu": "true"}},
        },
        {"apiVersion": "v1", "resource": "secrets", "names": ["gpuclass-l40s-24q-license"]},
    ]


def test_license_sync_example(client: FlaskClient) -> None:
    response = post(client, "/license/sync", (EXAMPLES / "license-sync.json").read_bytes())
    assert response.status_code == 200
    assert set(response.json) <= DECORATOR_SYNC_KEYS
    assert list(response.json) == ["attachments", "status"]
    assert response.json["status"] is None
    # tenant-c holds its own Secret, tenant-d is terminating
    assert [a["metadata"]["namespace"] for a in response.json["attachments"]] == [
        "tenant-a",
        "tenant-b",
    ]
    for attachment in response.json["attachments"]:
        assert {"apiVersion", "kind", "metadata"} <= set(attachment)
        assert attachment["metadata"]["namespace"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{", 400),
        (b"{}", 400),
        (b'{"object": {"kind": "Pod"}, "attachments": {}}', 400),
        (
            b'{"object": {"apiVersion": "cozystack.io/v1alpha1", "kind": "GPUClass", '
            b'"metadata": {"name": "a"}}}',
            400,
        ),
    ],
)
def test_license_sync_refuses_bad_envelopes(client: FlaskClient, body: bytes, code: int) -> None:
    response = post(client, "/license/sync", body)
    assert response.status_code == code
    assert set(response.json) == {"error"}


def test_license_sync_disabled_returns_no_attachments(settings: Settings) -> None:
    client = create_app(settings.model_copy(update={"enabled": False})).test_client()
    response = post(client, "/license/sync", (EXAMPLES / "license-sync.json").read_bytes())
    assert response.json == {"attachments": [], "status": None}


KNOWN_TOKEN = b"LEAK-CANARY-7f3a9c\n"


def leak_forms() -> list[str]:
    stripped = KNOWN_TOKEN.strip()
    return [
        stripped.decode(),
        base64.b64encode(KNOWN_TOKEN).decode(),
        base64.b64encode(stripped).decode(),
    ]


def test_the_token_never_appears_in_logs_error_bodies_or_metrics(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics(180.0)
    client = create_app(settings, metrics=metrics).test_client()
    target = licensed_class()
    good = license_sync_request(
        target,
        secrets=[source_secret(KNOWN_TOKEN), managed_copy("l40s", "a", KNOWN_TOKEN)],
        namespaces=[namespace("a"), namespace("b")],
        attachments=[managed_copy("l40s", "a", KNOWN_TOKEN)],
    )
    status_request = status_sync_request(
        target,
        nodes=[node("gpu-1")],
        secrets=[source_secret(KNOWN_TOKEN)],
        namespaces=[namespace("a")],
    )
    broken_attachment = json.loads(json.dumps(good))
    broken_attachment["attachments"]["Secret.v1"]["a/gpuclass-l40s-license"]["data"] = [
        KNOWN_TOKEN.decode()
    ]
    broken_related = json.loads(json.dumps(good))
    broken_related["related"]["Secret.v1"]["x/gpuclass-l40s-license"] = {
        "metadata": {"name": "gpuclass-l40s-license", "namespace": "x"},
        "data": {"k": 5, "t": KNOWN_TOKEN.decode()},
    }
    truncated = json.dumps(good).encode()[:-40]
    token_in_wrong_place = json.loads(json.dumps(good))
    token_in_wrong_place["object"] = KNOWN_TOKEN.decode()
    calls: list[tuple[str, Any]] = [
        ("/license/sync", good),
        ("/status/sync", status_request),
        ("/license/sync", broken_attachment),
        ("/license/sync", broken_related),
        ("/license/sync", truncated),
        ("/status/sync", truncated),
        ("/license/sync", token_in_wrong_place),
        ("/status/sync", dict(status_request, parent=KNOWN_TOKEN.decode())),
        ("/license/customize", {"parent": KNOWN_TOKEN.decode()}),
    ]
    bodies = []
    with caplog.at_level(logging.DEBUG):
        for route, body in calls:
            response = post(client, route, body)
            assert response.status_code in (200, 400)
            if response.status_code != 200:
                bodies.append(response.get_data(as_text=True))
    assert any(r.levelno == logging.WARNING for r in caplog.records)
    captured = caplog.text + "".join(json.dumps(getattr(r, "fields", {})) for r in caplog.records)
    scrape = metrics.exposition()[0].decode()
    assert "cozystack_gpu_class_license_copies" in scrape
    for form in leak_forms():
        assert form not in captured
        assert all(form not in body for body in bodies)
        assert form not in scrape


def test_copy_responses_carry_the_token_only_in_data(client: FlaskClient) -> None:
    request = license_sync_request(
        licensed_class(), secrets=[source_secret(KNOWN_TOKEN)], namespaces=[namespace("a")]
    )
    [copy] = post(client, "/license/sync", request).json["attachments"]
    assert copy["data"]["client_configuration_token.tok"] == base64.b64encode(KNOWN_TOKEN).decode()
    rest = json.dumps({k: v for k, v in copy.items() if k != "data"})
    assert all(form not in rest for form in leak_forms())


def test_tenant_secret_is_never_written_or_deleted(client: FlaskClient) -> None:
    own = secret("gpuclass-l40s-license", "tenant-a", data={"mine": b"x"})
    request = license_sync_request(
        licensed_class(), secrets=[source_secret(), own], namespaces=[namespace("tenant-a")]
    )
    assert post(client, "/license/sync", request).json["attachments"] == []
