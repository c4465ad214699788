"""The one read the hooks make themselves: the KubeVirt CR, for permittedHostDevices.

KubeVirt is never a Metacontroller related resource: a rule for an API that is not served fails
every sync before the hook is called. So the status hook reads the CR itself, with a short
timeout and a per-process cache of a few seconds, so that a burst of class syncs makes one read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import requests

from hooks.rules.permission import KubeVirtAbsent, KubeVirtFound, KubeVirtUnreadable, KubeVirtView
from hooks.settings import Settings
from hooks.wire.kube import KubeVirt

ReadObserver = Callable[[str], None]


def _read_token(path: Path) -> str | None:
    """The service account token is re-read on every call: kubelet rotates it."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def outcome_of(view: KubeVirtView) -> str:
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
        self._session = requests.Session()
        self._location = f"{settings.kubevirt_namespace}/{settings.kubevirt_name}"

    def view(self) -> KubeVirtView:
        # One lock held across the read: concurrent syncs wait for one answer instead of each
        # asking the API server the same question.
        with self._lock:
            now = self._clock()
            if (
                self._cached is not None
                and now - self._cached[0] < self._settings.kubevirt_cache_seconds
            ):
                return self._cached[1]
            view = self._read()
            self._cached = (self._clock(), view)
        if self._observe is not None:
            self._observe(outcome_of(view))
        return view

    def _read(self) -> KubeVirtView:
        settings = self._settings
        base = settings.api_base_url()
        if base is None:
            return KubeVirtUnreadable("no Kubernetes API configured (GPUCLASS_KUBE_API)")
        url = (
            f"{base}/apis/kubevirt.io/v1/namespaces/{settings.kubevirt_namespace}"
            f"/kubevirts/{settings.kubevirt_name}"
        )
        headers = {"Accept": "application/json"}
        token = _read_token(settings.kube_token_file)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        verify: bool | str = True
        if url.startswith("https://") and settings.kube_ca_file.is_file():
            verify = str(settings.kube_ca_file)
        try:
            response = self._session.get(
                url, headers=headers, timeout=settings.kube_timeout_seconds, verify=verify
            )
        except requests.Timeout:
            return KubeVirtUnreadable("timed out")
        except requests.RequestException as error:
            return KubeVirtUnreadable(f"request failed ({type(error).__name__})")
        if response.status_code == 404:
            return KubeVirtAbsent(self._location)
        if response.status_code != 200:
            return KubeVirtUnreadable(f"HTTP {response.status_code}")
        try:
            return KubeVirtFound(
                msgspec.json.decode(response.content, type=KubeVirt), self._location
            )
        except (msgspec.DecodeError, RecursionError):
            return KubeVirtUnreadable("the KubeVirt object is not valid")
