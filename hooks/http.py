"""The HTTP edge of every hook: the body read once as bytes, JSON answers, errors mapped to codes,
one log line per call, and the memory budget's admission of a call before its body is read.

The body is never parsed by Flask (`get_json` would build a full dict tree of a request that can
weigh hundreds of megabytes, and keep it until the request ends).
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
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import msgspec
from flask import Response, g, request
from werkzeug.exceptions import ClientDisconnected, HTTPException, RequestTimeout

from hooks.answer import Answer, FailedElsewhere
from hooks.logs import log
from hooks.memory import Admitted, MemoryBudget, NeverFits
from hooks.metrics import Metrics
from hooks.wire.problems import BadRequest

JSON = "application/json"
# Metacontroller requeues a 429 after Retry-After (any other code fails the sync with a Warning
# event and exponential backoff); a few seconds lets the calls ahead finish.
RETRY_AFTER_SECONDS = 5
# How many skipped objects one warning names; the count says how many there were.
SKIPPED_NAMED = 20
# Pieces a body is read in: large enough that the per-piece cost vanishes, small enough that the
# buffer a call reads them into costs little, and that copying one (a body read through a WSGI
# stream) holds the interpreter lock for a fraction of a millisecond (small calls answered
# meanwhile wait for it).
CHUNK_BYTES = 1024 * 1024


def json_response(payload: bytes, code: int = 200) -> Response:
    return Response(payload, status=code, mimetype=JSON)


@dataclass
class Call:
    """What one call carries from its first check to its log line and metrics: the one record of
    a request's state, kept in Flask's `g` by `begin_call`."""

    started: float
    body_bytes: int | None = None  # the declared body, once it was read whole
    log_fields: dict[str, Any] = field(default_factory=dict)
    memory: Admitted | None = None  # its share of the memory budget, until released


def begin_call() -> Call:
    g.call = Call(time.perf_counter())
    return current_call()


def current_call() -> Call:
    call: Call = g.call
    return call


def end_call() -> Call | None:
    """The call's record, once: every path ends here (answered, refused, failed, client gone)."""
    call: Call | None = g.pop("call", None)
    return call


class ErrorResponse(Response):
    """An error answer, which keeps what it says for the call's log line."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(msgspec.json.encode({"error": message}), status=code, mimetype=JSON)
        self.message = message


def error_response(message: str, code: int) -> Response:
    response = ErrorResponse(message, code)
    if code in (401, 403, 408, 411, 413, 429):
        # The body was not read (or not all of it): closing spares gunicorn from draining it for
        # keep-alive.
        response.headers["Connection"] = "close"
    return response


def route_template() -> str:
    """The route template (never the raw path, which would explode metric cardinality)."""
    return request.url_rule.rule if request.url_rule is not None else "unmatched"


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

    def __init__(self, connection: socket.socket, stream: Any, length: int) -> None:
        self._socket = connection
        self._unread = stream.reader  # gunicorn's LengthReader: `length` is what it has not read
        buffered: bytes = stream.reader.unreader.take_buffered()
        if len(buffered) > length:  # the next request, sent without waiting for this answer
            stream.reader.unreader.unread(buffered[length:])
        self._head = buffered[:length]
        self._buffer = memoryview(bytearray(min(length, CHUNK_BYTES)))

    @classmethod
    def of(cls, length: int) -> _ConnectionBody | None:
        """The request's body read from its connection, when gunicorn serves it and has given
        none of the body to the application yet (its reader still has all of it to read); None
        otherwise (Flask's test client, another server): then the WSGI stream is read."""
        stream = request.environ["wsgi.input"]
        connection = request.environ.get("gunicorn.socket")
        reader = getattr(stream, "reader", None)
        unreader = getattr(reader, "unreader", None)
        if (
            connection is None
            or getattr(reader, "length", None) != length
            or not callable(getattr(unreader, "take_buffered", None))
            or not callable(getattr(unreader, "unread", None))
        ):
            return None
        return cls(connection, stream, length)

    def read(self, size: int) -> bytes | memoryview:
        if self._head:
            piece: bytes | memoryview = self._head[:size]
            self._head = self._head[size:]
        else:
            piece = self._buffer[: self._socket.recv_into(self._buffer, min(size, CHUNK_BYTES))]
        self._unread.length -= len(piece)
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
    current_call().body_bytes = length


def read_body(length: int, deadline_seconds: float) -> bytes:
    """The declared body, once, as bytes (its pieces joined once: Werkzeug's `get_data` copies
    again at the end, which on a large request costs more than decoding it)."""
    if not length:
        return b""
    return b"".join([bytes(piece) for piece in body_chunks(length, deadline_seconds)])


def answer(route: str, handle: Callable[[], Answer], metrics: Metrics) -> Response:
    """Run the hook (which reads the body), map its errors to codes, record a sync's outcome, and
    note the facts of the call's log line."""
    fields = current_call().log_fields
    try:
        result = handle()
    except BadRequest as error:
        fields.update(outcome="bad_request", error=str(error))
        return error_response(str(error), 400)
    except HTTPException as error:
        fields.update(outcome="refused", error=error.name)
        return error_response(error.description or error.name, error.code or 400)
    if result.skipped:
        # Names and reasons, never contents; once per call.
        log(
            logging.WARNING,
            "skipped unreadable objects",
            route=route,
            **result.about,
            objects=list(result.skipped[:SKIPPED_NAMED]),
            count=len(result.skipped),
        )
    if result.observation is not None:
        metrics.record(result.observation)
    fields.update(result.facts)
    return json_response(result.payload)


def log_call(response: Response) -> None:
    """One line per call, whatever answered it: a hook, a refusal before the body was read (401,
    403, 411, 413, 429), a stalled body (408) or an error; with the reason for a refusal."""
    call = current_call()
    fields: dict[str, Any] = {"route": route_template(), **call.log_fields}
    if response.status_code >= 400 and "error" not in fields:
        said = response.message if isinstance(response, ErrorResponse) else response.status
        fields.update(outcome="refused", error=said)
    if call.body_bytes is not None:
        fields["body_bytes"] = call.body_bytes
    duration = time.perf_counter() - call.started
    fields.update(code=response.status_code, duration_ms=round(1000 * duration, 1))
    log(logging.INFO, "hook call", **fields)


def reserve_memory(memory: MemoryBudget, length: int, metrics: Metrics) -> Response | None:
    """Hold the call until its share of the memory budget is free, or refuse it unread.

    Called after authentication and once the length is known to be declared and within the
    limit (only callers that may call can hold or wait for the budget); the reservation is
    released by `release_memory` on every path.
    """
    reservation = memory.reserve(length)
    if isinstance(reservation, Admitted):
        current_call().memory = reservation
        if reservation.share:
            metrics.memory_wait.observe(reservation.waited)
        return None
    if isinstance(reservation, NeverFits):
        metrics.memory_refused.labels(code="413").inc()
        return error_response(
            f"a body of {length} bytes needs {reservation.share} bytes of the memory budget "
            f"({memory.budget_bytes} bytes) and can never fit: raise "
            "GPUCLASS_MEMORY_BUDGET_BYTES or the memory limit, or shrink requests with "
            "GPUCLASS_POD_SELECTOR and GPUCLASS_NODE_SELECTOR",
            413,
        )
    metrics.memory_refused.labels(code="429").inc()
    metrics.memory_wait.observe(reservation.waited)
    response = error_response("the service is at its memory budget: retry later", 429)
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def http_error(error: HTTPException) -> Response:
    return error_response(error.description or error.name, error.code or 500)


def unexpected_error(error: Exception) -> Response:
    # The message of an unexpected error may quote input, so only its type and the frames are
    # logged; the caller gets no detail at all.
    if isinstance(error, FailedElsewhere):
        error_type, frames = error.error_type, error.frames
    else:
        error_type, frames = type(error).__name__, traceback.format_tb(error.__traceback__)[-3:]
    log(logging.ERROR, "unexpected error", route=request.path, error=error_type, frames=frames)
    return error_response("internal error", 500)


def release_memory(call: Call) -> None:
    if call.memory is not None:
        call.memory.release()
        call.memory = None
