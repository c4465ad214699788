"""The HTTP edge of every hook: the body read once as bytes, JSON answers, errors mapped to codes,
one log line per call, and the memory budget's admission of a call before its body is read.

The body is never parsed by Flask (`get_json` would build a full dict tree of a request that can
weigh hundreds of megabytes, and keep it until the request ends).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from flask import Response, g, request
from werkzeug.exceptions import ClientDisconnected, HTTPException, RequestEntityTooLarge

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
# Pieces a body computed in another process is read in: gunicorn's own largest read, large enough
# that the per-piece cost vanishes, small enough that copying one holds the interpreter lock for
# a fraction of a millisecond (small calls answered meanwhile wait for it).
CHUNK_BYTES = 1024 * 1024


class ServiceState:
    """Process-wide state the routes share: whether the process still accepts hook calls."""

    def __init__(self) -> None:
        self._draining = threading.Event()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def drain(self) -> None:
        self._draining.set()


def json_response(payload: bytes, code: int = 200) -> Response:
    return Response(payload, status=code, mimetype=JSON)


def error_response(message: str, code: int) -> Response:
    response = json_response(msgspec.json.encode({"error": message}), code)
    if code in (401, 411, 413, 429):
        # The body was not read: closing spares gunicorn from draining it for keep-alive.
        response.headers["Connection"] = "close"
    return response


def route_template() -> str:
    """The route template (never the raw path, which would explode metric cardinality)."""
    return request.url_rule.rule if request.url_rule is not None else "unmatched"


def read_body(max_bytes: int) -> bytes:
    """The body, once, as bytes, refused (413) past the limit.

    With a declared length the WSGI input is read in one call of exactly that size: Werkzeug's
    `get_data` reads 64 KiB at a time and copies again at the end, which on a large request
    costs more than decoding it. A chunked body goes through Werkzeug, which cuts it at the
    limit, so reaching the limit means too large.
    """
    length = request.content_length
    if length is None:
        body = request.get_data(cache=False)
        if len(body) >= max_bytes:
            raise RequestEntityTooLarge()
    else:
        if length > max_bytes:
            raise RequestEntityTooLarge()
        body = request.environ["wsgi.input"].read(length) if length else b""
        if len(body) != length:
            raise ClientDisconnected()
    g.body_bytes = len(body)
    return bytes(body)


def body_chunks(length: int) -> Iterator[bytes]:
    """A body of declared length in pieces, so that it never lies whole in this process (the
    pieces go into the memory file of the process that computes it)."""
    stream = request.environ["wsgi.input"]
    left = length
    while left:
        chunk = stream.read(min(left, CHUNK_BYTES))
        if not chunk:
            raise ClientDisconnected()
        left -= len(chunk)
        yield chunk
    g.body_bytes = length


def answer(route: str, handle: Callable[[], Answer], metrics: Metrics) -> Response:
    """Run the hook (which reads the body), map its errors to codes, record a sync's outcome, and
    log the call once."""
    fields: dict[str, Any] = {"route": route}
    try:
        result = handle()
    except BadRequest as error:
        fields.update(outcome="bad_request", error=str(error))
        response = error_response(str(error), 400)
    except HTTPException as error:
        fields.update(outcome="refused", error=error.name)
        response = error_response(error.description or error.name, error.code or 400)
    else:
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
        response = json_response(result.payload)
    if "body_bytes" in g:
        fields["body_bytes"] = g.body_bytes
    duration = time.perf_counter() - g.get("started", time.perf_counter())
    fields.update(code=response.status_code, duration_ms=round(1000 * duration, 1))
    log(logging.INFO, "hook call", **fields)
    return response


def reserve_memory(memory: MemoryBudget, max_bytes: int, metrics: Metrics) -> Response | None:
    """Hold the call until its share of the memory budget is free, or refuse it unread.

    Called after authentication (only callers that may call can hold or wait for the budget);
    the reservation is released by `release_memory` on every path.
    """
    length = request.content_length
    if length is not None and length > max_bytes:
        return None  # refused unread with 413 by read_body
    chunked = length is None and "chunked" in request.headers.get("Transfer-Encoding", "")
    # A body of unknown length may be as large as the body limit.
    reservation = memory.reserve(max_bytes if chunked else (length or 0))
    if isinstance(reservation, Admitted):
        g.memory = reservation
        if reservation.share:
            metrics.memory_wait.observe(reservation.waited)
        return None
    if isinstance(reservation, NeverFits):
        code = 411 if chunked else 413
        metrics.memory_refused.labels(code=str(code)).inc()
        if chunked:
            return error_response("send Content-Length: the memory budget reserves from it", 411)
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


def release_memory() -> None:
    reservation = g.pop("memory", None)
    if reservation is not None:
        reservation.release()
