"""Credentials said out loud: the hook token file, the serving pair and the client CA, checked a
few times a second. What is wrong with one is logged at once, naming the file and what is wrong
(never its content), exported as a metric per file, and, for a file the process has never read
valid, makes it not ready. The files keep doing what they always did meanwhile: a token file
that is empty or unreadable accepts no token, a serving pair or client CA that does not load
leaves the last good one served (`hooks.serving.auth`, `hooks.serving.edge`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hooks.serving.logs import log

CHECK_SECONDS = 0.25
# A serving pair caught mid-swap fails to load for a moment: a problem is reported once it has
# lasted this many checks in a row.
CHECKS_TO_REPORT = 2


@dataclass
class Watched:
    """One credential file: its kind (`token`, `serving_pair`, `client_ca`), where it is, and
    what is wrong with it now (None: nothing)."""

    kind: str
    path: str
    problem: Callable[[], str | None]
    valid: bool = False
    ever_valid: bool = False
    since: float = field(default_factory=time.time)
    _reported: str | None = "not checked yet"
    _seen: int = 0
    _last: str | None = None


class CredentialWatch:
    """Checks every watched file, reports changes, and says which ones keep the process unready."""

    def __init__(self, watched: list[Watched], clock: Callable[[], float] = time.time) -> None:
        self.watched = watched
        self._clock = clock

    def check(self) -> None:
        for item in self.watched:
            problem = item.problem()
            item._seen = item._seen + 1 if problem is not None and problem == item._last else 1
            item._last = problem
            if problem is None:
                item.ever_valid = True
            reported = problem if (problem is None or item._seen >= CHECKS_TO_REPORT) else None
            if problem is not None and reported is None:
                continue  # not for long enough yet
            if reported == item._reported:
                continue
            item._reported, item.valid, item.since = reported, reported is None, self._clock()
            if reported is None:
                log(logging.INFO, "credential file valid", kind=item.kind, file=item.path)
            else:
                log(
                    logging.ERROR,
                    "credential file invalid",
                    kind=item.kind,
                    file=item.path,
                    problem=reported,
                )

    def unready(self) -> list[str]:
        """Why the process may not report ready: files it has never read valid."""
        return [
            f"the {item.kind.replace('_', ' ')} file {item.path} has never been valid: {item._last}"
            for item in self.watched
            if not item.ever_valid
        ]

    def start(self) -> None:
        def watch() -> None:
            while True:
                self.check()
                time.sleep(CHECK_SECONDS)

        self.check()
        threading.Thread(target=watch, name="credential watch", daemon=True).start()
