"""Request bodies read once, straight from the connection, under a deadline.

The body is never parsed by Flask (`get_json` would build a full dict tree of a request that can
weigh hundreds of megabytes, and keep it until the request ends), nor read through Werkzeug's
`get_data`, which copies it again at the end. A body that stops arriving times out on the socket;
one that still trickles in past its deadline is cut off by the one alarm thread (`Alarms`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from typing import Any

from flask import request
from werkzeug.exceptions import ClientDisconnected, RequestTimeout

from hooks.serving import gthread
from hooks.serving.logs import log

# Pieces a body is read in: large enough that the per-piece cost vanishes, small enough that the
# buffer a call reads them into costs little, and that copying one (a body read through a WSGI
# stream) holds the interpreter lock for a fraction of a millisecond (small calls answered
# meanwhile wait for it).
CHUNK_BYTES = 1024 * 1024


class Alarms:
    """Actions run at their time by one thread of the process, started when first needed.

    Every call with a body sets an alarm that almost never goes off. A timer thread each would
    cost every call, small ones included, a thread start and the handoffs of the interpreter lock
    that come with it, while other threads hold it.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # the thread is the parent's

    def _reset(self) -> None:
        # Entries are [time, order, action]; a cancelled or spent one has action None.
        self._due: list[list[Any]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def set(self, seconds: float, action: Callable[[], None]) -> Callable[[], None]:
        """Run `action` in `seconds`; returns the alarm's cancel. Once cancel returns, the action
        has either finished or will never run (actions run under the lock, so keep them short)."""
        alarm: list[Any] = [time.monotonic() + seconds, next(self._order), action]
        with self._changed:
            heapq.heappush(self._due, alarm)
            if self._thread is None:
                self._thread = threading.Thread(target=self._ring, name="alarms", daemon=True)
                self._thread.start()
            if self._due[0] is alarm:
                self._changed.notify()

        def cancel() -> None:
            with self._changed:
                alarm[2] = None

        return cancel

    def _ring(self) -> None:
        with self._changed:
            while True:
                while self._due and self._due[0][2] is None:
                    heapq.heappop(self._due)
                if not self._due:
                    self._changed.wait()
                    continue
                left = self._due[0][0] - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                alarm = heapq.heappop(self._due)
                action, alarm[2] = alarm[2], None
                try:
                    action()
                except Exception:  # one failing action must not stop the others' alarms
                    log(logging.ERROR, "alarm failed", traceback=traceback.format_exc())


ALARMS = Alarms()

# How long after its deadline a body that still trickles in is cut off (one that stopped arriving
# times out on the socket at the deadline itself).
CUT_AFTER_SECONDS = 1.0


class _Deadline:
    """The time a body has to arrive.

    A body that stops arriving times out on the socket at the deadline: the read raises, and the
    408 goes out on the same connection, TLS included. A client that keeps trickling bytes would
    restart that timeout with every read, so a moment later the connection's read side is shut:
    the stalled read returns at once, whatever the client sends (over TLS the connection can then
    only be closed, and is)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = threading.Event()
        self._socket: socket.socket | None = request.environ.get("gunicorn.socket")
        self._previous_timeout: float | None = None
        if self._socket is not None:
            self._previous_timeout = self._socket.gettimeout()
            self._socket.settimeout(seconds)
        self._cancel_cut = ALARMS.set(seconds + CUT_AFTER_SECONDS, self.cut)

    def cut(self) -> None:
        """The body is out of time: shut the connection's read side."""
        self.expired.set()
        if self._socket is not None:
            with suppress(OSError):
                # The plain socket's shutdown: TLS's would drop its state under a read.
                socket.socket.shutdown(self._socket, socket.SHUT_RD)

    def cancel(self) -> None:
        self._cancel_cut()
        if self._socket is not None and not self.expired.is_set():
            with suppress(OSError):
                self._socket.settimeout(self._previous_timeout)

    def timed_out(self) -> RequestTimeout:
        return RequestTimeout(
            f"the request body did not arrive within {self.seconds:g} s "
            "(GPUCLASS_BODY_TIMEOUT_SECONDS, GPUCLASS_BODY_MIN_BYTES_PER_SECOND)"
        )


class _ConnectionBody:
    """A body read straight from gunicorn's connection: first what gunicorn read past the headers,
    then the socket, into one buffer used again for each piece.

    Read through gunicorn's stream, every byte is copied several times by its buffers, each copy
    holding the interpreter lock: ten large bodies arriving at once made the small calls served
    meanwhile wait for it. gunicorn's own count of the unread body is kept in step with every
    piece, so that it drains exactly what is left before the next request on the connection (or
    closes it), whichever way the reading ends.
    """

    def __init__(
        self, connection: socket.socket, pending: gthread.PendingBody, length: int
    ) -> None:
        self._socket = connection
        self._pending = pending
        self._head = pending.take_buffered(length)
        self._buffer = memoryview(bytearray(min(length, CHUNK_BYTES)))

    @classmethod
    def of(cls, length: int) -> _ConnectionBody | None:
        """The request's body read from its connection, when gunicorn serves it and has given
        none of the body to the application yet; None otherwise (Flask's test client, another
        server): then the WSGI stream is read."""
        connection = request.environ.get("gunicorn.socket")
        pending = gthread.PendingBody.of(request.environ["wsgi.input"], length)
        if connection is None or pending is None:
            return None
        return cls(connection, pending, length)

    def read(self, size: int) -> bytes | memoryview:
        if self._head:
            piece: bytes | memoryview = self._head[:size]
            self._head = self._head[size:]
        else:
            piece = self._buffer[: self._socket.recv_into(self._buffer, min(size, CHUNK_BYTES))]
        self._pending.consumed(len(piece))
        return piece


def body_chunks(length: int, deadline_seconds: float) -> Iterator[bytes | memoryview]:
    """The declared body in pieces, each valid until the next is asked for (a piece read from the
    connection is a view of a buffer that the next read fills again), read under its deadline
    (408 past it); a client gone before the end raises ClientDisconnected."""
    source = _ConnectionBody.of(length)
    read = source.read if source is not None else request.environ["wsgi.input"].read
    deadline = _Deadline(deadline_seconds)
    left = length
    try:
        while left:
            try:
                chunk = read(min(left, CHUNK_BYTES))
            except TimeoutError:  # nothing arrived for the whole deadline
                # Shut its read side too: TLS can still carry the 408 (the read ended cleanly),
                # and nothing that reads on (gunicorn draining the body) can wait for it again.
                deadline.cut()
                raise deadline.timed_out() from None
            except (OSError, ValueError) as error:  # the read side shut under a trickling read
                if deadline.expired.is_set():
                    raise deadline.timed_out() from None
                raise ClientDisconnected() from error
            if deadline.expired.is_set():
                raise deadline.timed_out()
            if not chunk:
                raise ClientDisconnected()
            left -= len(chunk)
            yield chunk
    finally:
        deadline.cancel()


def joined(pieces: Iterable[bytes | memoryview]) -> bytes:
    """A body's pieces as bytes, joined once (Werkzeug's `get_data` copies again at the end,
    which on a large request costs more than decoding it)."""
    return b"".join([bytes(piece) for piece in pieces])
