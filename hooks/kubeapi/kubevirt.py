"""The one read the hooks make themselves: the KubeVirt CR, for permittedHostDevices.

KubeVirt is never a Metacontroller related resource: a rule for an API that is not served fails
every sync before the hook is called. So the status hook reads the CR itself, with a short
timeout and a per-process cache of a few seconds, so that a burst of class syncs makes one read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

import msgspec

from hooks.kubeapi.client import CALL_DEADLINE, ApiClient, NotFound, ReadShare
from hooks.rules.permitted_devices import (
    KubeVirtAbsent,
    KubeVirtFound,
    KubeVirtUnreadable,
    KubeVirtView,
)
from hooks.settings import Settings
from hooks.wire.kube import KubeVirt
from hooks.wire.problems import Undecodable, Unreadable, decoded

ReadOutcome = Literal["found", "absent", "unreadable"]
ReadObserver = Callable[[ReadOutcome], None]
_KUBEVIRT = msgspec.json.Decoder(KubeVirt)


def outcome_of(view: KubeVirtView) -> ReadOutcome:
    """A low-cardinality name for a read's outcome, for metrics and logs."""
    if isinstance(view, KubeVirtFound):
        return "found"
    if isinstance(view, KubeVirtAbsent):
        return "absent"
    return "unreadable"


class KubeVirtReader:
    """Reads the KubeVirt CR, one read at a time whoever asks, and keeps what it found (or that
    it is absent) for `cache_seconds`.

    Concurrent syncs share the read in flight instead of each asking the API server the same
    question, and wait for it only as long as their own call's deadline allows: no lock is held
    across the read, so a slow API server costs each caller its own deadline at most, never
    another caller's. A failed read is not kept: the next call reads again, and sees the API
    server as soon as it is back (the shared read is what spares the API server a burst).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        observe: ReadObserver | None = None,
        share: ReadShare | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._observe = observe
        self._lock = threading.Lock()  # guards the fields below, never held across a read
        self._cached: tuple[float, KubeVirtView] | None = None
        self._reading: threading.Event | None = None
        self._last: KubeVirtView | None = None  # what the read in flight found, for its waiters
        self._api = ApiClient(settings, share)
        self._location = f"{settings.kubevirt_namespace}/{settings.kubevirt_name}"

    def view(self) -> KubeVirtView:
        with self._lock:
            cached = self._cached
            if (
                cached is not None
                and self._clock() - cached[0] < self._settings.kubevirt_cache_seconds
            ):
                return cached[1]
            in_flight = self._reading
            if in_flight is None:
                self._reading = threading.Event()
        if in_flight is not None:
            return self._shared(in_flight)
        view: KubeVirtView = KubeVirtUnreadable("the read did not finish")
        try:
            view = self._read()
        finally:
            with self._lock:
                if not isinstance(view, KubeVirtUnreadable):
                    self._cached = (self._clock(), view)
                self._last = view
                finished, self._reading = self._reading, None
            if finished is not None:
                finished.set()
        if self._observe is not None:
            self._observe(outcome_of(view))
        return view

    def _shared(self, in_flight: threading.Event) -> KubeVirtView:
        """What the read in flight finds, waited for as long as this call's deadline allows."""
        deadline = CALL_DEADLINE.get()
        wait = self._settings.kube_timeout_seconds
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - time.monotonic()))
        if not in_flight.wait(wait):
            return KubeVirtUnreadable("the read in flight did not finish within this call's time")
        with self._lock:
            last = self._last
        return last if last is not None else KubeVirtUnreadable("the read did not finish")

    def _read(self) -> KubeVirtView:
        settings = self._settings
        path = (
            f"/apis/kubevirt.io/v1/namespaces/{settings.kubevirt_namespace}"
            f"/kubevirts/{settings.kubevirt_name}"
        )
        try:
            return KubeVirtFound(decoded(_KUBEVIRT, self._api.get(path)), self._location)
        except NotFound:
            return KubeVirtAbsent(self._location)
        except Unreadable as error:
            return KubeVirtUnreadable(str(error))
        except Undecodable as error:
            return KubeVirtUnreadable(f"the KubeVirt object is not valid: {error}")
