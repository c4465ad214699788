"""Structured logs: one JSON object per line, the fields of a hook call, nothing secret."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

from hooks.app import create_app
from hooks.logs import LOGGER, JsonFormatter
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
