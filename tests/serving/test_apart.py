"""Large calls computed in a process of their own (`hooks.serving.apart`): the same answers,
metrics and log lines as in the serving thread, the body whole in the child, and every way a
child can fail answered without a traceback, its reservation given back and no child left behind."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from multiprocessing.process import BaseProcess
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.exceptions import ClientDisconnected

from hooks.routes import COMPOSITE_SYNCED, HOOKS, Answer, FailedElsewhere, Hook, HookInputs
from hooks.rules.permitted_devices import KubeVirtAbsent, KubeVirtView
from hooks.serving import apart
from hooks.serving.app import create_app
from hooks.serving.body import CHUNK_BYTES
from hooks.serving.memory import LARGE_BODY_BYTES, Admitted, MemoryBudget
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from tests import ROOT
from tests.builders import admission_review, example_of

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PURE = [hook for hook in HOOKS if hook.apart]
KIB = 1024


# Handlers travel to the child by reference, so the test hooks are module-level functions.
def digest(inputs: HookInputs, body: bytes) -> Answer:
    return Answer(b"{}", {"sha256": hashlib.sha256(body).hexdigest(), "length": len(body)})


def raises(inputs: HookInputs, body: bytes) -> Answer:
    raise RuntimeError("a message that quotes the input: secret-token-value")


def dies(inputs: HookInputs, body: bytes) -> Answer:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def exits(inputs: HookInputs, body: bytes) -> Answer:
    os._exit(3)


def cuts_its_pipe_and_lingers(inputs: HookInputs, body: bytes) -> Answer:
    os.closerange(3, 4096)  # the serving process sees the child gone, yet it runs on
    time.sleep(60)
    raise AssertionError("unreachable")


def cuts_its_pipe_and_exits(inputs: HookInputs, body: bytes) -> Answer:
    os.closerange(3, 4096)
    time.sleep(0.3)
    os._exit(4)


def hangs(inputs: HookInputs, body: bytes) -> Answer:
    time.sleep(60)
    raise AssertionError("unreachable")


def reads_budgets(inputs: HookInputs, body: bytes) -> Answer:
    inputs.budgets.catalog()
    raise AssertionError("unreachable")


def reads_kubevirt_twice(inputs: HookInputs, body: bytes) -> Answer:
    views = [inputs.kubevirt(), inputs.kubevirt()]
    return Answer(b"{}", {"views": [type(v).__name__ for v in views]})


def hook_of(handler: Any) -> Hook:
    return Hook("/status/sync", "metacontroller", handler, COMPOSITE_SYNCED, apart=True)


def inputs(settings: Settings) -> apart.Inputs:
    return apart.Inputs(settings, NOW)


def pieces(body: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def no_view() -> KubeVirtView:
    raise AssertionError("the KubeVirt view was read")


def hook_children() -> list[str]:
    """The children computing hooks still running, once those that are exiting are gone."""
    deadline = time.monotonic() + 10
    while True:
        running = [p.name for p in multiprocessing.active_children() if p.name.startswith("hook ")]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.01)


# --- the same answers ---------------------------------------------------------------------------


@pytest.mark.parametrize("hook", PURE, ids=[hook.path for hook in PURE])
def test_hooks_computed_apart_answer_the_same_in_a_child_as_in_their_thread(
    settings: Settings, hook: Hook
) -> None:
    answers = []
    for apart_from_bytes in (None, 0):
        metrics = Metrics(180.0)
        app = create_app(
            settings, clock=lambda: NOW, metrics=metrics, apart_from_bytes=apart_from_bytes
        )
        response = app.test_client().post(hook.path, data=example_of(hook.path))
        series = sorted(
            line
            for line in metrics.exposition()[0].decode().splitlines()
            if line.startswith(("cozystack_gpu_class", "cozystack_gpu_budget_"))
            and "timestamp" not in line
            and "_reviews_" not in line
        )
        answers.append((response.status_code, response.data, series))
    assert answers[0][0] == 200
    assert answers[1] == answers[0]
    if hook.path in ("/status/sync", "/license/sync", "/budget-pools/sync"):
        assert answers[0][2], "a sync records its series"


def test_without_memfd_every_call_is_computed_in_its_thread(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other systems than Linux have no memfd: the service still answers every call."""

    def computed_apart(*args: Any) -> Answer:
        raise AssertionError("computed apart")

    monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setattr(apart, "compute", computed_apart)
    assert not apart.supported()
    body = example_of("/status/sync") + b" " * LARGE_BODY_BYTES
    response = create_app(settings, clock=lambda: NOW).test_client().post("/status/sync", data=body)
    assert response.status_code == 200
    assert response.json["status"]["free"] == 1


def test_a_bad_request_is_the_same_400_apart(settings: Settings) -> None:
    body = json.loads(example_of("/status/sync"))
    body["parent"]["kind"] = "ConfigMap"
    answers = []
    for apart_from_bytes in (None, 0):
        client = create_app(settings, apart_from_bytes=apart_from_bytes).test_client()
        response = client.post("/status/sync", json=body)
        answers.append((response.status_code, response.json))
    assert answers[0][0] == 400
    assert answers[1] == answers[0]


def test_the_body_arrives_whole_from_many_pieces(settings: Settings) -> None:
    body = os.urandom(3 * 1000 * KIB + 17)
    answer = apart.compute(
        hook_of(digest), inputs(settings), no_view, pieces(body, 64 * KIB), len(body), 30.0
    )
    assert answer.facts["length"] == len(body)
    assert answer.facts["sha256"] == hashlib.sha256(body).hexdigest()
    assert answer.facts["computed_apart"] is True


def test_the_kubevirt_view_is_read_here_each_time_the_child_asks(settings: Settings) -> None:
    reads: list[int] = []

    def view() -> KubeVirtView:
        reads.append(1)
        return KubeVirtAbsent("kubevirt/kubevirt")

    answer = apart.compute(
        hook_of(reads_kubevirt_twice), inputs(settings), view, iter([b"{}"]), 2, 30.0
    )
    assert answer.facts["views"] == ["KubeVirtAbsent", "KubeVirtAbsent"]
    assert len(reads) == 2


def test_a_license_sync_apart_never_reads_the_kubevirt_view(settings: Settings) -> None:
    hook = next(hook for hook in HOOKS if hook.path == "/license/sync")
    body = example_of(hook.path)
    answer = apart.compute(hook, inputs(settings), no_view, iter([body]), len(body), 30.0)
    assert answer.facts["outcome"] == "ok"


# --- which calls run apart ----------------------------------------------------------------------


def padded(body: bytes, size: int) -> bytes:
    """The same JSON, grown to `size` bytes with whitespace."""
    return body + b" " * (size - len(body))


def call_facts(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if r.getMessage() == "hook call"]  # type: ignore[attr-defined]


def test_only_large_calls_of_pure_hooks_run_apart(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    client = create_app(settings, memory=None).test_client()
    review = json.dumps(admission_review("VMInstance", "tenant-a", "vm", {})).encode()
    large = max(LARGE_BODY_BYTES, 3 * CHUNK_BYTES)  # a large body crosses in several pieces
    calls = [
        ("/status/sync", example_of("/status/sync")),
        ("/status/sync", padded(example_of("/status/sync"), large)),
        ("/admit/gpu-budget", padded(review, large)),
    ]
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        for path, body in calls:
            client.post(path, data=body, base_url="https://localhost")
    assert [facts.get("computed_apart", False) for facts in call_facts(caplog)] == [
        False,
        True,
        False,
    ]


def test_a_chunked_body_is_refused_before_any_child_or_reservation(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    memory = MemoryBudget(100 * KIB, max_wait_seconds=1, bypass_below_bytes=1, per_call_bytes=0)
    client = create_app(settings, memory=memory, apart_from_bytes=0).test_client()
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        response = client.post(
            "/status/sync",
            input_stream=io.BytesIO(example_of("/status/sync")),
            headers={"Transfer-Encoding": "chunked", "Content-Type": "application/json"},
            environ_overrides={"wsgi.input_terminated": True},  # as gunicorn marks it
        )
    assert response.status_code == 411
    assert (memory.reserved_bytes, hook_children()) == (0, [])
    assert call_facts(caplog)[0]["code"] == 411


# --- failures -------------------------------------------------------------------------------


def failed_call(
    settings: Settings, handler: Any, caplog: pytest.LogCaptureFixture
) -> tuple[Any, dict[str, Any]]:
    """A call to a /status/sync served by `handler`, computed apart: its response and the fields
    of the error logged, once its reservation of the memory budget is seen given back."""
    import hooks.serving.app

    memory = MemoryBudget(100 * KIB, max_wait_seconds=1, bypass_below_bytes=1, per_call_bytes=0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hooks.serving.app, "HOOKS", (hook_of(handler),))
        client = create_app(settings, memory=memory, apart_from_bytes=0).test_client()
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        response = client.post("/status/sync", data=b"{}")
    assert memory.reserved_bytes == 0
    assert hook_children() == []
    [error] = [r for r in caplog.records if r.getMessage() == "unexpected error"]
    return response, error.fields  # type: ignore[attr-defined]


def test_an_error_in_the_child_is_a_500_logged_by_type_and_frames_only(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    response, error = failed_call(settings, raises, caplog)
    assert (response.status_code, response.json) == (500, {"error": "internal error"})
    assert error["error"] == "RuntimeError"
    assert any("raises" in frame for frame in error["frames"])
    assert "secret-token-value" not in caplog.text


def test_a_child_that_dies_is_a_500_saying_how(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    response, error = failed_call(settings, dies, caplog)
    assert (response.status_code, response.json) == (500, {"error": "internal error"})
    assert error["error"] == "ChildDied"
    assert "killed by signal 9" in error["frames"][0]


def test_a_child_that_exits_is_a_500_saying_with_which_code(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    response, error = failed_call(settings, exits, caplog)
    assert (response.status_code, error["error"]) == (500, "ChildDied")
    assert error["frames"] == ["the process computing /status/sync ended (exit code 3)"]


def test_a_child_that_cut_its_pipe_is_waited_for_a_second_at_most(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its exit code is worth a second (the log says how it ended), not the call's whole hook
    timeout: past the second the 500 goes out, and the child is killed. Asserted on the wait the
    code asks for, not on a clock a busy machine slows."""
    waits: list[float | None] = []
    join = BaseProcess.join

    def noting_the_wait(process: BaseProcess, timeout: float | None = None) -> None:
        if process.name.startswith("hook ") and timeout is not None:
            waits.append(timeout)
        join(process, timeout)

    monkeypatch.setattr(BaseProcess, "join", noting_the_wait)
    with pytest.raises(FailedElsewhere) as failed:
        apart.compute(
            hook_of(cuts_its_pipe_and_lingers), inputs(settings), no_view, iter([b"{}"]), 2, 30.0
        )
    assert failed.value.frames == ["the process computing /status/sync ended (exit code None)"]
    assert waits == [1.0]
    assert hook_children() == []


def test_a_child_that_cut_its_pipe_and_ends_within_the_second_is_logged_with_its_exit_code(
    settings: Settings,
) -> None:
    with pytest.raises(FailedElsewhere) as failed:
        apart.compute(
            hook_of(cuts_its_pipe_and_exits), inputs(settings), no_view, iter([b"{}"]), 2, 30.0
        )
    assert failed.value.frames == ["the process computing /status/sync ended (exit code 4)"]


def test_a_child_past_its_deadline_is_killed(settings: Settings) -> None:
    apart.start()  # the half second is the child's, not the fork server's first start
    started = time.monotonic()
    with pytest.raises(FailedElsewhere) as failed:
        apart.compute(hook_of(hangs), inputs(settings), no_view, iter([b"{}"]), 2, 0.5)
    assert (failed.value.error_type, failed.value.frames) == (
        "DeadlineExceeded",
        ["no answer within the hook timeout"],
    )
    assert time.monotonic() - started < 30  # killed, not waited for
    assert hook_children() == []


def test_the_hook_timeout_runs_from_the_call_not_from_the_end_of_its_body(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow body and a slow computation share one deadline: the call, its child and its
    reservation are held the hook timeout at most, never the body's time again on top."""
    apart.start()
    arrived: list[float] = []
    deadlines: list[float] = []
    await_end = apart._await_end

    def slow_body() -> Iterator[bytes]:
        time.sleep(0.5)
        arrived.append(time.monotonic())
        yield b"{}"

    def noting_the_deadline(ours: Any, kubevirt: Any, deadline: float) -> Any:
        deadlines.append(deadline)
        return await_end(ours, kubevirt, deadline)

    monkeypatch.setattr(apart, "_await_end", noting_the_deadline)
    started = time.monotonic()
    with pytest.raises(FailedElsewhere) as failed:
        apart.compute(hook_of(hangs), inputs(settings), no_view, slow_body(), 2, 2.0)
    assert failed.value.error_type == "DeadlineExceeded"
    # set from the call's start: before the body arrived, however long it took to
    [deadline] = deadlines
    assert started + 2.0 <= deadline < arrived[0] + 2.0
    assert hook_children() == []


def test_a_call_that_waited_for_the_memory_budget_gets_only_what_is_left_of_its_hook_timeout(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's clock started with the call: a second spent waiting for the budget is a
    second less for the child."""
    monkeypatch.setattr("hooks.serving.app.HOOKS", (hook_of(hangs),))
    memory = MemoryBudget(
        1500, max_wait_seconds=5, expansion=1, per_call_bytes=1000, bypass_below_bytes=1
    )
    held = memory.reserve(2)  # room for one call of two bytes, not two
    app = create_app(
        settings.model_copy(update={"hook_timeout": "2s"}), memory=memory, apart_from_bytes=0
    )
    apart.start()
    assert isinstance(held, Admitted)
    given: list[float] = []
    compute = apart.compute

    def noting_what_is_left(*args: Any) -> Any:
        given.append(args[-1])
        return compute(*args)

    monkeypatch.setattr(apart, "compute", noting_what_is_left)
    threading.Timer(1.0, held.release).start()
    response = app.test_client().post("/status/sync", data=b"{}")
    assert response.status_code == 500
    # about the second it waited is spent: the child never gets the whole two again
    [left] = given
    assert left < 1.5, left
    assert memory.reserved_bytes == 0


def test_past_its_deadline_the_answer_is_not_waited_for_a_moment_longer() -> None:
    class Silent:
        def __init__(self) -> None:
            self.waits: list[float | None] = []

        def poll(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout)
            return False

    ours = Silent()
    with pytest.raises(FailedElsewhere):
        apart._await_end(ours, no_view, deadline=time.monotonic() - 1)  # type: ignore[arg-type]
    assert ours.waits == [0.0]


def test_a_client_gone_mid_body_kills_the_child(settings: Settings) -> None:
    def cut_short() -> Iterator[bytes]:
        yield b"{" * 1000
        raise ClientDisconnected()

    with pytest.raises(ClientDisconnected):
        apart.compute(hook_of(digest), inputs(settings), no_view, cut_short(), 4000, 30.0)
    assert hook_children() == []


def test_a_hook_computed_apart_cannot_read_budgets(settings: Settings) -> None:
    with pytest.raises(FailedElsewhere) as failed:
        apart.compute(hook_of(reads_budgets), inputs(settings), no_view, iter([b"{}"]), 2, 30.0)
    assert failed.value.error_type == "RuntimeError"


def test_every_pure_hook_travels_by_reference() -> None:
    import pickle

    for hook in PURE:
        assert pickle.loads(pickle.dumps(hook)) == hook


def test_the_child_computing_a_hook_is_named_after_it_and_ends_with_the_serving_process(
    settings: Settings,
) -> None:
    """Named, it is told apart from any other child (`hook_children`); a daemon, it is ended
    when the process that started it ends."""
    seen: list[tuple[str, bool]] = []

    class Reader:
        def view(self) -> KubeVirtView:  # asked for by the child, mid-computation
            seen.extend((p.name, bool(p.daemon)) for p in multiprocessing.active_children())
            return KubeVirtAbsent("cozy-kubevirt/kubevirt")

    app = create_app(settings, kubevirt=Reader(), apart_from_bytes=0)  # type: ignore[arg-type]
    assert (
        app.test_client().post("/status/sync", data=example_of("/status/sync")).status_code == 200
    )
    assert seen == [("hook /status/sync", True)]


def test_the_reservation_is_held_while_the_child_computes(settings: Settings) -> None:
    memory = MemoryBudget(100 * 1024 * KIB, max_wait_seconds=1, bypass_below_bytes=1)
    held: list[int] = []

    class Reader:
        def view(self) -> KubeVirtView:  # asked for by the child, mid-computation
            held.append(memory.reserved_bytes)
            return KubeVirtAbsent("cozy-kubevirt/kubevirt")

    app = create_app(settings, kubevirt=Reader(), memory=memory, apart_from_bytes=0)  # type: ignore[arg-type]
    body = example_of("/status/sync")
    assert app.test_client().post("/status/sync", data=body).status_code == 200
    assert held == [memory.share(len(body))]
    assert memory.reserved_bytes == 0


def niceness(inputs: HookInputs, body: bytes) -> Answer:
    return Answer(b"{}", {"niceness": os.nice(0)})


def test_children_run_below_the_serving_process(settings: Settings) -> None:
    answer = apart.compute(hook_of(niceness), inputs(settings), no_view, iter([b"{}"]), 2, 30.0)
    # the child is niced further, as far as the system allows (a suite run under nice too)
    assert answer.facts["niceness"] == min(os.nice(0) + apart.CHILD_NICENESS, 19)


def test_the_serving_thread_reads_a_body_as_batch_work_and_then_returns_to_normal(
    settings: Settings,
) -> None:
    policies: list[int] = []

    def noting_the_policy() -> Iterator[bytes]:
        policies.append(os.sched_getscheduler(0))
        yield b"{}"

    apart.compute(hook_of(digest), inputs(settings), no_view, noting_the_policy(), 2, 30.0)
    assert policies == [os.SCHED_BATCH]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_a_forked_process_computes_apart_with_a_fork_server_of_its_own(settings: Settings) -> None:
    # A test runner may fork a run of the suite after an earlier run started the fork server
    # (mutmut does, for each mutant): the parent's is not the child's to check or use.
    apart.start()
    parent_server = multiprocessing.forkserver._forkserver._forkserver_pid
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit code
        try:
            answer = apart.compute(
                hook_of(digest), inputs(settings), no_view, iter([b"{}"]), 2, 30.0
            )
            own_server = multiprocessing.forkserver._forkserver._forkserver_pid
            os._exit(0 if answer.facts["length"] == 2 and own_server != parent_server else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert multiprocessing.forkserver._forkserver._forkserver_pid == parent_server


def test_the_fork_server_imports_neither_flask_prometheus_nor_requests() -> None:
    """The fork server preloads `hooks.serving.apart`, and every child starts from what it
    imported: a web framework, the metrics or an HTTP client there is memory every large call
    pays for."""
    heavy = ("flask", "werkzeug", "prometheus_client", "requests", "gunicorn")
    script = (
        "import sys, hooks.serving.apart; "
        f"print(','.join(m for m in {heavy!r} if m in sys.modules) or 'none')"
    )
    root = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "none"
    assert apart.__name__ in apart.PRELOADED


def apart_outcomes(metrics: Metrics) -> dict[str, float]:
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(metrics.exposition()[0].decode())
        for sample in family.samples
        if sample.name == "cozystack_gpu_hook_apart_calls_total"
    }


def test_a_call_runs_apart_from_exactly_the_threshold(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    body = example_of("/status/sync")
    client = create_app(settings, apart_from_bytes=len(body) + 1).test_client()
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        client.post("/status/sync", data=body)
        client.post("/status/sync", data=padded(body, len(body) + 1))
    assert [facts.get("computed_apart", False) for facts in call_facts(caplog)] == [False, True]


def test_each_call_computed_apart_is_counted_by_how_it_ended(settings: Settings) -> None:
    import hooks.serving.app

    metrics = Metrics(180.0)
    with pytest.MonkeyPatch.context() as patch:
        raising = Hook("/test/raises", "metacontroller", raises, COMPOSITE_SYNCED, apart=True)
        patch.setattr(hooks.serving.app, "HOOKS", (*HOOKS, raising))
        client = create_app(settings, metrics=metrics, apart_from_bytes=0).test_client()
    bad = json.loads(example_of("/status/sync"))
    bad["parent"]["kind"] = "ConfigMap"
    client.post("/status/sync", data=example_of("/status/sync"))
    client.post("/status/sync", json=bad)
    client.post("/test/raises", data=b"{}")
    client.post(
        "/status/sync",
        input_stream=io.BytesIO(b"{}"),
        environ_overrides={"CONTENT_LENGTH": "100"},  # the client goes before its body is whole
    )
    assert apart_outcomes(metrics) == {
        "answered": 1.0,
        "bad_request": 1.0,
        "RuntimeError": 1.0,
        "not_read": 1.0,
    }
    assert hook_children() == []


def test_a_call_is_counted_in_progress_while_it_is_answered(settings: Settings) -> None:
    metrics = Metrics(180.0)
    seen: list[float] = []

    class Reader:
        def view(self) -> KubeVirtView:  # asked for mid-computation
            seen.append(metrics.calls_in_progress._value.get())
            return KubeVirtAbsent("cozy-kubevirt/kubevirt")

    client = create_app(settings, kubevirt=Reader(), metrics=metrics).test_client()  # type: ignore[arg-type]
    assert client.post("/status/sync", data=example_of("/status/sync")).status_code == 200
    client.post("/status/sync", data=b"{")  # a 400 is counted and uncounted too
    assert seen == [1.0]
    assert metrics.calls_in_progress._value.get() == 0.0


class FakeChild:
    """A child process as `_start` sees one: its start may take a while, or fail."""

    def __init__(self, start_seconds: float = 0.0, error: BaseException | None = None) -> None:
        self.start_seconds, self.error = start_seconds, error
        self.killed = threading.Event()
        self.started_by: tuple[str, bool] | None = None

    def start(self) -> None:
        self.started_by = (threading.current_thread().name, threading.current_thread().daemon)
        time.sleep(self.start_seconds)
        if self.error is not None:
            raise self.error

    def kill(self) -> None:
        self.killed.set()

    def join(self, timeout: float | None = None) -> None:
        pass


def test_a_child_the_fork_server_starts_too_late_is_given_up_then_killed() -> None:
    late = FakeChild(start_seconds=0.3)
    with pytest.raises(FailedElsewhere) as failed:
        apart._start(late, time.monotonic() + 0.05)  # type: ignore[arg-type]
    assert (failed.value.error_type, failed.value.frames) == (
        "StartTimedOut",
        ["the fork server did not start a child in time"],
    )
    assert late.killed.wait(5), "the child that started after the call gave up still runs"
    # started by a thread of its own that never holds up the end of the process
    assert late.started_by == ("fork server start", True)


@pytest.mark.parametrize("error", [EOFError(), ConnectionRefusedError(), BrokenPipeError()])
def test_a_fork_server_that_died_is_a_named_failure_at_once(error: BaseException) -> None:
    """Answered 500 naming it (`ForkServerDied`, counted so), never an unexpected error; at once,
    not at the call's deadline."""
    started = time.monotonic()
    with pytest.raises(FailedElsewhere) as failed:
        apart._start(FakeChild(error=error), started + 30)  # type: ignore[arg-type]
    assert failed.value.error_type == "ForkServerDied"
    assert failed.value.frames == [
        f"the fork server did not start the child ({type(error).__name__})"
    ]
    assert time.monotonic() - started < 15


def test_a_fork_server_killed_under_load_is_started_again_for_the_next_call(
    settings: Settings,
) -> None:
    apart.start()
    forkserver = multiprocessing.forkserver._forkserver  # type: ignore[attr-defined]
    os.kill(forkserver._forkserver_pid, signal.SIGKILL)
    answers = []
    for _ in range(3):
        try:
            answers.append(
                apart.compute(hook_of(digest), inputs(settings), no_view, iter([b"{}"]), 2, 30.0)
            )
        except FailedElsewhere as failure:
            assert failure.error_type == "ForkServerDied"
    assert answers, "no call was answered after the fork server died"
    assert hook_children() == []


def test_a_child_dead_before_its_body_is_handed_over_is_a_failure_naming_the_hook(
    settings: Settings,
) -> None:
    def the_child_killed_meanwhile() -> Iterator[bytes]:
        [child] = [p for p in multiprocessing.active_children() if p.name.startswith("hook ")]
        child.kill()
        child.join(5)
        yield b"{}"

    with pytest.raises(FailedElsewhere) as failed:
        apart.compute(
            hook_of(digest), inputs(settings), no_view, the_child_killed_meanwhile(), 2, 30.0
        )
    assert (failed.value.error_type, failed.value.frames) == (
        "ChildDied",
        ["the process computing /status/sync ended (killed by signal 9)"],
    )
    assert hook_children() == []
