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
    """The accepted tokens, re-read whenever the file changes (checked on every call). A file
    that is missing, unreadable or empty accepts no token: emptying it is how an operator revokes
    every token, so nothing falls back to the tokens read before."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._tokens: tuple[bytes, ...] = ()
        self._problem: str | None = "not read yet"

    def _current(self) -> tuple[tuple[bytes, ...], str | None]:
        """The tokens, and what is wrong with the file (None: nothing)."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return (), "missing"
        except OSError as error:
            return (), f"unreadable ({error.strerror})"
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            if stamp != self._stamp:
                try:
                    text = self.path.read_bytes()
                except OSError as error:
                    return (), f"unreadable ({error.strerror})"
                self._tokens = tuple(t.strip() for t in text.splitlines() if t.strip())
                self._problem = None
                if not self._tokens:
                    self._problem = "empty: no token in it"
                elif not all(_token_like(token) for token in self._tokens):
                    self._problem = "a line holds characters no bearer token has"
                self._stamp = stamp
            return self._tokens, self._problem

    def problem(self) -> str | None:
        """What is wrong with the file now (never its content), or None."""
        return self._current()[1]

    def accepts(self, authorization: str | None) -> bool:
        """Constant time in the presented token: every accepted token is compared."""
        if not authorization:
            return False
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        candidate = presented.strip().encode()
        matched = False
        for token in self._current()[0]:
            matched |= hmac.compare_digest(candidate, token)
        return matched


def _token_like(line: bytes) -> bool:
    """Printable ASCII only: a line with anything else is no token a header could carry."""
    return all(0x20 <= byte <= 0x7E for byte in line)
