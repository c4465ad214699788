"""GETs against the Kubernetes API, with `requests`: the one client of the edge.

The service account token is re-read on every call (kubelet rotates it); the CA is the service
account's unless `GPUCLASS_KUBE_CA_FILE` says otherwise. Every GET ends, answered whole or given up,
within `GPUCLASS_KUBE_TIMEOUT_SECONDS` and within the deadline of the call it is made for
(`CALL_DEADLINE`, which the serving side sets per call), from connect to the body's last byte,
however the server paces its headers or its body: `requests` bounds each socket read only, so a
watchdog shuts the read's socket down when the deadline passes. A redirect is not followed (the
API never redirects a read). A failed read raises `Unreadable`, whose message says why in a few
words and is safe to show (no credentials, no body, no path): the reader that called names what
it was reading.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import msgspec
import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from hooks.settings import Settings
from hooks.wire.problems import Undecodable, Unreadable, decoded

PAGE_SIZE = 500
READ_BYTES = 256 * 1024
# When the call a read is made for must be answered (time.monotonic()); None: no call waits.
CALL_DEADLINE: ContextVar[float | None] = ContextVar("call_deadline", default=None)


class NotFound(Unreadable):
    """404: the object, or the whole API, does not exist."""


def _read_token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class ReadShare:
    """The memory the process sets aside for answers of the API being read: every read in flight
    takes each piece of its answer from it as the piece arrives, and gives all back when it
    ends, however it ends. One read may take all of it; past it the read fails."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        return self._used

    def take(self, count: int) -> bool:
        with self._lock:
            if self._used + count > self.limit_bytes:
                return False
            self._used += count
            return True

    def give(self, count: int) -> None:
        with self._lock:
            self._used -= count


def _body_by(response: requests.Response, end: float, share: ReadShare) -> bytes:
    """The body, read whole by `end` (time.monotonic()) and within the share decompressed, or
    Unreadable: each read waits at most what is left, so however the server paces its bytes, the
    caller is free at `end`; and however much it sends, or however far it inflates, the reads in
    flight hold at most the share, and each a piece more."""
    raw = response.raw
    pieces: list[bytes] = []
    held = 0
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise Unreadable("timed out")
            connection = raw.connection
            if connection is not None and connection.sock is not None:
                connection.sock.settimeout(left)
            piece = raw.read1(READ_BYTES, decode_content=True)
            if not piece:
                return b"".join(pieces)
            if held + len(piece) > share.limit_bytes:
                raise Unreadable(f"the answer is over {share.limit_bytes} bytes")
            if not share.take(len(piece)):
                raise Unreadable(
                    f"the reads in flight hold the {share.limit_bytes} bytes set aside for them"
                )
            held += len(piece)
            pieces.append(piece)
    except (urllib3.exceptions.HTTPError, OSError) as error:
        if isinstance(error, TimeoutError | urllib3.exceptions.TimeoutError):
            raise Unreadable("timed out") from None
        raise Unreadable(f"request failed ({type(error).__name__})") from None
    finally:
        share.give(held)


class _Watchdog:
    """Shuts a read's socket down at `end`, whatever the read waits for then: a header line
    trickled a byte at a time, a body, a redirect's answer. The blocked read fails at once. The
    socket is the one the request was sent on (`_WatchedConnection`), new or kept alive; a
    connect is bounded by its own timeout."""

    def __init__(self, end: float) -> None:
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, end - time.monotonic()), self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sock = self._sock
        if sock is not None:
            _shut(sock)

    def reading(self, sock: socket.socket | None) -> None:
        """The request was sent on this socket: it is the one to shut at the deadline."""
        with self._lock:
            self._sock = sock
            fired = self.fired
        if fired and sock is not None:
            _shut(sock)

    def __enter__(self) -> _Watchdog:
        _WATCHING.dog = self
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        _WATCHING.dog = None


def _shut(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Watching(threading.local):
    dog: _Watchdog | None = None


_WATCHING = _Watching()


class _WatchedConnection(HTTPConnection):
    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        dog = _WATCHING.dog
        if dog is not None:
            dog.reading(self.sock)
        return super().getresponse(*args, **kwargs)


class _WatchedHTTPSConnection(_WatchedConnection, HTTPSConnection):
    pass


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class _WatchedAdapter(HTTPAdapter):
    """Connections that tell the thread's watchdog which socket a read is on."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _WatchedHTTPPool,
            "https": _WatchedHTTPSPool,
        }


class _Page(msgspec.Struct):
    items: list[msgspec.Raw] = []
    metadata: dict[str, Any] = {}


_PAGE = msgspec.json.Decoder(_Page)


class ApiClient:
    """GETs against the API server, safe to share between threads: `requests` sessions are not
    thread-safe, so each thread reads through a session of its own (and keeps its connection),
    and no lock is held across a read. Clients of one process share one `ReadShare`."""

    def __init__(self, settings: Settings, share: ReadShare | None = None) -> None:
        self._settings = settings
        self._local = threading.local()
        self._share = share or ReadShare(settings.kube_read_max_bytes)

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.mount("http://", _WatchedAdapter())
            session.mount("https://", _WatchedAdapter())
            self._local.session = session
        return session

    def get(self, path: str, params: dict[str, str] | None = None) -> bytes:
        settings = self._settings
        base = settings.api_base_url()
        if base is None:
            raise Unreadable("no Kubernetes API configured (GPUCLASS_KUBE_API)")
        end = time.monotonic() + settings.kube_timeout_seconds
        call_end = CALL_DEADLINE.get()
        if call_end is not None and call_end < end:
            end = call_end
        left = end - time.monotonic()
        if left <= 0:
            raise Unreadable("no time left before the call's deadline")
        headers = {"Accept": "application/json"}
        token = _read_token(settings.kube_token_file)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        verify: bool | str = True
        if base.startswith("https://") and settings.kube_ca_file.is_file():
            verify = str(settings.kube_ca_file)
        with _Watchdog(end) as watchdog:
            try:
                response = self._session().get(
                    base + path,
                    params=params,
                    headers=headers,
                    timeout=left,
                    verify=verify,
                    stream=True,
                    allow_redirects=False,
                )
            except requests.Timeout:
                raise Unreadable("timed out") from None
            except requests.RequestException as error:
                if watchdog.fired:
                    raise Unreadable("timed out") from None
                raise Unreadable(f"request failed ({type(error).__name__})") from None
            with response:
                if response.status_code == 404:
                    raise NotFound("not found")
                if response.status_code != 200:
                    raise Unreadable(f"HTTP {response.status_code}")
                try:
                    return _body_by(response, end, self._share)
                except Unreadable:
                    if watchdog.fired:
                        raise Unreadable("timed out") from None
                    raise

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
