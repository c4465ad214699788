"""create_app(settings): the routes and error handlers, nothing else.

Routes are thin: read the body once as bytes, decode, call the controller, encode, log. The body
is never parsed by Flask (`get_json` would build a full dict tree of a request that can weigh
hundreds of megabytes, and keep it until the request ends).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from hooks.controllers import license, status
from hooks.kubevirt import KubeVirtReader
from hooks.logs import log
from hooks.rules.capacity import InvalidObject
from hooks.settings import Settings
from hooks.wire.metacontroller import (
    BadRequest,
    CompositeSyncRequest,
    CustomizeRequest,
    DecoratorSyncRequest,
    decode_envelope,
    encode,
)

JSON = "application/json"
Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _json(payload: bytes, code: int = 200) -> Response:
    return Response(payload, status=code, mimetype=JSON)


def _error(message: str, code: int) -> Response:
    return _json(msgspec.json.encode({"error": message}), code)


class ServiceState:
    """Process-wide state the routes share: whether the process still accepts hook calls."""

    def __init__(self) -> None:
        self._draining = threading.Event()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def drain(self) -> None:
        self._draining.set()


def create_app(
    settings: Settings,
    *,
    kubevirt: KubeVirtReader | None = None,
    clock: Clock = _utcnow,
    state: ServiceState | None = None,
) -> Flask:
    app = Flask("hooks")
    reader = kubevirt or KubeVirtReader(settings)
    service = state or ServiceState()
    app.extensions["gpuclass"] = {"settings": settings, "state": service, "kubevirt": reader}

    def hook(route: str, handle: Callable[[bytes], tuple[bytes, dict[str, Any]]]) -> Response:
        started = time.perf_counter()
        body = request.get_data(cache=False)
        fields: dict[str, Any] = {"route": route, "body_bytes": len(body)}
        try:
            payload, facts = handle(body)
        except BadRequest as error:
            fields.update(outcome="bad_request", error=str(error))
            response = _error(str(error), 400)
        else:
            fields.update(facts)
            response = _json(payload)
        fields.update(
            code=response.status_code, duration_ms=round(1000 * (time.perf_counter() - started), 1)
        )
        log(logging.INFO, "hook call", **fields)
        return response

    def warn_invalid(route: str, class_name: str, invalid: Sequence[InvalidObject]) -> None:
        """One warning per request naming what was skipped (names and reasons, never contents)."""
        if invalid:
            log(
                logging.WARNING,
                "skipped invalid objects",
                route=route,
                **{"class": class_name},
                objects=[f"{o.kind} {o.name}: {o.reason}" for o in invalid[:20]],
                count=len(invalid),
            )

    @app.post("/status/customize")
    def status_customize() -> Response:
        def handle(body: bytes) -> tuple[bytes, dict[str, Any]]:
            answer = status.customize(decode_envelope(body, CustomizeRequest), settings)
            return encode(answer), {"outcome": "ok", "rules": len(answer.related_resources)}

        return hook("/status/customize", handle)

    @app.post("/status/sync")
    def status_sync() -> Response:
        def handle(body: bytes) -> tuple[bytes, dict[str, Any]]:
            sync_request = decode_envelope(body, CompositeSyncRequest)
            outcome = status.sync(sync_request, settings, reader.view, clock())
            warn_invalid("/status/sync", outcome.class_name, outcome.invalid)
            facts = {"class": outcome.class_name, "outcome": outcome.outcome, **outcome.counts}
            return encode(outcome.response), facts

        return hook("/status/sync", handle)

    @app.post("/license/customize")
    def license_customize() -> Response:
        def handle(body: bytes) -> tuple[bytes, dict[str, Any]]:
            answer = license.customize(decode_envelope(body, CustomizeRequest), settings)
            return encode(answer), {"outcome": "ok", "rules": len(answer.related_resources)}

        return hook("/license/customize", handle)

    @app.post("/license/sync")
    def license_sync() -> Response:
        def handle(body: bytes) -> tuple[bytes, dict[str, Any]]:
            outcome = license.sync(decode_envelope(body, DecoratorSyncRequest), settings)
            warn_invalid("/license/sync", outcome.class_name, outcome.invalid)
            facts = {"class": outcome.class_name, "outcome": outcome.outcome, **outcome.counts}
            return encode(outcome.response), facts

        return hook("/license/sync", handle)

    @app.get("/healthz")
    def healthz() -> Response:
        return _json(b'{"status":"ok"}')

    @app.get("/readyz")
    def readyz() -> Response:
        if service.draining:
            return _error("shutting down", 503)
        return _json(b'{"status":"ready"}')

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        return _error(error.description or error.name, error.code or 500)

    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> Response:
        # The message of an unexpected error may quote input, so only its type and the frames
        # are logged; the caller gets no detail at all.
        log(
            logging.ERROR,
            "unexpected error",
            route=request.path,
            error=type(error).__name__,
            frames=traceback.format_tb(error.__traceback__)[-3:],
        )
        return _error("internal error", 500)

    return app
