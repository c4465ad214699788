"""The Kubernetes API client (`hooks.kubeapi.client`) over HTTPS, as in a pod: the API server's
certificate is checked against the service account's CA, and every read carries the token and
asks for JSON. (The suite's fake API server speaks plain HTTP; the real one is in
test_real_apiserver.py, which starts processes and so is out of mutation testing's reach.)"""

from __future__ import annotations

import gzip
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme

from hooks.kubeapi.client import CALL_DEADLINE, ApiClient, ReadShare
from hooks.settings import Settings
from hooks.wire.problems import Unreadable
from tests.fake_apiserver import KUBEVIRT_PATH, FakeApiServer, Route
from tests.volumes import MountedVolume

OBJECT = {"kind": "KubeVirt", "metadata": {"name": "kubevirt"}}


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def https_api(ca: trustme.CA) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An HTTPS server answering every GET with OBJECT; the headers of each request."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            payload = json.dumps(OBJECT).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def api_client(api: str, tmp_path: Path, ca_pem: bytes | None) -> ApiClient:
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    ca_file = tmp_path / "ca.crt"
    if ca_pem is not None:
        ca_file.write_bytes(ca_pem)
    return ApiClient(
        Settings(kube_api=api, kube_token_file=token, kube_ca_file=ca_file, kube_timeout_seconds=5)
    )


def test_a_read_checks_the_api_servers_certificate_against_the_ca_file(
    https_api: tuple[str, list[dict[str, str]]], ca: trustme.CA, tmp_path: Path
) -> None:
    api, seen = https_api
    body = api_client(api, tmp_path, ca.cert_pem.bytes()).get("/apis/kubevirt.io/v1/x")
    assert json.loads(body) == OBJECT
    assert (seen[0]["accept"], seen[0]["authorization"]) == ("application/json", "Bearer sa-token")


def test_the_service_account_token_is_read_through_the_kubelets_links_on_every_read(
    https_api: tuple[str, list[dict[str, str]]], ca: trustme.CA, tmp_path: Path
) -> None:
    """The projected token the kubelet refreshes: each read presents the current one."""
    api, seen = https_api
    volume = MountedVolume(
        tmp_path / "serviceaccount", {"token": b"first\n", "ca.crt": ca.cert_pem.bytes()}
    )
    settings = Settings(
        kube_api=api,
        kube_token_file=volume.path("token"),
        kube_ca_file=volume.path("ca.crt"),
        kube_timeout_seconds=5,
    )
    reader = ApiClient(settings)
    reader.get("/apis/kubevirt.io/v1/x")
    volume.update({"token": b"second\n", "ca.crt": ca.cert_pem.bytes()})
    reader.get("/apis/kubevirt.io/v1/x")
    assert [headers["authorization"] for headers in seen] == ["Bearer first", "Bearer second"]


def test_a_certificate_another_ca_signed_is_refused(
    https_api: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    api, seen = https_api
    with pytest.raises(Unreadable, match=r"^request failed \(SSLError\)$"):
        api_client(api, tmp_path, trustme.CA().cert_pem.bytes()).get("/apis/kubevirt.io/v1/x")
    assert seen == []


def test_without_a_ca_file_the_system_cas_are_the_judges(
    https_api: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    api, seen = https_api
    with pytest.raises(Unreadable, match=r"^request failed \(SSLError\)$"):
        api_client(api, tmp_path, None).get("/apis/kubevirt.io/v1/x")
    assert seen == []


# --- every read ends within its bound, however the server paces its answer ---------------------


def test_a_body_trickled_within_every_read_timeout_is_given_up_as_a_whole(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    """One byte every 50 ms answers every socket read in time; the whole of it (tens of seconds)
    is not waited for: the read gives up at GPUCLASS_KUBE_TIMEOUT_SECONDS."""
    apiserver.routes["/trickled"] = Route(200, {"padding": "x" * 1000}, trickle=0.05)
    client = ApiClient(settings.model_copy(update={"kube_timeout_seconds": 0.5}))
    started = time.monotonic()
    with pytest.raises(Unreadable, match=r"^timed out$"):
        client.get("/trickled")
    assert time.monotonic() - started < 20  # the whole body would take over 50 s


def test_headers_trickled_within_every_read_timeout_are_given_up_at_the_reads_deadline(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    """A server that sends its status line and headers a byte at a time answers every socket
    read in time: the read is bounded as a whole, headers included, and its socket is shut down
    at its deadline (the whole head would take over 50 s)."""
    apiserver.routes["/trickled"] = Route(200, {"items": []}, head_trickle=0.05)
    client = ApiClient(settings.model_copy(update={"kube_timeout_seconds": 0.5}))
    started = time.monotonic()
    with pytest.raises(Unreadable, match=r"^timed out$"):
        client.get("/trickled")
    assert time.monotonic() - started < 20
    assert client.get(KUBEVIRT_PATH)  # the next read, on a new connection, is answered


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_an_answer_past_the_read_bound_is_unreadable_and_not_held(
    settings: Settings, apiserver: FakeApiServer, compressed: bool
) -> None:
    """Counted decompressed, as it is read: an answer of 4 MiB, or of a few kilobytes of gzip
    that inflate to 4 MiB, against a bound of 1 MiB fails naming the bound."""
    inflated = b'{"items": [], "padding": "' + b"x" * (4 << 20) + b'"}'
    if compressed:
        body = gzip.compress(inflated)
        assert len(body) < 64 * 1024
        route = Route(200, body, headers={"Content-Encoding": "gzip"})
    else:
        route = Route(200, inflated)
    apiserver.routes["/large"] = route
    bounded = ApiClient(settings.model_copy(update={"kube_read_max_bytes": 1 << 20}))
    with pytest.raises(Unreadable, match=r"^the answer is over 1048576 bytes$"):
        bounded.get("/large")
    assert ApiClient(settings).get("/large") == inflated  # within the default bound


def test_reads_in_flight_hold_their_answers_in_one_share_and_give_it_back_when_they_end(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    """The bound is on what the process's reads hold together, not on each alone: a read whose
    answer does not fit beside what other reads hold fails naming the share, and every read,
    answered or failed, gives back what it took."""
    answer = b'{"padding": "' + b"x" * (300 << 10) + b'"}'
    apiserver.routes["/page"] = Route(200, answer)
    share = ReadShare(1 << 20)
    reader = ApiClient(settings, share)
    assert reader.get("/page") == answer and share.used_bytes == 0
    assert share.take(800 << 10)  # another read in flight holds most of the share
    with pytest.raises(Unreadable, match=r"^the reads in flight hold the 1048576 bytes set aside"):
        reader.get("/page")
    assert share.used_bytes == 800 << 10
    share.give(800 << 10)
    assert reader.get("/page") == answer and share.used_bytes == 0


def test_a_redirect_is_never_followed(settings: Settings, apiserver: FakeApiServer) -> None:
    """The API never redirects a read: a 3xx is an unreadable answer, and where it points is
    never asked, however slowly it was sent."""
    apiserver.routes["/moved"] = Route(
        302, {"kind": "Status"}, delay=0.2, headers={"Location": f"{apiserver.url}/elsewhere"}
    )
    with pytest.raises(Unreadable, match=r"^HTTP 302$"):
        ApiClient(settings).get("/moved")
    assert [path for path, _ in apiserver.requests] == ["/moved"]


def test_a_read_ends_by_the_deadline_of_the_call_it_is_made_for(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    apiserver.routes["/trickled"] = Route(200, {"padding": "x" * 1000}, trickle=0.05)
    client = ApiClient(settings.model_copy(update={"kube_timeout_seconds": 30}))
    token = CALL_DEADLINE.set(time.monotonic() + 0.3)
    try:
        with pytest.raises(Unreadable, match=r"^timed out$"):
            client.get("/trickled")
    finally:
        CALL_DEADLINE.reset(token)
    assert client.get(KUBEVIRT_PATH)  # no call waits: the setting alone bounds it


def test_a_call_past_its_deadline_reads_nothing(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    token = CALL_DEADLINE.set(time.monotonic() - 1)
    try:
        with pytest.raises(Unreadable, match="no time left before the call's deadline"):
            ApiClient(settings).get(KUBEVIRT_PATH)
    finally:
        CALL_DEADLINE.reset(token)
    assert apiserver.requests == []
