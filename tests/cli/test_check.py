"""`gpuclass-hooks check` (`hooks.cli.check`), run in this process against the hooks served over
HTTPS from a thread (werkzeug's server, the app as `serve` builds it), and against a server that
answers what the real one never does. The chart's helm test Pod running it is tested in
test_helm_test.py."""

from __future__ import annotations

import json
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme
from werkzeug.serving import make_server

from hooks.cli.check import CUSTOMIZE_PATH, Target, check
from hooks.serving.app import create_app
from hooks.settings import Settings
from tests.pki import write_pki

TOKEN = "check-token-never-printed"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_pki(tmp_path_factory.mktemp("pki"))


@contextmanager
def hooks_served(
    settings: Settings, pki: dict[str, Path], *, client_ca: bool = False
) -> Iterator[str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki["cert"]), str(pki["key"]))
    if client_ca:
        context.load_verify_locations(str(pki["ca"]))
        context.verify_mode = ssl.CERT_REQUIRED
    server = make_server("127.0.0.1", 0, create_app(settings), threaded=True, ssl_context=context)
    with serving_forever(server):
        yield f"https://127.0.0.1:{server.port}"


@contextmanager
def serving_forever(server: socketserver.BaseServer) -> Iterator[None]:
    """The server answering from a thread of its own until the block ends."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        thread.join()


def with_token(settings: Settings, tmp_path: Path, accepted: str = TOKEN) -> Settings:
    tokens = tmp_path / "accepted"
    tokens.write_text(accepted + "\n")
    return settings.model_copy(update={"auth_token_file": tokens})


def token_file(tmp_path: Path, token: str = TOKEN) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    return path


def test_check_passes_against_hooks_that_want_the_token(
    settings: Settings, pki: dict[str, Path], tmp_path: Path
) -> None:
    with hooks_served(with_token(settings, tmp_path), pki) as url:
        assert check(Target(url, pki["ca"], token_file(tmp_path))) == []


def test_check_without_a_token_file_makes_only_the_call_with_no_token(
    settings: Settings, pki: dict[str, Path]
) -> None:
    with hooks_served(settings, pki) as url:
        assert check(Target(url, pki["ca"])) == []


def test_check_reports_a_token_the_hooks_refuse_and_never_prints_it(
    settings: Settings, pki: dict[str, Path], tmp_path: Path
) -> None:
    with hooks_served(with_token(settings, tmp_path, accepted="another"), pki) as url:
        problems = check(Target(url, pki["ca"], token_file(tmp_path)))
    assert problems == [f"{CUSTOMIZE_PATH} with the token: HTTP 401, expected 200"]


def test_check_reports_hooks_that_answer_without_the_token(
    settings: Settings, pki: dict[str, Path], tmp_path: Path
) -> None:
    with hooks_served(settings, pki) as url:
        problems = check(Target(url, pki["ca"], token_file(tmp_path)))
    assert problems == [f"{CUSTOMIZE_PATH} without a token: HTTP 200, expected 401"]


def test_check_presents_the_client_certificate_when_given_one(
    settings: Settings, pki: dict[str, Path], tmp_path: Path
) -> None:
    with hooks_served(with_token(settings, tmp_path), pki, client_ca=True) as url:
        token = token_file(tmp_path)
        presented = check(Target(url, pki["ca"], token, pki["client.crt"], pki["client.key"]))
        missing = check(Target(url, pki["ca"], token))
    assert presented == []
    assert len(missing) == 1
    assert missing[0].startswith(f"{CUSTOMIZE_PATH}: ")


def test_check_refuses_a_certificate_its_ca_did_not_sign(
    settings: Settings, pki: dict[str, Path], tmp_path: Path
) -> None:
    other_ca = tmp_path / "other-ca"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    with hooks_served(settings, pki) as url:
        problems = check(Target(url, other_ca))
    assert len(problems) == 1
    assert "SSLCertVerificationError" in problems[0]


def test_check_verifies_that_the_certificate_names_the_host_it_called(
    settings: Settings, tmp_path: Path
) -> None:
    """As Metacontroller and the API server do: a certificate its CA signed, for another name,
    fails the check."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    elsewhere = ca.issue_cert("elsewhere.cozy-gpu.svc")
    elsewhere.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "elsewhere.pem"))
    pki = {"cert": tmp_path / "elsewhere.pem", "key": tmp_path / "elsewhere.pem"}
    with hooks_served(settings, pki) as url:
        problems = check(Target(url, tmp_path / "ca.crt"))
    assert len(problems) == 1
    assert "SSLCertVerificationError" in problems[0] and "127.0.0.1" in problems[0]


# What a plain server answers a POST: its status and body, from the request's headers and body.
Respond = Callable[[Message, bytes], tuple[int, bytes]]


@contextmanager
def plain_server(respond: Respond) -> Iterator[str]:
    """A plain HTTP server answering every POST with `respond`: for what the hooks never do."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            status, body = respond(
                self.headers, self.rfile.read(int(self.headers["Content-Length"]))
            )
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with serving_forever(server):
        yield f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("refusal", [403, 404, 500, 503])
def test_check_requires_exactly_401_from_a_call_without_the_token(
    refusal: int, tmp_path: Path
) -> None:
    """Metacontroller's token is what keeps other callers out: a service that answers them with
    anything but 401 (a proxy's 403, a 404 of the wrong service, a 500) is not shown to
    authenticate, and fails the check."""

    def respond(headers: Message, body: bytes) -> tuple[int, bytes]:
        if headers.get("Authorization") == f"Bearer {TOKEN}":
            return 200, b'{"relatedResources": []}'
        return refusal, b'{"error": "no"}'

    with plain_server(respond) as url:
        problems = check(Target(url, token_file=token_file(tmp_path)))
    assert problems == [f"{CUSTOMIZE_PATH} without a token: HTTP {refusal}, expected 401"]


def test_check_reports_an_answer_without_related_resources() -> None:
    with plain_server(lambda *_: (200, b'{"relatedResources_": []}')) as url:
        assert check(Target(url)) == [f"{CUSTOMIZE_PATH}: the answer has no relatedResources"]


def test_check_reports_an_answer_that_is_not_json_in_one_line() -> None:
    with plain_server(lambda *_: (200, b"<html>")) as url:
        problems = check(Target(url))
    assert len(problems) == 1
    assert problems[0].startswith(f"{CUSTOMIZE_PATH}: JSONDecodeError: ")


def test_check_sends_the_customize_request_metacontroller_would(tmp_path: Path) -> None:
    seen: list[tuple[str | None, str | None, dict[str, Any]]] = []

    def respond(headers: Message, body: bytes) -> tuple[int, bytes]:
        seen.append((headers.get("Authorization"), headers.get("Content-Type"), json.loads(body)))
        return (200 if headers.get("Authorization") else 401), b'{"relatedResources": []}'

    with plain_server(respond) as url:
        assert check(Target(url, token_file=token_file(tmp_path))) == []
    assert [authorization for authorization, _, _ in seen] == [f"Bearer {TOKEN}", None]
    assert {content_type for _, content_type, _ in seen} == {"application/json"}
    assert seen[0][2]["parent"]["kind"] == "GPUClass"
    assert seen[0][2]["controller"]["kind"] == "CompositeController"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_check_gives_up_on_a_service_that_never_answers_within_its_timeout(scheme: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        url = f"{scheme}://127.0.0.1:{silent.getsockname()[1]}"
        problems: list[list[str]] = []
        checking = threading.Thread(
            target=lambda: problems.append(check(Target(url, timeout_seconds=0.2))), daemon=True
        )
        checking.start()
        checking.join(10)
    assert not checking.is_alive(), "check waited past its timeout"
    [[problem]] = problems
    assert problem.startswith(f"{CUSTOMIZE_PATH}: TimeoutError: ")
    assert problem.endswith("timed out")


def test_check_without_a_ca_file_verifies_against_the_system_cas(
    settings: Settings, pki: dict[str, Path]
) -> None:
    with hooks_served(settings, pki) as url:
        problems = check(Target(url))
    assert len(problems) == 1
    assert "SSLCertVerificationError" in problems[0]


def test_check_takes_a_client_certificate_whose_file_holds_its_key(
    settings: Settings, pki: dict[str, Path], tmp_path: Path
) -> None:
    combined = tmp_path / "client.pem"
    combined.write_bytes(pki["client.key"].read_bytes() + pki["client.crt"].read_bytes())
    with hooks_served(with_token(settings, tmp_path), pki, client_ca=True) as url:
        assert check(Target(url, pki["ca"], token_file(tmp_path), combined)) == []


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:9", "http://:9", "127.0.0.1:9"])
def test_check_refuses_a_url_it_cannot_call_in_one_line(url: str) -> None:
    assert check(Target(url)) == [
        f"{CUSTOMIZE_PATH}: ValueError: {url} is not an http:// or https:// URL with a host"
    ]


def test_check_waits_reach_seconds_for_a_service_not_yet_routed(tmp_path: Path) -> None:
    """helm test runs right after `helm install --wait`: the Service may route to the pods a
    moment later. A refused first connection is retried for reach_seconds, then answered."""
    from tests.live import free_port

    port = free_port()
    started = time.monotonic()
    problems = check(Target(f"http://127.0.0.1:{port}", reach_seconds=1.0))
    assert len(problems) == 1 and "ConnectionRefusedError" in problems[0]
    assert time.monotonic() - started >= 1.0

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def serve_late() -> None:
        time.sleep(1.0)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        _answer_one_customize(listener)

    server = threading.Thread(target=serve_late, daemon=True)
    server.start()
    try:
        assert check(Target(f"http://127.0.0.1:{port}", reach_seconds=10)) == []
    finally:
        server.join(timeout=10)
        listener.close()


def test_check_waits_reach_seconds_for_a_service_name_not_yet_resolved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Service made moments before `helm test` may not resolve yet: the cluster's DNS caches
    its first miss for seconds. That is retried for reach_seconds, then answered; a name that
    never resolves is said in one line. The retries wait on a stepped clock, so a busy machine
    cannot change how many there are."""
    monkeypatch.setattr("hooks.cli.check.time", _SteppedTime())
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    resolve = socket.getaddrinfo
    misses = {"left": 2, "asked": 0}

    def cluster_dns(host: str, *args: Any, **kwargs: Any) -> Any:
        if host != "hooks.cozy-gpu.svc":
            return resolve(host, *args, **kwargs)
        misses["asked"] += 1
        if misses["left"] == 0:
            return resolve("127.0.0.1", *args, **kwargs)
        misses["left"] -= 1
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", cluster_dns)

    # A daemon: a check that never calls leaves it in accept(), which must not hold pytest's exit.
    server = threading.Thread(target=_answer_one_customize, args=(listener,), daemon=True)
    server.start()
    try:
        assert check(Target(f"http://hooks.cozy-gpu.svc:{port}", reach_seconds=30)) == []
    finally:
        server.join(timeout=10)
        listener.close()
    assert misses["asked"] == 3

    misses.update(left=10**6, asked=0)
    [problem] = check(Target(f"http://hooks.cozy-gpu.svc:{port}", reach_seconds=0.6))
    assert problem.startswith(f"{CUSTOMIZE_PATH}: gaierror: ")
    assert misses["asked"] == 3  # at 0, 0.5 and 1.0 s: the last one past the 0.6 s allowed


def _answer_one_customize(listener: socket.socket) -> None:
    """Accepts one connection on the listener and answers it as a customize hook would."""
    connection, _ = listener.accept()
    connection.recv(65536)
    body = b'{"relatedResources": []}'
    connection.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    connection.close()


class _SteppedTime:
    """`time` for the check's retries: sleeping moves the clock on at once, nothing else does."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
