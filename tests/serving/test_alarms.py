"""The one thread that cuts off bodies past their deadline (`hooks.serving.body.Alarms`)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hooks.serving.app import create_app
from hooks.serving.body import Alarms
from hooks.settings import Settings
from tests.serving.test_http import EXAMPLES

# Long enough that an alarm rung early or late is told apart from one rung on time on a busy
# machine, short enough to keep the tests quick.
SOON = 0.1


def test_an_alarm_runs_its_action_at_its_time_not_before() -> None:
    rung = threading.Event()
    set_at = time.monotonic()
    Alarms().set(SOON, rung.set)
    assert not rung.wait(SOON / 2)
    assert rung.wait(5)
    assert time.monotonic() - set_at >= SOON


def test_a_cancelled_alarm_never_runs() -> None:
    alarms = Alarms()
    rung = threading.Event()
    cancel = alarms.set(SOON, rung.set)
    later = threading.Event()
    alarms.set(2 * SOON, later.set)
    cancel()
    assert later.wait(5)  # the thread went past the cancelled alarm's time
    assert not rung.is_set()


def test_an_earlier_alarm_set_later_wakes_the_thread_waiting_for_a_later_one() -> None:
    alarms = Alarms()
    cancel_late = alarms.set(60, lambda: None)
    time.sleep(SOON)  # the thread has started and waits a minute
    rung = threading.Event()
    alarms.set(SOON, rung.set)
    assert rung.wait(5)
    cancel_late()


def test_alarms_ring_in_the_order_of_their_times_not_of_their_setting() -> None:
    alarms = Alarms()
    rung: list[str] = []
    done = threading.Event()
    alarms.set(2 * SOON, lambda: (rung.append("late"), done.set()))
    alarms.set(SOON, lambda: rung.append("early"))
    assert done.wait(5)
    assert rung == ["early", "late"]


def test_any_number_of_alarms_takes_one_daemon_thread() -> None:
    alarms = Alarms()
    before = set(threading.enumerate())  # other tests' threads may end meanwhile
    cancels = [alarms.set(60, lambda: None) for _ in range(50)]
    started = set(threading.enumerate()) - before
    # a daemon: an alarm still waiting never holds up the end of the process
    assert [(t.name, t.daemon) for t in started] == [("alarms", True)]
    for cancel in cancels:
        cancel()


def test_a_failing_action_does_not_stop_the_alarms_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    alarms = Alarms()
    rung = threading.Event()

    def fail() -> None:
        raise RuntimeError("broken action")

    alarms.set(SOON / 2, fail)
    alarms.set(SOON, rung.set)
    assert rung.wait(5)
    [failed] = [r for r in caplog.records if r.getMessage() == "alarm failed"]
    assert "RuntimeError: broken action" in failed.fields["traceback"]  # type: ignore[attr-defined]


def test_alarms_set_after_every_earlier_one_rang_still_ring() -> None:
    """The thread waits for new alarms when none is due, and wakes for each."""
    alarms = Alarms()
    for _ in range(3):
        rung = threading.Event()
        alarms.set(SOON, rung.set)
        assert rung.wait(5)
        time.sleep(SOON)  # the thread back to waiting with nothing due


def test_a_forked_child_rings_its_own_alarms() -> None:
    # gunicorn forks its workers: the parent's alarm thread does not exist in the child, which
    # must start its own instead of queueing alarms nobody rings.
    alarms = Alarms()
    alarms.set(60, lambda: None)  # the parent's thread runs
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit code
        rung = threading.Event()
        alarms.set(SOON, rung.set)
        os._exit(0 if rung.wait(5) else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_call_with_a_body_starts_no_thread(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its deadline is an alarm on the process's one thread, started once (a timer thread per
    # call is what the alarms replaced).
    client = create_app(settings).test_client()
    body = (EXAMPLES / "status-customize.json").read_bytes()
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for _ in range(20):
        response = client.post("/status/customize", data=body, content_type="application/json")
        assert response.status_code == 200
    assert len(started) <= 1
    assert set(started) <= {"alarms"}
