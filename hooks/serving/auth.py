"""Bearer-token authentication of hook calls, from a file that may be rotated at any time.

Metacontroller trims the token it reads from its Secret, so the service trims too. Every token
listed in the file (one per line) is accepted, so a rotation is: add the new token, let the
controllers pick it up, then remove the old one.
"""

from __future__ import annotations

import hmac
import os
import threading
from pathlib import Path


class TokenFile:
    """The accepted tokens, re-read whenever the file changes (checked on every call)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._tokens: tuple[bytes, ...] = ()

    def _current(self) -> tuple[bytes, ...]:
        try:
            info = os.stat(self._path)
        except OSError:
            return ()  # fail closed: no file, no access
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            if stamp != self._stamp:
                try:
                    text = self._path.read_bytes()
                except OSError:
                    return ()
                self._tokens = tuple(t.strip() for t in text.splitlines() if t.strip())
                self._stamp = stamp
            return self._tokens

    def accepts(self, authorization: str | None) -> bool:
        """Constant time in the presented token: every accepted token is compared."""
        if not authorization:
            return False
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        candidate = presented.strip().encode()
        matched = False
        for token in self._current():
            matched |= hmac.compare_digest(candidate, token)
        return matched
