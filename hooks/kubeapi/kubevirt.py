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

from hooks.kubeapi.client import ApiClient, NotFound
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
    """Reads the KubeVirt CR, caching every outcome (failures too) for `cache_seconds`."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        observe: ReadObserver | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._observe = observe
        self._lock = threading.Lock()
        self._cached: tuple[float, KubeVirtView] | None = None
        self._api = ApiClient(settings)
        self._location = f"{settings.kubevirt_namespace}/{settings.kubevirt_name}"

    def view(self) -> KubeVirtView:
        # One lock held across the read: concurrent syncs wait for one answer instead of each
        # asking the API server the same question.
        with self._lock:
            now = self._clock()
            cached = self._cached
            if cached is not None and now - cached[0] < self._settings.kubevirt_cache_seconds:
                return cached[1]
            view = self._read()
            self._cached = (self._clock(), view)
        if self._observe is not None:
            self._observe(outcome_of(view))
        return view

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
