"""The child's side of a call computed apart (`hooks.serving.apart._serve_one`), run in a thread
of this process: the same code a child of the fork server runs, reached here so that a broken
child is caught by tests that see it (test_apart.py drives whole calls through real children)."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from hooks.routes import COMPOSITE_SYNCED, Answer, Hook, HookInputs
from hooks.rules.permitted_devices import KubeVirtAbsent, KubeVirtView
from hooks.serving import apart
from hooks.settings import Settings
from hooks.wire.problems import BadRequest

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def served_here(
    handler: Callable[[HookInputs, bytes], Answer],
    body: bytes | None,
    settings: Settings,
    kubevirt: Callable[[], KubeVirtView] = lambda: KubeVirtAbsent("cozy-kubevirt/kubevirt"),
    length: int | None = None,
) -> tuple[Any, ...] | None:
    """What `_serve_one` sends back for `body` handed over as the serving process hands it (None
    hands nothing: the serving process gave up first); None when it sends nothing."""
    ours, theirs = multiprocessing.Pipe()
    body_out, body_in = socket.socketpair()
    hook = Hook("/status/sync", "metacontroller", handler, COMPOSITE_SYNCED, apart=True)
    size = len(body or b"") if length is None else length

    def child_process() -> None:
        try:
            apart._serve_one(hook, apart.Inputs(settings, NOW), size, theirs, body_in)
        finally:
            theirs.close()  # as the child's exit would

    child = threading.Thread(target=child_process)
    child.start()
    with body_out:
        if body is not None:
            shared = apart._shared_body(iter([body]))
            socket.send_fds(body_out, [b"body"], [shared])
            os.close(shared)
    try:
        while ours.poll(10):
            try:
                message = ours.recv()
            except EOFError:
                return None
            if message == ("kubevirt",):
                ours.send(kubevirt())
                continue
            return tuple(message)
        raise AssertionError("the child neither answered nor ended")
    finally:
        child.join(10)
        assert not child.is_alive()
        ours.close()


def facts_of(ended: tuple[Any, ...] | None) -> dict[str, Any]:
    assert ended is not None and ended[0] == "answer", ended
    answer: Answer = ended[1]
    return dict(answer.facts)


def test_the_child_answers_the_body_it_was_handed(settings: Settings) -> None:
    def echo(inputs: HookInputs, body: bytes) -> Answer:
        return Answer(bytes(body), {"length": len(body)}, about={"x": "y"})

    ended = served_here(echo, b'{"a": 1}', settings)
    assert ended == ("answer", Answer(b'{"a": 1}', {"length": 8}, about={"x": "y"}))


def test_the_child_maps_a_large_body_read_only_and_whole(settings: Settings) -> None:
    body = bytes(range(256)) * 4096  # a megabyte, not a page multiple short of its end

    def inspect(service: HookInputs, handed: bytes) -> Answer:
        view = memoryview(handed)
        return Answer(
            b"{}",
            {
                "mapped": isinstance(handed, mmap.mmap),
                "readonly": view.readonly,
                "same": handed[:] == body,
            },
        )

    assert facts_of(served_here(inspect, body, settings)) == {
        "mapped": True,
        "readonly": True,
        "same": True,
    }


def test_the_child_reads_only_the_declared_length(settings: Settings) -> None:
    def length(inputs: HookInputs, body: bytes) -> Answer:
        return Answer(b"{}", {"length": len(body), "tail": bytes(body[-2:])})

    assert facts_of(served_here(length, b"abcdef", settings, length=4)) == {
        "length": 4,
        "tail": b"cd",
    }


def test_the_child_hands_an_empty_body_as_empty_bytes(settings: Settings) -> None:
    def kind(inputs: HookInputs, body: bytes) -> Answer:
        return Answer(b"{}", {"body": body})

    assert facts_of(served_here(kind, b"", settings)) == {"body": b""}


def test_a_child_handed_no_body_sends_nothing(settings: Settings) -> None:
    def never(inputs: HookInputs, body: bytes) -> Answer:
        raise AssertionError("called without a body")

    assert served_here(never, None, settings) is None


def test_the_child_sees_the_settings_and_the_time_it_was_given(settings: Settings) -> None:
    def seen(inputs: HookInputs, body: bytes) -> Answer:
        return Answer(
            b"{}",
            {
                "settings": inputs.settings is not None and inputs.settings == settings,
                "now": inputs.clock(),
            },
        )

    assert facts_of(served_here(seen, b"{}", settings)) == {"settings": True, "now": NOW}


def test_the_child_asks_the_serving_process_for_the_kubevirt_view_each_time(
    settings: Settings,
) -> None:
    asked: list[int] = []

    def view() -> KubeVirtView:
        asked.append(1)
        return KubeVirtAbsent(f"read {len(asked)}")

    def twice(inputs: HookInputs, body: bytes) -> Answer:
        views = [inputs.kubevirt(), inputs.kubevirt()]
        return Answer(b"{}", {"views": [str(v) for v in views]})

    facts = facts_of(served_here(twice, b"{}", settings, kubevirt=view))
    assert len(asked) == 2
    assert "read 1" in facts["views"][0] and "read 2" in facts["views"][1]


def test_the_child_computes_at_a_lower_priority(settings: Settings) -> None:
    here = os.getpriority(os.PRIO_PROCESS, 0)

    def niceness(inputs: HookInputs, body: bytes) -> Answer:
        return Answer(b"{}", {"niceness": os.getpriority(os.PRIO_PROCESS, 0)})

    facts = facts_of(served_here(niceness, b"{}", settings))
    assert facts["niceness"] == min(here + apart.CHILD_NICENESS, 19)


def test_a_bad_request_in_the_child_comes_back_with_its_words(settings: Settings) -> None:
    def bad(inputs: HookInputs, body: bytes) -> Answer:
        raise BadRequest("related: not an object")

    assert served_here(bad, b"{}", settings) == ("bad_request", "related: not an object")


def test_an_error_in_the_child_comes_back_as_its_type_and_last_frames_only(
    settings: Settings,
) -> None:
    def third(body: bytes) -> None:
        raise KeyError(bytes(body))  # a message that quotes the input

    def second(body: bytes) -> None:
        third(body)

    def first(body: bytes) -> None:
        second(body)

    def fails(inputs: HookInputs, body: bytes) -> Answer:
        first(body)
        raise AssertionError("unreachable")

    ended = served_here(fails, b'{"token": "secret-token-value"}', settings)
    assert ended is not None
    kind, error_type, frames = ended
    assert (kind, error_type) == ("failed", "KeyError")
    assert [frame.splitlines()[0].rpartition(" in ")[2] for frame in frames] == [
        "first",
        "second",
        "third",
    ]
    assert "secret-token-value" not in repr(ended)


@pytest.mark.parametrize("read", ["catalog", "tenancy"])
def test_a_child_has_no_budgets_to_read(read: str) -> None:
    budgets: Any = apart._NoBudgets()
    with pytest.raises(
        RuntimeError,
        match=r"^a hook computed in a child read GPU budgets: it may not be computed apart$",
    ):
        getattr(budgets, read)(*([] if read == "catalog" else [("tenant-a",)]))


def test_a_child_whose_serving_process_gave_up_exits_quietly(settings: Settings) -> None:
    """The serving process closed its end while the child computed: the answer has nowhere to
    go, and the child ends without an error."""
    ours, theirs = multiprocessing.Pipe()
    body_out, body_in = socket.socketpair()
    started = threading.Event()

    def slow(inputs: HookInputs, body: bytes) -> Answer:
        started.set()
        time.sleep(0.2)
        return Answer(b"{}", {})

    hook = Hook("/status/sync", "metacontroller", slow, COMPOSITE_SYNCED, apart=True)
    errors: list[BaseException] = []

    def child() -> None:
        try:
            apart._serve_one(hook, apart.Inputs(settings, NOW), 2, theirs, body_in)
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=child)
    thread.start()
    with body_out:
        shared = apart._shared_body(iter([b"{}"]))
        socket.send_fds(body_out, [b"body"], [shared])
        os.close(shared)
    assert started.wait(10)
    ours.close()
    theirs.close()
    thread.join(10)
    assert not thread.is_alive()
    assert errors == []


def let_go(record: Any) -> int:
    """Forget this process's fork server as a forked process would; its pid. The server, which
    here is this process's child, is waited for, so that no other waiter (a test runner reaping
    its own children) meets it."""
    inherited: int = record._forkserver_pid
    apart._own_fork_server()
    deadline = time.monotonic() + 10
    while os.waitpid(inherited, os.WNOHANG) == (0, 0):
        assert time.monotonic() < deadline, "the inherited fork server is still running"
        time.sleep(0.01)
    return inherited


def test_after_a_fork_the_parents_fork_server_is_let_go_and_a_new_one_started(
    settings: Settings,
) -> None:
    """What a forked process does first (`os.register_at_fork`), called here: it forgets the
    fork server it inherited and closes its copy of the pipe that keeps that server alive (so
    the server, here this process's child, ends); its next large call starts one of its own."""
    apart.start()
    record: Any = multiprocessing.forkserver._forkserver
    alive_fd = record._forkserver_alive_fd
    lock = record._lock
    inherited = let_go(record)
    assert (record._forkserver_pid, record._forkserver_address, record._forkserver_alive_fd) == (
        None,
        None,
        None,
    )
    assert record._lock is not lock and not record._lock.locked()
    with pytest.raises(OSError):
        os.fstat(alive_fd)  # closed: this copy no longer keeps the inherited server alive
    apart.start()
    assert record._forkserver_pid not in (None, inherited)


def test_forgetting_no_fork_server_is_harmless() -> None:
    record: Any = multiprocessing.forkserver._forkserver
    if record._forkserver_pid is not None:
        let_go(record)
    apart._own_fork_server()  # nothing inherited: no descriptor to close
    assert record._forkserver_alive_fd is None


def test_a_hook_in_the_child_that_reads_budgets_fails_saying_it_is_not_pure(
    settings: Settings,
) -> None:
    def reads_budgets(inputs: HookInputs, body: bytes) -> Answer:
        inputs.budgets.catalog()
        raise AssertionError("unreachable")

    ended = served_here(reads_budgets, b"{}", settings)
    assert ended is not None and ended[:2] == ("failed", "RuntimeError")


def test_the_shared_body_is_a_memory_file_named_for_what_it_holds_and_continues_short_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """write(2) may write less than asked: the rest is written after it, never over it."""
    real_write = os.write

    def short_write(fd: int, data: Any) -> int:
        return real_write(fd, bytes(data[:1000]))

    monkeypatch.setattr(apart.os, "write", short_write)
    body = os.urandom(3500)
    shared = apart._shared_body(iter([body[:2500], body[2500:]]))
    try:
        # an anonymous memory file, not a file in /dev/shm, whose size containers cap
        assert os.readlink(f"/proc/self/fd/{shared}").startswith("/memfd:")
        assert os.pread(shared, 4000, 0) == body
    finally:
        os.close(shared)
