"""Structured logs: one JSON object per line, fields given explicitly, never object contents.

Logging never blocks serving: a line is formatted by whoever logs it, then handed to a bounded
queue that one writer thread drains into stderr. When stderr is not read (a stalled log
pipeline), the writer waits, the queue fills, and further lines are dropped and counted instead
of holding the event loop or a hook's thread; the writer says how many once it can write again.

gunicorn forks its workers from a process whose writer may be writing at that moment, and a
lock held at a fork stays held in the child for ever. So the writer writes to the file
descriptor itself (a Python stream has a lock of its own around its buffer), and a forked
process starts with its own queue, lock and writer.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import traceback
import weakref
from datetime import UTC, datetime
from typing import Any

LOGGER = logging.getLogger("gpuclass_hooks")


class JsonFormatter(logging.Formatter):
    """Our lines and the serving stack's (gunicorn's) alike: a line of another logger names it,
    and an exception is its type and last frames (its message may quote input)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        if record.name != LOGGER.name:
            line["logger"] = record.name
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            line["error"] = type(error).__name__
            line["frames"] = traceback.format_tb(error.__traceback__)[-3:]
        line.update(getattr(record, "fields", {}))
        return json.dumps(line, separators=(",", ":"), default=str)


STDERR = 2  # the descriptor: the writer writes to it directly
QUEUED_LINES = 10_000
FLUSH_SECONDS = 1.0


class QueuedStream(logging.Handler):
    """Lines for the file descriptor `fd`, written by one thread of this process; a line that
    finds the queue full is dropped and counted, never waited for."""

    def __init__(self, fd: int, capacity: int = QUEUED_LINES) -> None:
        super().__init__()
        self.fd = fd
        self.dropped = 0  # since the process started
        self._capacity = capacity
        self._unsaid = 0  # dropped since the writer last said so
        self._count = threading.Lock()
        self._writer_pid = -1
        self._lines: queue.Queue[str] = queue.Queue(capacity)
        _HANDLERS.add(self)

    def _forked(self) -> None:
        """In a child of a fork: the parent's writer is not here, and may have held the lock."""
        self._count = threading.Lock()
        self._lines = queue.Queue(self._capacity)
        self._writer_pid = -1

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        if self._writer_pid != os.getpid():
            self._start_writer()  # this process's own: a forked worker has no thread of its parent
        try:
            self._lines.put_nowait(line)
        except queue.Full:
            with self._count:
                self.dropped += 1
                self._unsaid += 1

    def _start_writer(self) -> None:
        with self._count:
            if self._writer_pid == os.getpid():
                return
            self._lines = queue.Queue(self._capacity)
            self._writer_pid = os.getpid()
        threading.Thread(target=self._write_forever, name="log writer", daemon=True).start()

    def _write_forever(self) -> None:
        lines = self._lines
        while True:
            line = lines.get()
            self._write(line)
            lines.task_done()
            with self._count:
                unsaid, self._unsaid = self._unsaid, 0
            if unsaid:
                record = logging.LogRecord(LOGGER.name, logging.WARNING, "", 0, "", (), None)
                record.msg = "log lines dropped"
                record.fields = {"count": unsaid, "reason": "stderr was not read in time"}
                self._write(self.format(record))

    def flush(self, seconds: float = FLUSH_SECONDS) -> None:
        """Wait, at most `seconds`, for the lines queued so far to be written (at exit)."""
        end = time.monotonic() + seconds
        while self._lines.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)

    def _write(self, line: str) -> None:
        data = memoryview((line + "\n").encode())
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError:
            pass  # stderr closed: nothing to tell anyone


_HANDLERS: weakref.WeakSet[QueuedStream] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for handler in list(_HANDLERS):
        handler._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def dropped_lines() -> int:
    """Log lines this process dropped because stderr was not read in time."""
    return sum(h.dropped for h in LOGGER.handlers if isinstance(h, QueuedStream))


def configure(level: str = "info") -> None:
    """Send the service's logs to stderr as JSON lines, from `level` up, through a queue that
    never blocks the caller (idempotent: a second call changes nothing)."""
    if any(isinstance(h.formatter, JsonFormatter) for h in LOGGER.handlers):
        return
    handler = QueuedStream(STDERR)
    handler.setFormatter(JsonFormatter())
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level.upper())
    LOGGER.propagate = False


def log(level: int, event: str, **fields: Any) -> None:
    LOGGER.log(level, event, extra={"fields": fields})


def log_unexpected(where: str, kind: str, frames: list[str]) -> None:
    """An error of the service's own: its type and last frames, never its message (it may quote
    input)."""
    log(logging.ERROR, "unexpected error", route=where, error=kind, frames=frames)
