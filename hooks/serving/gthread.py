"""What the service relies on of gunicorn's gthread worker and of the standard thread pool beyond
their public API, in this one module: how a connection whose head the edge read is handed to
gthread's `handle`, the bytes gunicorn's parser read past a request, the body reader's count of
what it has not read, the queue of calls waiting for a thread, and the clock of a worker's
heartbeat.

None of these is documented by gunicorn; `tests/serving/live/test_gthread.py` names the gunicorn
versions they hold for, and the live tests use each of them through the real server.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from gunicorn import http as gunicorn_http
from gunicorn.workers.gthread import TConn


def connection(cfg: Any, sock: socket.socket, address: Any) -> Any:
    """gthread's record of a connection, set up as its own accept would leave it, with a parser
    that reads from the socket."""
    conn = TConn(cfg, sock, address, sock.getsockname())
    conn.initialized = True
    conn.parser = gunicorn_http.get_parser(cfg, sock, address)
    return conn


def give_back(conn: Any, data: bytes) -> None:
    """Bytes read from the connection before gthread's parser (the head the edge read, and what
    came after it): the parser reads them first."""
    conn.parser.unreader.unread(data)


def read_ahead(conn: Any) -> bytes:
    """What gthread's parser read past the last request: the start of the next one."""
    data: bytes = conn.parser.unreader.take_buffered()
    return data


class PendingBody:
    """gunicorn's reader of a request body, for reading the body straight from the socket: what
    the parser read past the head, and its count of the body left unread, kept in step so that
    gunicorn drains exactly what is left before the next request on the connection."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    @classmethod
    def of(cls, stream: Any, length: int) -> PendingBody | None:
        """The body reader of a WSGI input stream of gunicorn's that has given none of the body
        to the application yet; None for any other stream (Flask's test client, another server)."""
        reader = getattr(stream, "reader", None)
        unreader = getattr(reader, "unreader", None)
        if (
            getattr(reader, "length", None) != length
            or not callable(getattr(unreader, "take_buffered", None))
            or not callable(getattr(unreader, "unread", None))
        ):
            return None
        return cls(reader)

    def take_buffered(self, length: int) -> bytes:
        """The part of the body the parser read already (at most `length` bytes); anything past
        it (the next request, sent without waiting for this answer) stays with the parser."""
        buffered: bytes = self._reader.unreader.take_buffered()
        if len(buffered) > length:
            self._reader.unreader.unread(buffered[length:])
        return buffered[:length]

    def consumed(self, count: int) -> None:
        self._reader.length -= count


def queued_calls(worker: Any) -> Callable[[], int]:
    """How many calls wait for one of the worker's threads."""
    size: Callable[[], int] = worker.tpool._work_queue.qsize
    return size


def heartbeat_from_fork(arbiter: Any, worker: Any) -> None:
    """gunicorn's `pre_fork`: the new worker's heartbeat starts now, on the clock the arbiter
    reads it with. The arbiter replaces a worker whose heartbeat is older than its timeout,
    comparing `time.monotonic()` with the heartbeat file's modification time; until the worker's
    first beat that time is the file's creation, on the wall clock, so far ahead of the
    monotonic clock that a worker whose boot never finishes would never be replaced."""
    worker.tmp.notify()
