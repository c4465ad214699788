"""The checks a hook call passes on its head alone, cheapest first: the token (401), HTTPS for the
API server's routes (403), a declared length (411) within the route's limit (413).

They run twice, from one definition: at the edge (`hooks.serving.worker`), before the call costs
a thread, and in the app (`hooks.serving.app`), which other servers and Flask's test client reach
directly. A call refused here has cost no read, no reservation and no child."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hooks.routes import HOOKS, Hook
from hooks.serving.auth import TokenFile
from hooks.settings import Settings


@dataclass(frozen=True)
class Refusal:
    code: int
    message: str


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
