"""The checks a hook call passes on its head alone, cheapest first: the token (401), HTTPS for the
API server's routes (403), a declared length (411) within the route's limit (413).

They run twice, from one definition: at the edge (`HeadChecks`, for the hook port's worker and
the admission port's server), before the call costs a thread, and in the app
(`hooks.serving.app`), which Flask's test client reaches directly. A call refused here has cost
no read, no reservation and no child."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from hooks.routes import HOOKS, Hook
from hooks.serving import edge, http
from hooks.serving.auth import TokenFile
from hooks.serving.logs import log
from hooks.serving.metrics import Metrics
from hooks.settings import Settings


@dataclass(frozen=True)
class Refusal:
    code: int
    message: str
    headers: Mapping[str, str] | None = None


class Guard:
    def __init__(self, settings: Settings, tokens: TokenFile | None) -> None:
        self._settings = settings
        self.tokens = self._tokens = tokens
        self.hooks: Mapping[str, Hook] = {hook.path: hook for hook in HOOKS}

    def body_limit(self, hook: Hook) -> int:
        """An AdmissionReview holds at most the two objects the API server accepted
        (controller-runtime's webhook server has the same default); Metacontroller's syncs hold
        whole clusters."""
        if hook.caller == "apiserver":
            return self._settings.admission_max_body_bytes
        return self._settings.max_body_bytes

    def check(
        self,
        hook: Hook,
        *,
        authorization: str | None,
        secure: bool,
        content_length: int | None,
        chunked: bool,
    ) -> Refusal | None:
        """Why this call is refused unread, or None. `content_length` is None when undeclared and
        negative when it is not a number."""
        tokens = self._tokens
        if hook.needs_token and tokens is not None and not tokens.accepts(authorization):
            return Refusal(401, "missing or invalid bearer token")
        if hook.https_only and not secure:
            return Refusal(403, "admission webhooks are served over HTTPS only")
        if content_length is None and chunked:
            return Refusal(411, "send Content-Length: hook bodies are read by their length")
        if content_length is not None and content_length < 0:
            return Refusal(400, "Content-Length is not a number")
        limit = self.body_limit(hook)
        if (content_length or 0) > limit:
            return Refusal(413, f"a body of {content_length} bytes is over the limit of {limit}")
        return None


class Backlog:
    """The calls handed to a pool of threads and not answered yet, and how long a thread takes
    with one (a moving average of the last few): how long a call handed now would wait for a
    thread. Kept by the event loop alone."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.busy = 0
        self.per_call = 0.0

    def expected_wait(self) -> float:
        ahead = self.busy - self.threads + 1
        return max(0, ahead) * self.per_call / self.threads

    def handed(self) -> None:
        self.busy += 1

    def answered(self, thread_seconds: float) -> None:
        self.busy -= 1
        self.per_call = (
            thread_seconds if not self.per_call else self.per_call * 0.8 + thread_seconds * 0.2
        )


class HeadChecks:
    """What an event loop decides on a complete head before the call costs anything more: the
    route among those its port serves (404, 405), the guard's checks, and whether its threads'
    backlog would keep it waiting past half its time (429: its caller retries, rather than time
    out in the queue). Refusals are counted and logged as the app counts and logs its own."""

    def __init__(
        self,
        guard: Guard,
        settings: Settings,
        metrics: Metrics,
        *,
        callers: frozenset[str],
        secure: bool,
        backlog: Backlog,
        elsewhere: str,
    ) -> None:
        self._guard, self._settings, self._metrics = guard, settings, metrics
        self.hooks = {path: hook for path, hook in guard.hooks.items() if hook.caller in callers}
        self._others = set(guard.hooks) - set(self.hooks)
        self._secure = secure
        self.backlog = backlog
        self._elsewhere = elsewhere

    def passed(
        self, the_edge: edge.Edge, connection: edge.Connection, head_bytes: bytes
    ) -> edge.Head | None:
        """The head, when the call may go on; else the connection is dropped (not HTTP) or
        answered with its refusal, and None."""
        head = edge.parse_head(head_bytes)
        if isinstance(head, edge.Refused):
            the_edge.respond(connection, self.refused_unread(head, connection.head_started))
            return None
        refusal = self.refusal(head)
        if refusal is not None:
            # timed from its own head: a kept-alive connection may have idled long before it
            the_edge.respond(connection, self.refused(head, refusal, connection.head_started))
            return None
        return head

    def refusal(self, head: edge.Head) -> Refusal | None:
        hook = self.hooks.get(head.path)
        if hook is None:
            if head.path in self._others:
                return Refusal(404, f"{head.path} is not served on this port: {self._elsewhere}")
            return Refusal(404, "not found")
        if head.method != "POST":
            message = f"{head.method} is not allowed: hooks are called with POST"
            return Refusal(405, message, {"Allow": "POST"})
        refused = self._guard.check(
            hook,
            authorization=head.headers.get("authorization"),
            secure=self._secure,
            content_length=head.content_length(),
            chunked=head.chunked,
        )
        if refused is not None or not hook.sheddable:
            return refused
        return self._busy(hook)

    def _busy(self, hook: Hook) -> Refusal | None:
        within = self._settings.answer_within_seconds(hook.caller)
        wait = self.backlog.expected_wait()
        if wait <= within / 2:
            return None
        self._metrics.calls_refused_busy.inc()
        message = f"the service is busy: a thread is {wait:.1f} s away; retry later"
        return Refusal(429, message, {"Retry-After": str(http.BUSY_RETRY_AFTER_SECONDS)})

    def refused_unread(self, refused: edge.Refused, since: float) -> bytes:
        """A head that is not one the edge reads: counted under no route, logged, answered."""
        return self._refusal_bytes("unmatched", Refusal(refused.code, refused.message), since)

    def refused(self, head: edge.Head, refusal: Refusal, since: float) -> bytes:
        """A call the loop answers: counted and logged; the answer's bytes."""
        route = head.path if head.path in self.hooks else "unmatched"
        return self._refusal_bytes(route, refusal, since)

    def _refusal_bytes(self, route: str, refusal: Refusal, since: float) -> bytes:
        seconds = time.monotonic() - since
        self._metrics.observe_call(route, refusal.code, seconds, 0)
        log(
            logging.INFO,
            "hook call",
            route=route,
            outcome="refused",
            error=refusal.message,
            code=refusal.code,
            duration_ms=round(1000 * seconds, 1),
        )
        return edge.response_bytes(refusal.code, refusal.message, refusal.headers)
