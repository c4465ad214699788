"""create_app(settings): the routes and error handlers, nothing else.

Routes are thin: read the body once as bytes, decode, call the controller, encode, log, record
metrics. The body is never parsed by Flask (`get_json` would build a full dict tree of a request
that can weigh hundreds of megabytes, and keep it until the request ends).
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
from flask import Flask, Response, g, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from werkzeug.exceptions import ClientDisconnected, HTTPException, RequestEntityTooLarge

from hooks.auth import TokenFile
from hooks.budgets import BudgetReader
from hooks.controllers import admission, license, status
from hooks.controllers.admission import AdmissionOutcome, BudgetInputs
from hooks.kubevirt import KubeVirtReader
from hooks.logs import log
from hooks.memory import Admitted, MemoryBudget, NeverFits, configured_budget
from hooks.metrics import ClassSample, Metrics
from hooks.rules.capacity import InvalidObject
from hooks.settings import Settings
from hooks.wire.admission import AdmissionRequest, decode_review, review_response
from hooks.wire.metacontroller import (
    BadRequest,
    CustomizeRequest,
    decode_composite_sync,
    decode_decorator_sync,
    decode_envelope,
    encode,
)

JSON = "application/json"
# Metacontroller requeues a 429 after Retry-After (any other code fails the sync with a Warning
# event and exponential backoff); a few seconds lets the calls ahead finish.
RETRY_AFTER_SECONDS = 5
HOOK_PREFIXES = ("/status/", "/license/")
Clock = Callable[[], datetime]
Handler = Callable[[bytes], tuple[bytes, dict[str, Any]]]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _json(payload: bytes, code: int = 200) -> Response:
    return Response(payload, status=code, mimetype=JSON)


def _error(message: str, code: int) -> Response:
    response = _json(msgspec.json.encode({"error": message}), code)
    if code in (401, 411, 413, 429):
        # The body was not read: closing spares gunicorn from draining it for keep-alive.
        response.headers["Connection"] = "close"
    return response


def _route() -> str:
    """The route template (never the raw path, which would explode metric cardinality)."""
    return request.url_rule.rule if request.url_rule is not None else "unmatched"


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
    metrics: Metrics | None = None,
    budgets: BudgetInputs | None = None,
    memory: MemoryBudget | None = None,
) -> Flask:
    app = Flask("hooks")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    exported = metrics or Metrics()
    reader = kubevirt or KubeVirtReader(
        settings, observe=lambda outcome: exported.kubevirt_reads.labels(outcome=outcome).inc()
    )
    service = state or ServiceState()
    budget_inputs = budgets or BudgetReader(settings)
    tokens = TokenFile(settings.auth_token_file) if settings.auth_token_file else None
    if memory is None:
        budget_bytes = configured_budget(settings.memory_budget_bytes, settings.memory_limit_bytes)
        if budget_bytes is not None:
            memory = MemoryBudget(budget_bytes, max_wait_seconds=settings.memory_wait_seconds)
    exported.watch_memory(memory)
    app.extensions["gpuclass"] = {
        "settings": settings,
        "state": service,
        "kubevirt": reader,
        "metrics": exported,
    }

    def needs_token(path: str) -> bool:
        """The hook routes, and /metrics when asked; never the probes or the admission routes."""
        return path.startswith(HOOK_PREFIXES) or (
            settings.metrics_require_auth and path == "/metrics"
        )

    @app.before_request
    def authenticate() -> Response | None:
        g.started = time.perf_counter()
        # Checked before anything reads the body: an unauthenticated caller costs no decode.
        if tokens is None or not needs_token(request.path):
            return None
        if tokens.accepts(request.headers.get("Authorization")):
            return None
        return _error("missing or invalid bearer token", 401)

    @app.before_request
    def reserve_memory() -> Response | None:
        """After authentication: only callers that may call can hold or wait for the budget."""
        if memory is None or request.method not in ("POST", "PUT", "PATCH"):
            return None
        length = request.content_length
        if length is not None and length > settings.max_body_bytes:
            return None  # refused unread with 413 by read_body
        chunked = length is None and "chunked" in request.headers.get("Transfer-Encoding", "")
        # A body of unknown length may be as large as the body limit.
        reservation = memory.reserve(settings.max_body_bytes if chunked else (length or 0))
        if isinstance(reservation, Admitted):
            g.memory = reservation
            if reservation.share:
                exported.memory_wait.observe(reservation.waited)
            return None
        if isinstance(reservation, NeverFits):
            code = 411 if chunked else 413
            exported.memory_refused.labels(code=str(code)).inc()
            if chunked:
                return _error("send Content-Length: the memory budget reserves from it", 411)
            return _error(
                f"a body of {length} bytes needs {reservation.share} bytes of the memory budget "
                f"({memory.budget_bytes} bytes) and can never fit: raise "
                "GPUCLASS_MEMORY_BUDGET_BYTES or the memory limit, or shrink requests with "
                "GPUCLASS_POD_SELECTOR and GPUCLASS_NODE_SELECTOR",
                413,
            )
        exported.memory_refused.labels(code="429").inc()
        exported.memory_wait.observe(reservation.waited)
        response = _error("the service is at its memory budget: retry later", 429)
        response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response

    @app.teardown_request
    def release_memory(error: BaseException | None) -> None:
        # Runs on every path: answered, refused, failed, or the client gone mid-body.
        reservation = g.pop("memory", None)
        if reservation is not None:
            reservation.release()

    @app.after_request
    def record(response: Response) -> Response:
        started = g.get("started", time.perf_counter())
        exported.observe_call(
            _route(), response.status_code, time.perf_counter() - started, g.get("body_bytes", 0)
        )
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

    def read_body() -> bytes:
        """The body, once, as bytes, refused (413) past the limit.

        With a declared length the WSGI input is read in one call of exactly that size: Werkzeug's
        `get_data` reads 64 KiB at a time and copies again at the end, which on a large request
        costs more than decoding it. A chunked body goes through Werkzeug, which cuts it at the
        limit, so reaching the limit means too large.
        """
        length = request.content_length
        if length is None:
            body = request.get_data(cache=False)
            if len(body) >= settings.max_body_bytes:
                raise RequestEntityTooLarge()
            return body
        if length > settings.max_body_bytes:
            raise RequestEntityTooLarge()
        body = request.environ["wsgi.input"].read(length) if length else b""
        if len(body) != length:
            raise ClientDisconnected()
        return bytes(body)

    def hook(route: str, handle: Handler) -> Response:
        fields: dict[str, Any] = {"route": route}
        try:
            body = read_body()
            g.body_bytes = len(body)
            fields["body_bytes"] = len(body)
            payload, facts = handle(body)
        except BadRequest as error:
            fields.update(outcome="bad_request", error=str(error))
            response = _error(str(error), 400)
        except HTTPException as error:
            fields.update(outcome="refused", error=error.name)
            response = _error(error.description or error.name, error.code or 400)
        else:
            fields.update(facts)
            response = _json(payload)
        duration = time.perf_counter() - g.get("started", time.perf_counter())
        fields.update(code=response.status_code, duration_ms=round(1000 * duration, 1))
        log(logging.INFO, "hook call", **fields)
        return response

    @app.post("/status/customize")
    def status_customize() -> Response:
        def handle(body: bytes) -> tuple[bytes, dict[str, Any]]:
            answer = status.customize(decode_envelope(body, CustomizeRequest), settings)
            return encode(answer), {"outcome": "ok", "rules": len(answer.related_resources)}

        return hook("/status/customize", handle)

    @app.post("/status/sync")
    def status_sync() -> Response:
        def handle(body: bytes) -> tuple[bytes, dict[str, Any]]:
            outcome = status.sync(decode_composite_sync(body), settings, reader.view, clock())
            warn_invalid("/status/sync", outcome.class_name, outcome.invalid)
            if outcome.known_classes is not None:
                exported.classes.retain_only(outcome.known_classes)
            if outcome.conditions:
                exported.classes.record(
                    outcome.class_name,
                    ClassSample(
                        resource=outcome.resource,
                        capacity=outcome.capacity if outcome.exports_inventory else None,
                        free=outcome.free,
                        max_free_per_node=outcome.max_free_per_node,
                        conditions=outcome.conditions,
                        computed_at=exported.classes.now(),
                    ),
                )
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
            outcome = license.sync(decode_decorator_sync(body), settings)
            warn_invalid("/license/sync", outcome.class_name, outcome.invalid)
            if outcome.plan is not None:
                exported.classes.record_license(outcome.class_name, len(outcome.plan.copies))
            elif outcome.outcome in ("unlicensed", "disabled"):
                exported.classes.forget_license(outcome.class_name)
            facts = {"class": outcome.class_name, "outcome": outcome.outcome, **outcome.counts}
            return encode(outcome.response), facts

        return hook("/license/sync", handle)

    def admit(
        route: str, review: Callable[[AdmissionRequest, BudgetInputs], AdmissionOutcome]
    ) -> Response:
        # The API server calls admission webhooks over HTTPS only, and sends no bearer token:
        # these routes are exempt from the hooks' token and refuse plain HTTP.
        if not request.is_secure:
            return _error("admission webhooks are served over HTTPS only", 403)

        def handle(body: bytes) -> tuple[bytes, dict[str, Any]]:
            admission_request = decode_review(body)
            try:
                outcome = review(admission_request, budget_inputs)
            except BadRequest as error:
                # The review itself was readable: answer it, so the API server shows why.
                answer = review_response(admission_request.uid, False, str(error))
                return msgspec.json.encode(answer), {"outcome": "denied", "allowed": False}
            verdict = outcome.verdict
            if verdict.skipped:
                # Once per review: what did not decode but took no part in this verdict.
                log(
                    logging.WARNING,
                    "skipped unreadable objects",
                    route=route,
                    objects=list(verdict.skipped[:20]),
                    count=len(verdict.skipped),
                )
            answer = review_response(admission_request.uid, verdict.allowed, verdict.message)
            facts = {
                "outcome": "allowed" if verdict.allowed else "denied",
                "allowed": verdict.allowed,
                "kind": outcome.kind,
                "namespace": outcome.namespace,
                "name": outcome.name,
                "operation": outcome.operation,
                "read_inputs": outcome.read_inputs,
            }
            return msgspec.json.encode(answer), facts

        return hook(route, handle)

    @app.post("/admit/gpu-budget")
    def admit_gpu_budget() -> Response:
        return admit("/admit/gpu-budget", admission.review_app)

    @app.post("/admit/tenant-gpu-keys")
    def admit_tenant_gpu_keys() -> Response:
        return admit("/admit/tenant-gpu-keys", admission.review_tenant)

    @app.get("/metrics")
    def metrics_route() -> Response:
        return Response(generate_latest(exported.registry), mimetype=CONTENT_TYPE_LATEST)

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
