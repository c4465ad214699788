"""create_app(settings): wiring only. The hooks are the table in `hooks.routes`; reading bodies,
answers and error codes are `hooks.http`; this module serves the one with the other, and adds the
probes, the metrics and the checks every call passes first (token, then memory)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException

from hooks import apart, http
from hooks.answer import Answer
from hooks.auth import TokenFile
from hooks.controllers.budget import BudgetInputs
from hooks.kubeapi.budget import BudgetReader
from hooks.kubeapi.kubevirt import KubeVirtReader
from hooks.memory import LARGE_BODY_BYTES, MemoryBudget, memory_budget
from hooks.metrics import Metrics
from hooks.routes import HOOKS, Hook, Service
from hooks.settings import Settings


def _utcnow() -> datetime:
    return datetime.now(UTC)


def create_app(
    settings: Settings,
    *,
    kubevirt: KubeVirtReader | None = None,
    clock: Callable[[], datetime] = _utcnow,
    state: http.ServiceState | None = None,
    metrics: Metrics | None = None,
    budgets: BudgetInputs | None = None,
    memory: MemoryBudget | None = None,
    apart_from_bytes: int | None = LARGE_BODY_BYTES,
) -> Flask:
    """The hooks' app. Calls to pure hooks with a body of `apart_from_bytes` or more are computed
    in a process of their own (`hooks.apart`); None computes every call in its thread."""
    app = Flask("hooks")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    exported = metrics or Metrics()
    reader = kubevirt or KubeVirtReader(settings, observe=exported.record_kubevirt_read)
    service = Service(settings, reader.view, budgets or BudgetReader(settings), clock)
    readiness = state or http.ServiceState()
    tokens = TokenFile(settings.auth_token_file) if settings.auth_token_file else None
    if memory is None:
        memory = memory_budget(settings)
    exported.watch_memory(memory)
    guarded = {hook.path for hook in HOOKS if hook.needs_token}
    if settings.metrics_require_auth:
        guarded.add("/metrics")

    @app.before_request
    def authenticate() -> Response | None:
        g.started = time.perf_counter()
        # Checked before anything reads the body: an unauthenticated caller costs no decode.
        if tokens is None or request.path not in guarded:
            return None
        if tokens.accepts(request.headers.get("Authorization")):
            return None
        return http.error_response("missing or invalid bearer token", 401)

    @app.before_request
    def reserve_memory() -> Response | None:
        if memory is None or request.method not in ("POST", "PUT", "PATCH"):
            return None
        return http.reserve_memory(memory, settings.max_body_bytes, exported)

    @app.teardown_request
    def release_memory(error: BaseException | None) -> None:
        # Runs on every path: answered, refused, failed, or the client gone mid-body.
        http.release_memory()

    @app.after_request
    def record(response: Response) -> Response:
        started = g.get("started", time.perf_counter())
        seconds = time.perf_counter() - started
        exported.observe_call(
            http.route_template(), response.status_code, seconds, g.get("body_bytes", 0)
        )
        return response

    def runs_apart(hook: Hook, length: int) -> bool:
        return (
            hook.pure
            and apart_from_bytes is not None
            and apart_from_bytes <= length <= settings.max_body_bytes
        )

    def serve(hook: Hook) -> Callable[[], Response]:
        def in_thread() -> Answer:
            return hook.handle(service, http.read_body(settings.max_body_bytes))

        def view() -> Response:
            if hook.https_only and not request.is_secure:
                return http.error_response("admission webhooks are served over HTTPS only", 403)
            length = request.content_length
            if length is None or not runs_apart(hook, length):
                return http.answer(hook.path, in_thread, exported)
            inputs = apart.Inputs(settings, clock())
            return http.answer(
                hook.path,
                lambda: apart.compute(hook, inputs, reader.view, http.body_chunks(length), length),
                exported,
            )

        return view

    for hook in HOOKS:
        app.add_url_rule(hook.path, hook.path, serve(hook), methods=["POST"])

    @app.get("/metrics")
    def metrics_route() -> Response:
        payload, content_type = exported.exposition()
        return Response(payload, content_type=content_type)

    @app.get("/healthz")
    def healthz() -> Response:
        return http.json_response(b'{"status":"ok"}')

    @app.get("/readyz")
    def readyz() -> Response:
        if readiness.draining:
            return http.error_response("shutting down", 503)
        return http.json_response(b'{"status":"ready"}')

    app.register_error_handler(HTTPException, http.http_error)
    app.register_error_handler(Exception, http.unexpected_error)
    return app
