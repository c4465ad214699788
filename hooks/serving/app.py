"""create_app(settings): wiring only. The hooks are the table in `hooks.routes`; reading bodies,
answers and error codes are `hooks.serving.http`; this module serves the one with the other, and
adds the checks every call passes first: those on its head alone (`hooks.serving.guard`), then
the memory budget (429). Probes and metrics are served on ports of their own
(`hooks.serving.listeners`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from hooks.controllers.budget import BudgetInputs
from hooks.kubeapi.budget import BudgetReader
from hooks.kubeapi.client import CALL_DEADLINE, ReadShare
from hooks.kubeapi.kubevirt import KubeVirtReader
from hooks.routes import HOOKS, Answer, FailedElsewhere, Hook, HookInputs
from hooks.serving import apart, http
from hooks.serving.auth import TokenFile
from hooks.serving.body import body_chunks, joined
from hooks.serving.guard import Guard
from hooks.serving.memory import LARGE_BODY_BYTES, MemoryBudget, memory_budget
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from hooks.wire.problems import BadRequest


def _utcnow() -> datetime:
    return datetime.now(UTC)


def stale_after_seconds(settings: Settings) -> float:
    """A class's metrics outlive three status resyncs without a sync of it, then go."""
    return 3 * settings.status_resync_seconds


def budget_stale_after_seconds(settings: Settings) -> float:
    """A pool's metrics outlive three report resyncs without a report of it, then go."""
    return 3 * settings.budget_report_resync_seconds


def settings_metrics(settings: Settings, clock: Callable[[], float] = time.time) -> Metrics:
    """The service's metrics, their series dropped as the settings' resync periods say."""
    return Metrics(
        stale_after_seconds(settings),
        clock,
        budget_stale_after_seconds=budget_stale_after_seconds(settings),
    )


def _read(length: int, deadline_seconds: float) -> Iterator[bytes | memoryview]:
    """The declared body's pieces (`hooks.serving.body`), noted in the call's record once read
    whole; an empty body is not read at all."""
    if not length:
        return
    yield from body_chunks(length, deadline_seconds)
    http.current_call().body_bytes = length


class _Calls:
    """What every call passes through, in order: `start`, `check` (the head, then the memory
    budget), the hook's view (`serve`), `record` (metrics and the log line), `finish`."""

    def __init__(
        self,
        settings: Settings,
        inputs: HookInputs,
        guard: Guard,
        memory: MemoryBudget | None,
        metrics: Metrics,
        apart_from_bytes: int | None,
    ) -> None:
        self.settings, self.inputs, self.guard = settings, inputs, guard
        self.memory, self.metrics, self.apart_from_bytes = memory, metrics, apart_from_bytes

    def start(self) -> None:
        hook = self.guard.hooks.get(request.path)
        call = http.begin_call(
            self.settings.answer_within_seconds(hook.caller if hook else "metacontroller")
        )
        self.metrics.calls_in_progress.inc()
        if http.ACCEPTED_AT in request.environ:
            self.metrics.thread_wait.observe(call.waited)
        # Every read of the API server for this call ends by its deadline (`hooks.kubeapi`).
        call.deadline_token = CALL_DEADLINE.set(call.work_ends)

    def check(self) -> Response | None:
        """Every check that needs no body (`hooks.serving.guard`, which the edge ran already under
        gunicorn), then the memory budget: an unauthenticated or undeclared call costs no read,
        no reservation and no child."""
        hook = self.guard.hooks.get(request.path)
        if hook is None:
            return None
        refusal = self.guard.check(
            hook,
            authorization=request.headers.get("Authorization"),
            secure=request.is_secure,
            content_length=request.content_length,
            chunked=bool(request.headers.get("Transfer-Encoding")),
        )
        if refusal is not None:
            return http.error_response(refusal.message, refusal.code)
        late = http.too_late_to_start(http.current_call())
        if late is not None:
            self.metrics.calls_refused_busy.inc()
            return late
        if self.memory is None or request.environ.get(http.BODY_HELD):
            return None
        return http.reserve_memory(self.memory, request.content_length or 0, self.metrics)

    def record(self, response: Response) -> Response:
        call = http.current_call()
        route = http.route_template()
        self.metrics.observe_call(
            route, response.status_code, call.elapsed_seconds(), call.body_bytes or 0
        )
        http.log_call(response)
        return response

    def finish(self, error: BaseException | None) -> None:
        # Runs on every path: answered, refused, failed, or the client gone mid-body.
        call = http.end_call()
        if call is not None:
            http.release_memory(call)
            self.metrics.calls_in_progress.dec()
            if call.deadline_token is not None:
                CALL_DEADLINE.reset(call.deadline_token)

    def serve(self, hook: Hook) -> Callable[[], Response]:
        def view() -> Response:
            length = request.content_length or 0
            # One deadline per call, from when the edge took it: what it waited for a thread and
            # for the memory budget is not given again to its body or its child.
            left = http.current_call().left_seconds()
            body_seconds = min(self.settings.body_deadline_seconds(length), left)
            if self._runs_apart(hook, length):
                return http.answer(
                    hook.path,
                    lambda: self._computed_apart(hook, length, body_seconds, left),
                    self.metrics,
                )

            def in_thread() -> Answer:
                return hook.handle(self.inputs, joined(_read(length, body_seconds)))

            return http.answer(hook.path, in_thread, self.metrics)

        return view

    def _runs_apart(self, hook: Hook, length: int) -> bool:
        limit = self.apart_from_bytes
        return hook.apart and limit is not None and limit <= length

    def _computed_apart(
        self, hook: Hook, length: int, body_seconds: float, left_seconds: float
    ) -> Answer:
        """The call computed in a child within what is left of its hook timeout, its outcome
        counted (`answered`, `bad_request`, the child's failure, or `not_read` when the body
        never arrived whole)."""
        settings = self.settings
        inputs = apart.Inputs(settings, self.inputs.clock())
        chunks = _read(length, body_seconds)
        outcome = "not_read"
        try:
            result = apart.compute(hook, inputs, self.inputs.kubevirt, chunks, length, left_seconds)
            outcome = "answered"
            return result
        except BadRequest:
            outcome = "bad_request"
            raise
        except FailedElsewhere as failure:
            outcome = failure.error_type
            raise
        finally:
            self.metrics.apart_calls.labels(outcome=outcome).inc()


def create_app(
    settings: Settings,
    *,
    kubevirt: KubeVirtReader | None = None,
    clock: Callable[[], datetime] = _utcnow,
    metrics: Metrics | None = None,
    budgets: BudgetInputs | None = None,
    memory: MemoryBudget | None = None,
    apart_from_bytes: int | None = LARGE_BODY_BYTES,
    guard: Guard | None = None,
    reads: ReadShare | None = None,
) -> Flask:
    """The hooks' app. Calls to hooks marked `apart` with a body of `apart_from_bytes` or more are
    computed in a process of their own (`hooks.serving.apart`) where the system allows it; None
    computes every call in its thread."""
    exported = metrics or settings_metrics(settings)
    # The process's API reads hold their answers in one share, whichever reader makes them.
    reads = reads or ReadShare(settings.kube_read_max_bytes)
    reader = kubevirt or KubeVirtReader(
        settings, observe=exported.record_kubevirt_read, share=reads
    )
    inputs = HookInputs(
        settings, reader.view, budgets or BudgetReader(settings, share=reads), clock
    )
    if guard is None:
        tokens = TokenFile(settings.auth_token_file) if settings.auth_token_file else None
        guard = Guard(settings, tokens)
    if memory is None:
        memory = memory_budget(settings)
    exported.watch_memory(memory)
    calls = _Calls(
        settings,
        inputs,
        guard,
        memory,
        exported,
        apart_from_bytes if apart.supported() else None,
    )

    app = Flask("hooks")
    app.before_request(calls.start)
    app.before_request(calls.check)
    app.after_request(calls.record)
    app.teardown_request(calls.finish)
    for hook in HOOKS:
        app.add_url_rule(hook.path, hook.path, calls.serve(hook), methods=["POST"])
    app.register_error_handler(HTTPException, http.http_error)
    app.register_error_handler(Exception, http.unexpected_error)
    return app
