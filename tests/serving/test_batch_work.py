"""The serving thread's scheduling while it reads a large body
(`hooks.serving.apart.batch_work`)."""

from __future__ import annotations

import os
import threading

import pytest

from hooks.serving.apart import batch_work


def test_batch_work_changes_only_the_calling_thread_and_only_for_the_block() -> None:
    seen: dict[str, int] = {}

    def in_a_thread() -> None:
        with batch_work():
            seen["inside"] = os.sched_getscheduler(0)
            seen["main thread meanwhile"] = os.sched_getscheduler(threading.main_thread().native_id)
        seen["after"] = os.sched_getscheduler(0)

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == {
        "inside": os.SCHED_BATCH,
        "main thread meanwhile": os.SCHED_OTHER,
        "after": os.SCHED_OTHER,
    }


def test_batch_work_returns_to_normal_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), batch_work():
        raise RuntimeError("client gone")
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_batch_work_runs_the_block_unchanged_where_the_policy_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(*_: object) -> None:
        raise PermissionError("not here")

    monkeypatch.setattr(os, "sched_setscheduler", refused)
    ran = []
    with batch_work():
        ran.append(True)
    assert ran == [True]


def test_batch_work_keeps_the_block_going_when_normal_scheduling_cannot_be_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The thread stays batch work (the same weight, only no wake-up preemption): better than
    # failing a call whose body was read and answered.
    set_policy = os.sched_setscheduler
    calls: list[int] = []

    def batch_only(pid: int, policy: int, param: os.sched_param) -> None:
        calls.append(policy)
        if policy != os.SCHED_BATCH:
            raise PermissionError("not back")
        set_policy(pid, policy, param)

    monkeypatch.setattr(os, "sched_setscheduler", batch_only)
    try:
        with batch_work():
            pass
    finally:
        set_policy(0, os.SCHED_OTHER, os.sched_param(0))
    assert calls == [os.SCHED_BATCH, os.SCHED_OTHER]
