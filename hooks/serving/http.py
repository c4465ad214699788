"""The HTTP edge of every hook: the per-call record, JSON answers, errors mapped to codes, one log
line per call, and the memory budget's admission of a call before its body is read (the body
itself is `hooks.serving.body`'s)."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any

import msgspec
from flask import Response, g, request
from werkzeug.exceptions import HTTPException

from hooks.routes import Answer, FailedElsewhere
from hooks.serving.logs import log
from hooks.serving.memory import Admitted, MemoryBudget, NeverFits
from hooks.serving.metrics import Metrics
from hooks.wire.problems import BadRequest

JSON = "application/json"
# Metacontroller requeues a 429 after Retry-After (any other code fails the sync with a Warning
# event and exponential backoff); a few seconds lets the calls ahead finish.
RETRY_AFTER_SECONDS = 5
# When the edge took the call (`now()`), in its WSGI environment: its caller's clock started then.
ACCEPTED_AT = "hooks.accepted_at"
# When the edge handed the call to the pool of threads: its head whole (the hook port), or its
# body whole (the admission port, whose bodies the event loop reads). The wait for a thread
# counts from there; the call's deadline from ACCEPTED_AT.
HANDED_AT = "hooks.handed_at"
# In the WSGI environment of a call whose body the server read whole before calling the app, its
# memory held by that server (the admission port's, `hooks.serving.webhook`): the app reserves
# none of the memory budget for it.
BODY_HELD = "hooks.body_held"
# The work of a call (its reads, its child) ends this long before its answer is due: time to
# decide, encode and write the answer, a denial naming the read that did not finish included.
ANSWER_RESERVE_SECONDS = 0.25
# A call refused for a queue of calls ahead of it: a second lets the queue drain.
BUSY_RETRY_AFTER_SECONDS = 1
# The one clock of a call's time: the edge's, the deadline's, the log line's.
now = time.monotonic
# How many skipped objects one warning names; the count says how many there were.
SKIPPED_NAMED = 20


def json_response(payload: bytes, code: int = 200) -> Response:
    return Response(payload, status=code, mimetype=JSON)


@dataclass
class Call:
    """What one call carries from its first check to its log line and metrics: the one record of
    a request's state, kept in Flask's `g` by `begin_call`. `started` is when the edge took it
    (its wait for a thread counts), `deadline` when its answer is due (`now()` readings)."""

    started: float
    deadline: float
    body_bytes: int | None = None  # the declared body, once it was read whole
    log_fields: dict[str, Any] = field(default_factory=dict)
    memory: Admitted | None = None  # its share of the memory budget, until released
    waited: float = 0.0  # for a thread, from when the edge handed it to the pool
    deadline_token: Token[float | None] | None = None  # its deadline, for the API reads

    def elapsed_seconds(self) -> float:
        return now() - self.started

    def left_seconds(self) -> float:
        """What is left for the call's work: until `work_ends`."""
        return max(0.0, self.work_ends - now())

    @property
    def work_ends(self) -> float:
        """When the call's reads and computation must be over for its answer to be in time."""
        return self.deadline - min(ANSWER_RESERVE_SECONDS, (self.deadline - self.started) / 10)


def begin_call(answer_within: float = float("inf")) -> Call:
    """The call's record: from when the edge took it, when it reached this thread otherwise."""
    started = now()
    accepted = request.environ.get(ACCEPTED_AT) if request else None
    handed = request.environ.get(HANDED_AT) if request else None
    waited = 0.0
    if isinstance(accepted, float) and accepted <= started:
        if not isinstance(handed, float) or not accepted <= handed <= started:
            handed = accepted
        started, waited = accepted, started - handed
    g.call = Call(started, started + answer_within, waited=waited)
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
    duration = call.elapsed_seconds()
    fields.update(code=response.status_code, duration_ms=round(1000 * duration, 1))
    log(logging.INFO, "hook call", **fields)


def too_late_to_start(call: Call) -> Response | None:
    """A call that waited half its time for a thread is refused at once, 429: the calls ahead of
    it show it would not be answered in time, and its caller retries after Retry-After instead
    of timing out in a queue."""
    if call.waited <= (call.deadline - call.started) / 2:
        return None
    response = error_response(
        f"the service is busy: this call waited {call.waited:.1f} s for a thread; retry later", 429
    )
    response.headers["Retry-After"] = str(BUSY_RETRY_AFTER_SECONDS)
    return response


def reserve_memory(memory: MemoryBudget, length: int, metrics: Metrics) -> Response | None:
    """Hold the call until its share of the memory budget is free, or refuse it unread.

    Called after authentication and once the length is known to be declared and within the
    limit (only callers that may call can hold or wait for the budget); the reservation is
    released by `release_memory` on every path.
    """
    reservation = memory.reserve(length, current_call().left_seconds())
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
