"""Large sync calls computed in a process of their own, so that the serving process stays quick.

A large status sync spends about a second in msgspec's decode and the rules, and holds the
interpreter lock all along: every other call the process serves meanwhile (customize hooks,
license syncs, admission reviews, probes, scrapes) waits for it. So a call to a hook that needs
nothing but its body, the settings, the clock and the KubeVirt view (`Hook.apart`), whose body is
large, is computed in a child process:

- The serving thread reads the body straight into memory it shares with the child (an anonymous
  memory file, not /dev/shm, whose size containers cap), and hands the child that file: the body
  exists once, so the memory budget's share still covers the call, and everything the child held
  is given back to the system when it exits.
- The child decodes, runs the rules and encodes; it asks the serving process for the KubeVirt view
  if the rules need it (the serving process reads and caches it, as for any call), and sends back
  the `Answer`, which the serving process logs, records in its metrics and sends.
- Children come from a fork server that has the hooks imported, so a child starts in milliseconds
  and is never a fork of the threaded serving process (whose locks other threads may hold).

A bad request is answered 400 as in the serving process. Anything else that goes wrong (a fork
server that does not start the child, an error or a crash in the child, no answer within the hook
timeout, `GPUCLASS_HOOK_TIMEOUT`, by which the caller has given up) kills the child and answers 500;
nothing was applied, and Metacontroller retries.
"""

from __future__ import annotations

import gc
import mmap
import multiprocessing
import multiprocessing.forkserver
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import datetime
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Literal, NoReturn, cast

from hooks.routes import Answer, FailedElsewhere, Hook, HookInputs
from hooks.rules.permitted_devices import KubeVirtView
from hooks.settings import Settings
from hooks.wire.problems import BadRequest

# Large calls are batch work next to the small calls the serving process answers meanwhile: at a
# lower priority, a child yields the CPU to them at once instead of at the scheduler's next turn,
# and still has every cycle nobody else wants.
CHILD_NICENESS = 10

# What the fork server imports before it forks a child: this module and the handlers it reaches,
# which keep Flask, prometheus-client and requests out (checked by the import contracts).
PRELOADED = (__name__,)
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(list(PRELOADED))


def _own_fork_server() -> None:
    """After a fork: this process starts a fork server of its own when it first needs one.

    The parent's fork server is not this process's child, so multiprocessing could not tell
    whether it still runs (its check waits for it as for a child, and fails), and this process
    would keep it alive. gunicorn forks its workers before any starts one; a test runner that
    forks a run of the suite after an earlier run started one (mutmut does, for each mutant) is
    what needs this. It resets multiprocessing's own record of its fork server, which has no
    public way to forget one.
    """
    _forget_fork_server()
    server: Any = multiprocessing.forkserver._forkserver
    server._lock = threading.Lock()  # another thread may have held it at the fork


def _forget_fork_server() -> None:
    """Forget the fork server (after a fork, or when it died under a call): the next call
    starts a new one. multiprocessing restarts one it finds dead only if it can still wait for
    it, which a fork server reaped elsewhere, or killed mid-call, does not always allow."""
    server: Any = multiprocessing.forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        with suppress(OSError):
            os.close(server._forkserver_alive_fd)  # this copy alone would keep it alive
    server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None


def _fork_server_died() -> None:
    """Forget the fork server that died under a call, reaping it if this process can."""
    server: Any = multiprocessing.forkserver._forkserver
    with server._lock:
        pid = server._forkserver_pid
        if pid is not None:
            with suppress(OSError):
                os.waitpid(pid, os.WNOHANG)
        _forget_fork_server()


os.register_at_fork(after_in_child=_own_fork_server)


@dataclass(frozen=True)
class Inputs:
    """What a hook computed apart reads besides its body, sent to the child (the view only on
    request)."""

    settings: Settings
    now: datetime


# From the child: a request for the KubeVirt view, or how the call ended.
_KUBEVIRT = ("kubevirt",)
Ended = (
    tuple[Literal["answer"], Answer]
    | tuple[Literal["bad_request"], str]
    | tuple[Literal["failed"], str, list[str]]
)


def supported() -> bool:
    """Whether calls can be computed apart here: the body is handed over in an anonymous memory
    file, which only Linux has (`os.memfd_create`). Elsewhere (`make run` on macOS, say) every
    call is computed in its thread, as small calls always are."""
    return hasattr(os, "memfd_create")


def start() -> None:
    """Start the fork server and wait until it has the hooks imported (about a second): the
    first large call then does not wait for it, and a worker that is up has one ready. A fork
    server that cannot start stops the worker here, at boot, and gunicorn says why."""
    ready = _CONTEXT.Process(target=_nothing)
    try:
        ready.start()  # the fork server forks only once its imports are done
    except (OSError, EOFError) as error:
        raise ForkServerFailed(
            f"the fork server for large calls did not start ({error!r})"
        ) from None
    ready.join()


class ForkServerFailed(RuntimeError):
    """The worker cannot compute large calls: it must not serve."""


def _nothing() -> None:
    pass


def compute(
    hook: Hook,
    inputs: Inputs,
    kubevirt: Callable[[], KubeVirtView],
    chunks: Iterator[bytes | memoryview],
    length: int,
    deadline_seconds: float,
) -> Answer:
    """The hook's answer to a body of `length` bytes read from `chunks`, computed in a child
    (the hook travels by reference: its handler must be a module-level function), within
    `deadline_seconds` from now.

    Raises BadRequest as the hook would; FailedElsewhere when the child could not be started, or
    failed or ran out of time; and whatever reading `chunks` raises (a client gone or stalled
    mid-body), after killing the child.
    """
    deadline = time.monotonic() + deadline_seconds
    ours, theirs = _CONTEXT.Pipe()
    body_out, body_in = socket.socketpair()  # hands the child the body's memory file
    child = _CONTEXT.Process(
        target=_serve_one,
        args=(hook, inputs, length, theirs, body_in),
        name=f"hook {hook.path}",
        daemon=True,
    )
    try:
        _start(child, deadline)  # it starts while the body is read
    except BaseException:
        ours.close()
        body_out.close()
        raise
    finally:
        theirs.close()
        body_in.close()
    try:
        with body_out:
            with batch_work():
                body = _shared_body(chunks)  # a client gone mid-body raises here
            try:
                socket.send_fds(body_out, [b"body"], [body])
            except OSError:
                _died(hook.path, child)
            finally:
                os.close(body)  # the child holds its own reference now
        try:
            ended = _await_end(ours, kubevirt, deadline)
        except (EOFError, OSError):
            _died(hook.path, child)
    except BaseException:
        child.kill()
        child.join()
        raise
    finally:
        ours.close()
    # A child that answered is left to exit on its own (freeing its memory takes it a few tens of
    # milliseconds, which the caller need not wait for); multiprocessing reaps it.
    if ended[0] == "answer":
        return replace(ended[1], facts={**ended[1].facts, "computed_apart": True})
    if ended[0] == "bad_request":
        raise BadRequest(ended[1])
    raise FailedElsewhere(ended[1], ended[2])


@contextmanager
def batch_work() -> Iterator[None]:
    """The calling thread scheduled as batch work (Linux's SCHED_BATCH) until the block ends.

    Copying a large body from its connection into the memory file is work the kernel does in
    the serving thread; as batch work, it no longer takes the core from a thread woken for a
    small call, which runs at once instead of after its time slice. The niceness stays, so the
    thread returns to normal scheduling without privileges (a container without capabilities
    included); where the policy is missing or refused, nothing changes.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        yield
        return
    try:
        yield
    finally:
        with suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def _shared_body(chunks: Iterator[bytes | memoryview]) -> int:
    """A memory file holding the body read from `chunks`; its descriptor. Written with write(2),
    which copies twice as fast as a mapping would and lets go of the interpreter lock."""
    body = os.memfd_create("hook-body", os.MFD_CLOEXEC)
    try:
        for chunk in chunks:
            written = 0
            while written < len(chunk):
                written += os.write(body, memoryview(chunk)[written:])
    except BaseException:
        os.close(body)
        raise
    return body


def _start(child: BaseProcess, deadline: float) -> None:
    """Start the child through the fork server, or give up at the deadline: a fork server that
    does not answer (stopped, or swapped out) must not hold the call, and its reservation,
    forever. A child that starts after the call gave up is killed at once."""
    decided = threading.Lock()
    started = threading.Event()
    abandoned: list[bool] = []
    failure: list[BaseException] = []

    def start() -> None:
        try:
            child.start()
        except BaseException as error:  # reported to the waiting call, or dropped with it
            failure.append(error)
        with decided:
            if not abandoned:
                started.set()
                return
        if not failure:
            child.kill()
            child.join()

    threading.Thread(target=start, name="fork server start", daemon=True).start()
    if not started.wait(max(0.0, deadline - time.monotonic())):
        with decided:
            if not started.is_set():
                abandoned.append(True)
                raise FailedElsewhere(
                    "StartTimedOut", ["the fork server did not start a child in time"]
                )
    if failure:
        error = failure[0]
        if isinstance(error, EOFError | OSError):
            # The fork server died (killed, or out of memory) under the call: the next call
            # starts a new one.
            _fork_server_died()
            raise FailedElsewhere(
                "ForkServerDied",
                [f"the fork server did not start the child ({type(error).__name__})"],
            )
        raise error


def _await_end(ours: Connection, kubevirt: Callable[[], KubeVirtView], deadline: float) -> Ended:
    while ours.poll(max(0.0, deadline - time.monotonic())):
        message: Any = ours.recv()
        if message == _KUBEVIRT:
            ours.send(kubevirt())
            continue
        ended: Ended = message
        return ended
    raise FailedElsewhere("DeadlineExceeded", ["no answer within the hook timeout"])


def _died(path: str, child: BaseProcess) -> NoReturn:
    child.join(1.0)
    exitcode = child.exitcode
    how = f"killed by signal {-exitcode}" if exitcode and exitcode < 0 else f"exit code {exitcode}"
    raise FailedElsewhere("ChildDied", [f"the process computing {path} ended ({how})"])


def _receive(body_in: socket.socket, length: int) -> mmap.mmap | bytes | None:
    """The body, mapped from the memory file the serving process hands over; None when it gave up
    before (its caller went away)."""
    with body_in:
        _, handed, _, _ = socket.recv_fds(body_in, 16, 1)
    if not handed:
        return None
    if not length:
        os.close(handed[0])
        return b""
    try:
        # Mapped read-only, its pages faulted in at once rather than one by one by the decoder.
        return mmap.mmap(
            handed[0], length, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ
        )
    finally:
        os.close(handed[0])


def _serve_one(
    hook: Hook, inputs: Inputs, length: int, parent: Connection, body_in: socket.socket
) -> None:
    """In the child: receive the body, answer it, send the end back."""
    os.nice(CHILD_NICENESS)
    # Every object the child inherits lives as long as it does: the collector need never walk
    # them, and walking them (the hooks' imports) was most of what a fresh child's first
    # collections cost.
    gc.freeze()
    body = _receive(body_in, length)
    if body is None:
        return
    ended: Ended
    try:

        def kubevirt() -> KubeVirtView:
            parent.send(_KUBEVIRT)
            view: KubeVirtView = parent.recv()
            return view

        service = HookInputs(inputs.settings, kubevirt, _NoBudgets(), lambda: inputs.now)
        # msgspec decodes any buffer, and its Raw values point into it: a copy to bytes would
        # double the call's largest allocation.
        ended = ("answer", hook.handle(service, cast(bytes, body)))
    except BadRequest as error:
        ended = ("bad_request", str(error))
    except Exception as error:
        # Only the type and frames travel, as in the serving process: a message may quote input.
        ended = ("failed", type(error).__name__, traceback.format_tb(error.__traceback__)[-3:])
    with suppress(OSError):  # the serving process gave up on us
        parent.send(ended)


class _NoBudgets:
    """Pure hooks read no budgets; a hook that does is not pure, and this says so."""

    def catalog(self) -> NoReturn:
        raise RuntimeError(
            "a hook computed in a child read GPU budgets: it may not be computed apart"
        )

    def tenancy(self, namespaces: object, subtrees: object = ()) -> NoReturn:
        raise RuntimeError(
            "a hook computed in a child read GPU budgets: it may not be computed apart"
        )
