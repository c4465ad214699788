"""GETs against the Kubernetes API, with `requests`: the one client of the edge.

The service account token is re-read on every call (kubelet rotates it); the CA is the service
account's unless `GPUCLASS_KUBE_CA_FILE` says otherwise; every call has a short timeout. A failed
read raises `Unreadable`, whose message says why in a few words and is safe to show (no
credentials, no body, no path): the reader that called names what it was reading.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import requests

from hooks.settings import Settings
from hooks.wire.problems import Undecodable, Unreadable, decoded

PAGE_SIZE = 500


class NotFound(Unreadable):
    """404: the object, or the whole API, does not exist."""


def _read_token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class _Page(msgspec.Struct):
    items: list[msgspec.Raw] = []
    metadata: dict[str, Any] = {}


_PAGE = msgspec.json.Decoder(_Page)


class ApiClient:
    """GETs against the API server, safe to share between threads: `requests` sessions are not
    thread-safe, so each thread reads through a session of its own (and keeps its connection),
    and no lock is held across a read."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
        return session

    def get(self, path: str, params: dict[str, str] | None = None) -> bytes:
        settings = self._settings
        base = settings.api_base_url()
        if base is None:
            raise Unreadable("no Kubernetes API configured (GPUCLASS_KUBE_API)")
        headers = {"Accept": "application/json"}
        token = _read_token(settings.kube_token_file)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        verify: bool | str = True
        if base.startswith("https://") and settings.kube_ca_file.is_file():
            verify = str(settings.kube_ca_file)
        try:
            response = self._session().get(
                base + path,
                params=params,
                headers=headers,
                timeout=settings.kube_timeout_seconds,
                verify=verify,
            )
        except requests.Timeout:
            raise Unreadable("timed out") from None
        except requests.RequestException as error:
            raise Unreadable(f"request failed ({type(error).__name__})") from None
        if response.status_code == 404:
            raise NotFound("not found")
        if response.status_code != 200:
            raise Unreadable(f"HTTP {response.status_code}")
        return response.content

    def list(self, path: str, label_selector: str | None = None) -> Iterator[msgspec.Raw]:
        """Every object of a list endpoint, page by page, each left raw for its own decoder."""
        params = {"limit": str(PAGE_SIZE)}
        if label_selector:
            params["labelSelector"] = label_selector
        while True:
            try:
                page = decoded(_PAGE, self.get(path, params))
            except Undecodable as error:
                raise Unreadable(f"the list is not valid: {error}") from None
            yield from page.items
            token = page.metadata.get("continue")
            if not token:
                return
            if str(token) == params.get("continue"):
                # A server or proxy that hands back the token it was sent would keep this
                # thread reading the same page for ever.
                raise Unreadable("the list's continue token did not advance")
            params["continue"] = str(token)
