"""Structured logs: one JSON object per line, the fields of a hook call, nothing secret."""

from __future__ import annotations

import io
import json
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from werkzeug.exceptions import BadRequest

from hooks.serving import http
from hooks.serving.app import create_app
from hooks.serving.logs import LOGGER, JsonFormatter, QueuedStream, configure, log
from hooks.serving.memory import MemoryBudget
from hooks.settings import Settings
from tests.builders import (
    example_of,
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
    assert broken["error"] == "request body is not valid JSON"
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


def test_a_line_is_compact_json_with_time_level_event_then_the_fields() -> None:
    record = logging.LogRecord("gpuclass_hooks", logging.WARNING, __file__, 1, "skipped", (), None)
    record.created = 1_800_000_000.25
    record.fields = {"route": "/status/sync", "path": Path("/a b"), "count": 2}  # type: ignore[attr-defined]
    assert JsonFormatter().format(record) == (
        '{"time":"2027-01-15T08:00:00.250+00:00","level":"warning","event":"skipped",'
        '"route":"/status/sync","path":"/a b","count":2}'
    )


def test_a_line_without_fields_has_time_level_and_event() -> None:
    record = logging.LogRecord("gpuclass_hooks", logging.INFO, __file__, 1, "listening", (), None)
    record.created = 0.0
    assert json.loads(JsonFormatter().format(record)) == {
        "time": "1970-01-01T00:00:00.000+00:00",
        "level": "info",
        "event": "listening",
    }


@pytest.fixture
def pristine_logger() -> Iterator[None]:
    """The service's logger as it was, after a test that configures it."""
    handlers, level, propagate = list(LOGGER.handlers), LOGGER.level, LOGGER.propagate
    LOGGER.handlers.clear()
    yield
    LOGGER.handlers[:] = handlers
    LOGGER.setLevel(level)
    LOGGER.propagate = propagate


def test_configure_sends_json_lines_to_stderr_once(
    pristine_logger: None, capfd: pytest.CaptureFixture[str]
) -> None:
    configure("WARNING")
    configure("DEBUG")  # a second call changes nothing
    assert len(LOGGER.handlers) == 1
    assert LOGGER.level == logging.WARNING
    assert LOGGER.propagate is False
    log(logging.INFO, "not shown")
    log(logging.WARNING, "shown", n=1)
    LOGGER.handlers[0].flush()  # written by the writer thread
    captured = capfd.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert {k: v for k, v in json.loads(line).items() if k != "time"} == {
        "level": "warning",
        "event": "shown",
        "n": 1,
    }


def test_configure_logs_at_info_by_default(pristine_logger: None) -> None:
    configure()
    assert LOGGER.level == logging.INFO


EXAMPLE_LINES = {
    "/status/customize": {"outcome": "ok", "rules": 5},
    "/resource-labels/sync": {
        "pod": "tenant-acme/virt-launcher-vm-gpu-x7k2p",
        "outcome": "ok",
        "resources": 3,  # its GPU, KubeVirt's kvm device, and the mark that it was read
        "removed": 0,
    },
    "/status/sync": {
        "class": "l40s-24q",
        "outcome": "kubevirt_unreadable",
        "nodes": 5,
        "eligible_nodes": 1,
        "counted_pods": 2,
    },
    "/license/customize": {"outcome": "ok", "rules": 3},
    "/license/sync": {
        "class": "l40s-24q",
        "outcome": "ok",
        "copies": 2,
        "new_copies": 2,
        "conflicts": 1,
    },
}


@pytest.mark.parametrize("route", sorted(EXAMPLE_LINES))
def test_each_hook_call_logs_exactly_its_facts(
    route: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(kube_api="http://127.0.0.1:9", kube_timeout_seconds=0.2)
    body = example_of(route)
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        assert create_app(settings).test_client().post(route, data=body).status_code == 200
    [call] = [r.fields for r in caplog.records if r.getMessage() == "hook call"]  # type: ignore[attr-defined]
    assert call.pop("duration_ms") >= 0
    assert call == {"route": route, **EXAMPLE_LINES[route], "body_bytes": len(body), "code": 200}


def test_a_400_answered_outside_any_hook_is_logged_as_refused_with_its_reason(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(settings)

    @app.post("/test/bad-request")
    def bad_request() -> None:
        raise BadRequest("no such thing")

    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        assert app.test_client().post("/test/bad-request").status_code == 400
    [call] = [r.fields for r in caplog.records if r.getMessage() == "hook call"]  # type: ignore[attr-defined]
    assert (call["code"], call["outcome"], call["error"]) == (400, "refused", "no such thing")


def test_a_call_logs_how_long_it_took_from_its_start_in_milliseconds_to_a_tenth(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    readings = iter([10.0])  # the call's start; every reading after it is 12.34 ms later

    def now() -> float:
        return next(readings, 10.01234)

    monkeypatch.setattr(http, "now", now)
    client = create_app(settings).test_client()
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        client.post("/status/customize", data=example_of("/status/customize"))
    [call] = [r.fields for r in caplog.records if r.getMessage() == "hook call"]  # type: ignore[attr-defined]
    assert call["duration_ms"] == 12.3


def test_a_stalled_stderr_never_holds_whoever_logs_and_the_drops_are_counted_then_said() -> None:
    """A pipe nobody reads fills at 64 KiB: the writer thread waits on it, the queue fills, and
    lines are dropped and counted; once the pipe is read again, the writer says how many."""
    reading, writing = os.pipe()
    handler = QueuedStream(writing, capacity=50)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("gpuclass_hooks.test.stalled")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        done = threading.Event()

        def flood() -> None:
            for index in range(2000):
                logger.warning("x" * 1000, extra={"fields": {"index": index}})
            done.set()

        threading.Thread(target=flood, daemon=True).start()
        assert done.wait(30), "logging waited for the stalled stderr"
        assert handler.dropped > 0
        drained = bytearray()

        def drain() -> None:
            try:
                while piece := os.read(reading, 1 << 16):
                    drained.extend(piece)
            except OSError:  # the test closed the pipe under it: the drain is over
                return

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + 30
        while b'"event":"log lines dropped"' not in drained:
            assert time.monotonic() < deadline, "the drops were never said"
            time.sleep(0.05)
        said = [json.loads(line) for line in drained.splitlines() if b"log lines dropped" in line]
        assert sum(line["count"] for line in said) <= handler.dropped
        assert said[0]["reason"] == "stderr was not read in time"
    finally:
        logger.removeHandler(handler)
        os.close(reading)  # a writer still waiting on the pipe fails, and is done
        os.close(writing)


@pytest.mark.parametrize("held", ["the writer's stream", "the drop count's lock"])
def test_a_process_forked_while_the_writer_holds_a_lock_still_logs(held: str) -> None:
    """gunicorn forks its workers while the arbiter's writer may be writing: a lock held at a
    fork stays held in the child for ever, and a worker that waited on one at boot never
    served. The child logs whatever the parent held."""
    reading, writing = os.pipe()
    handler = QueuedStream(writing, capacity=100_000)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("gpuclass_hooks.test.forked")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        if held == "the writer's stream":
            for _ in range(200):  # the pipe fills: the writer waits in the middle of a write
                logger.warning("x" * 1000)
            time.sleep(0.2)
            pid = os.fork()
        else:  # another thread holds it, as the writer does for a moment after each line
            holding, done = threading.Event(), threading.Event()

            def hold() -> None:
                with handler._count:
                    holding.set()
                    done.wait()

            holder = threading.Thread(target=hold)
            holder.start()
            holding.wait()
            pid = os.fork()
            if pid:
                done.set()
                holder.join()
        if pid == 0:  # the child: logs, and says by its exit whether the line was written
            logger.warning("from the child")
            handler.flush(seconds=60)
            os._exit(0 if handler._lines.unfinished_tasks == 0 else 1)
        drained = bytearray()
        deadline = time.monotonic() + 60
        while b"from the child" not in drained and time.monotonic() < deadline:
            ready, _, _ = select.select([reading], [], [], 0.5)
            if ready:
                drained.extend(os.read(reading, 1 << 16))
        if b"from the child" not in drained:
            os.kill(pid, signal.SIGKILL)  # hung: the test fails, it does not wait for ever
        _, status = os.waitpid(pid, 0)
        assert b"from the child" in drained
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        logger.removeHandler(handler)
        os.close(reading)
        os.close(writing)
