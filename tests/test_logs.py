"""Structured logs: one JSON object per line, the fields of a hook call, nothing secret."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from hooks.app import create_app
from hooks.logs import LOGGER, JsonFormatter
from hooks.memory import MemoryBudget
from hooks.settings import Settings
from tests.builders import (
    license_sync_request,
    licensed_class,
    namespace,
    node,
    source_secret,
    status_sync_request,
)

KNOWN_TOKEN = b"JSON-LOG-CANARY-91\n"


def test_one_json_line_per_hook_call_with_the_fields_that_explain_it(
    settings: Settings, tmp_path: Path
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    try:
        client = create_app(settings).test_client()
        secrets = [source_secret(KNOWN_TOKEN)]
        namespaces = [namespace("a"), namespace("b")]
        client.post(
            "/status/sync",
            json=status_sync_request(
                licensed_class(),
                nodes=[node("gpu-1"), node("bad", gpus="x")],
                secrets=secrets,
                namespaces=namespaces,
            ),
        )
        client.post(
            "/license/sync",
            json=license_sync_request(licensed_class(), secrets=secrets, namespaces=namespaces),
        )
        client.post("/license/sync", data=b"{broken")
    finally:
        LOGGER.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    calls = [line for line in lines if line["event"] == "hook call"]
    assert [c["route"] for c in calls] == ["/status/sync", "/license/sync", "/license/sync"]
    status_call, license_call, broken = calls
    assert {
        "time",
        "level",
        "class",
        "duration_ms",
        "body_bytes",
        "outcome",
        "code",
        "eligible_nodes",
        "counted_pods",
        "copies",
        "conflicts",
    } <= set(status_call)
    assert (status_call["class"], status_call["copies"], status_call["conflicts"]) == ("l40s", 2, 0)
    assert {"copies", "new_copies", "conflicts"} <= set(license_call)
    assert (broken["code"], broken["outcome"]) == (400, "bad_request")
    [warning] = [line for line in lines if line["level"] == "warning"]
    assert warning["objects"] == [
        "Node bad: allocatable nvidia.com/NVIDIA_L40S-24Q: not a quantity"
    ]
    text = stream.getvalue()
    assert "JSON-LOG-CANARY" not in text
    import base64

    assert base64.b64encode(KNOWN_TOKEN).decode() not in text


def test_every_refusal_writes_one_line_with_its_route_code_and_reason(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Refusals answered before a body is read (token, HTTPS, length, memory budget) are calls
    too: each writes the one line, with why it was refused."""
    tokens = tmp_path / "tokens"
    tokens.write_text("good\n")
    busy = MemoryBudget(1000, max_wait_seconds=0.01, bypass_below_bytes=1, per_call_bytes=0)
    held = busy.reserve(600)
    guarded = settings.model_copy(update={"auth_token_file": tokens, "max_body_bytes": 5000})
    client = create_app(guarded, memory=busy).test_client()
    good = {"Authorization": "Bearer good"}
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        client.post("/status/sync", data=b"{}")  # 401
        client.post("/admit/gpu-budget", data=b"{}")  # 403: plain HTTP
        client.post("/status/sync", data=b"x" * 6000, headers=good)  # 413
        client.post(
            "/status/sync",
            input_stream=io.BytesIO(b"{}"),
            headers={**good, "Transfer-Encoding": "chunked"},
            environ_overrides={"wsgi.input_terminated": True},
        )  # 411
        client.post("/status/sync", data=b"x" * 300, headers=good)  # 429: the budget is full
    held.release()  # type: ignore[union-attr]
    records = [r for r in caplog.records if r.getMessage() == "hook call"]
    calls = [r.fields for r in records]  # type: ignore[attr-defined]
    assert [(c["route"], c["code"], c["outcome"]) for c in calls] == [
        ("/status/sync", 401, "refused"),
        ("/admit/gpu-budget", 403, "refused"),
        ("/status/sync", 413, "refused"),
        ("/status/sync", 411, "refused"),
        ("/status/sync", 429, "refused"),
    ]
    assert [c["error"] for c in calls] == [
        "missing or invalid bearer token",
        "admission webhooks are served over HTTPS only",
        "a body of 6000 bytes is over the limit of 5000",
        "send Content-Length: hook bodies are read by their length",
        "the service is at its memory budget: retry later",
    ]
