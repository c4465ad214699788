"""A memory budget for request bodies in flight, so that load cannot get the pod killed.

A large status sync costs far more memory than its body: measured by the benchmark, a body
expands about 1.5x into the bytes read and the decoded objects for one request alone (1.2x each
for five at once), and the process computing it costs some tens of megabytes more. Metacontroller
runs five workers per controller, ten calls can arrive together, and the kernel kills a pod past
its limit, losing every call in flight. So a call reserves `EXPANSION x Content-Length +
PER_CALL_BYTES` before it reads a byte, waits in arrival order while the budget is full, and gives
up after a bounded wait (the caller retries); the reservation is released when the call ends,
however it ends.

Small bodies (customize hooks, most license syncs, admission reviews) bypass the budget: they are
never stuck behind a large sync that waits, and together they fit in the memory the budget leaves
aside for the idle process.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hooks.settings import Settings

MIB = 1024 * 1024
EXPANSION = 1.5
# What a large call costs besides its expanded body: the process computing it (hooks.serving.apart),
# and buffers that do not grow with the body. Measured by `make bench`: 30-50 MB at S, M and L.
PER_CALL_BYTES = 48 * MIB
# A large call: its body reserves from the budget (smaller ones bypass it: one per thread,
# expanded, they stay within the reserve below), and a hook marked `apart` computes it in a
# process of its own. Where it begins is measured (docs/scale.md): below it, the fork costs more
# than it saves.
LARGE_BODY_BYTES = 512 * 1024
# What the budget leaves to the service itself: the idle worker, its fork server and
# multiprocessing's resource tracker (docs/scale.md has what they hold; large calls are computed
# in processes that give everything back when they exit); the rest is headroom for the calls that
# bypass the budget.
RESERVE_BYTES = 256 * MIB
# cgroup v1 writes "no limit" as a page-aligned 2^63 - 1.
_UNLIMITED_V1 = 2**62


def budget_for_limit(limit_bytes: int) -> int:
    """The default budget for a container memory limit: the limit less what the process keeps
    for itself (256 MiB, or half the limit when the limit is small)."""
    return limit_bytes - min(RESERVE_BYTES, limit_bytes // 2)


def container_memory_limit(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory limit of this container from cgroup v2 (`memory.max`) or v1
    (`memory/memory.limit_in_bytes`); None when there is none or it cannot be read."""
    for path in (cgroup_root / "memory.max", cgroup_root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        try:
            value = int(text)
        except ValueError:  # cgroup v2 says "max" for no limit
            return None
        return None if value >= _UNLIMITED_V1 else value
    return None


def configured_budget(
    budget_bytes: int | None,
    limit_bytes: int | None,
    read_limit: Callable[[], int | None] = container_memory_limit,
) -> int | None:
    """The budget in force: the one set (0 is none), else derived from the memory limit given or,
    failing that, the container's; no limit anywhere means no budget."""
    if budget_bytes is not None:
        return budget_bytes or None
    limit = limit_bytes if limit_bytes is not None else read_limit()
    return None if limit is None else budget_for_limit(limit)


@dataclass
class Admitted:
    """A reservation; `release` gives it back (once, however often it is called)."""

    share: int
    waited: float
    give_back: Callable[[int], None]
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.give_back(self.share)


@dataclass(frozen=True)
class NeverFits:
    """The call's share alone exceeds the whole budget: waiting cannot help."""

    share: int


@dataclass(frozen=True)
class TimedOut:
    """The budget stayed full for the whole wait: the caller should retry later."""

    share: int
    waited: float


Reservation = Admitted | NeverFits | TimedOut


def _nothing_to_give_back(share: int) -> None:
    pass


class MemoryBudget:
    """Bytes of request bodies in flight (expanded), granted first come, first served."""

    def __init__(
        self,
        budget_bytes: int,
        *,
        max_wait_seconds: float,
        expansion: float = EXPANSION,
        per_call_bytes: int = PER_CALL_BYTES,
        bypass_below_bytes: int = LARGE_BODY_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.max_wait_seconds = max_wait_seconds
        self.expansion = expansion
        self.per_call_bytes = per_call_bytes
        self.bypass_below_bytes = bypass_below_bytes
        self._clock = clock
        self._reserved = 0
        self._queue: deque[object] = deque()
        self._changed = threading.Condition()

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def share(self, body_bytes: int) -> int:
        return math.ceil(body_bytes * self.expansion) + self.per_call_bytes

    def reserve(self, body_bytes: int, wait_seconds: float | None = None) -> Reservation:
        """Wait, in arrival order, until the call's share fits; at most `max_wait_seconds`, and
        at most `wait_seconds` (what is left of the call's time) when given."""
        if body_bytes < self.bypass_below_bytes:
            return Admitted(0, 0.0, _nothing_to_give_back)
        share = self.share(body_bytes)
        if share > self.budget_bytes:
            return NeverFits(share)
        started = self._clock()
        ticket = object()
        with self._changed:
            self._queue.append(ticket)
            try:
                while self._queue[0] is not ticket or self._reserved + share > self.budget_bytes:
                    most = self.max_wait_seconds
                    if wait_seconds is not None:
                        most = min(most, wait_seconds)
                    remaining = started + most - self._clock()
                    if remaining <= 0:
                        return TimedOut(share, self._clock() - started)
                    self._changed.wait(remaining)
                self._reserved += share
            finally:
                self._queue.remove(ticket)
                self._changed.notify_all()  # the next in line may fit now
        return Admitted(share, self._clock() - started, self._give_back)

    def _give_back(self, share: int) -> None:
        with self._changed:
            self._reserved -= share
            self._changed.notify_all()


def memory_budget(settings: Settings) -> MemoryBudget | None:
    """The hooks' budget as the settings and the container's limit make it; None for none. A
    budget derived from the limit leaves aside the admission port's share
    (`GPUCLASS_ADMISSION_MEMORY_BYTES`, held by `hooks.serving.webhook`) and the share of the
    API's answers being read (`GPUCLASS_KUBE_READ_MAX_BYTES`, held by `hooks.kubeapi.client`)."""
    budget_bytes = configured_budget(settings.memory_budget_bytes, settings.memory_limit_bytes)
    if budget_bytes is None:
        return None
    if settings.memory_budget_bytes is None:
        aside = settings.admission_memory_bytes + settings.kube_read_max_bytes
        budget_bytes = max(budget_bytes - aside, budget_bytes // 2)
    return MemoryBudget(budget_bytes, max_wait_seconds=settings.memory_wait_seconds)
