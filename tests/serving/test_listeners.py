"""The probe and metrics listeners (`hooks.serving.listeners`), on loopback ports of their own:
plain HTTP for the probes, the hooks' TLS for the metrics, the token when metrics require it."""

from __future__ import annotations

import logging
import socket
import ssl
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import trustme

from hooks.serving import listeners
from hooks.serving.metrics import Metrics
from hooks.settings import Settings

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture
def state() -> listeners.ServiceState:
    return listeners.ServiceState()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(180.0)


def started(
    settings: Settings, state: listeners.ServiceState, metrics: Metrics
) -> Iterator[tuple[str, str]]:
    health, scrape = listeners.start(
        settings, "127.0.0.1", 0, 0, state, metrics, listeners.server_tls(settings)
    )
    try:
        scheme = "https" if settings.tls_cert_file else "http"
        yield f"http://127.0.0.1:{health.port}", f"{scheme}://127.0.0.1:{scrape.port}"
    finally:
        health.stop()
        scrape.stop()


@pytest.fixture
def plain(state: listeners.ServiceState, metrics: Metrics) -> Iterator[tuple[str, str]]:
    yield from started(Settings(), state, metrics)


def tls_settings(tmp_path: Path) -> tuple[Settings, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain, key, ca_file = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    cert.cert_chain_pems[0].write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    return Settings(tls_cert_file=chain, tls_key_file=key), ca_file


def test_health_answers_up_and_ready_until_the_drain(
    plain: tuple[str, str], state: listeners.ServiceState
) -> None:
    health, _ = plain
    assert requests.get(f"{health}/healthz", timeout=5).json() == {"status": "ok"}
    assert requests.get(f"{health}/readyz", timeout=5).status_code == 200
    state.drain()
    ready = requests.get(f"{health}/readyz", timeout=5)
    assert (ready.status_code, ready.json()) == (503, {"error": "shutting down"})
    assert requests.get(f"{health}/healthz", timeout=5).status_code == 200


def test_each_port_serves_only_its_own_paths(plain: tuple[str, str]) -> None:
    health, scrape = plain
    assert requests.get(f"{health}/metrics", timeout=5).status_code == 404
    assert requests.get(f"{scrape}/healthz", timeout=5).status_code == 404
    assert requests.get(f"{health}/status/sync", timeout=5).status_code == 404


def test_metrics_are_the_exposition_of_the_workers_metrics(
    plain: tuple[str, str], metrics: Metrics
) -> None:
    _, scrape = plain
    metrics.calls_in_progress.inc()
    response = requests.get(f"{scrape}/metrics", timeout=5)
    assert response.headers["Content-Type"].startswith("text/plain")
    assert "cozystack_gpu_hook_calls_in_progress 1.0" in response.text


def test_metrics_can_require_the_hooks_token(
    tmp_path: Path, state: listeners.ServiceState, metrics: Metrics
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("first-token\n")
    settings = Settings(auth_token_file=tokens, metrics_require_auth=True)
    for health, scrape in started(settings, state, metrics):
        assert requests.get(f"{scrape}/metrics", timeout=5).status_code == 401
        bearer = {"Authorization": "Bearer first-token"}
        assert requests.get(f"{scrape}/metrics", headers=bearer, timeout=5).status_code == 200
        assert requests.get(f"{health}/healthz", timeout=5).status_code == 200  # probes: open
    open_scrape = Settings(auth_token_file=tokens)
    for _, scrape in started(open_scrape, state, metrics):
        assert requests.get(f"{scrape}/metrics", timeout=5).status_code == 200


def test_metrics_speak_the_hooks_tls_and_probes_stay_plain(
    tmp_path: Path, state: listeners.ServiceState, metrics: Metrics
) -> None:
    tls, ca_file = tls_settings(tmp_path)
    # a client CA on the hooks (Metacontroller's mTLS) asks nothing of Prometheus or kubelet
    settings = tls.model_copy(update={"tls_client_ca_file": ca_file})
    for health, scrape in started(settings, state, metrics):
        assert scrape.startswith("https://")
        assert requests.get(f"{scrape}/metrics", verify=str(ca_file), timeout=5).status_code == 200
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(scrape.replace("https", "http") + "/metrics", timeout=5)
        assert requests.get(f"{health}/readyz", timeout=5).status_code == 200


def test_a_silent_client_is_dropped_and_others_are_answered_meanwhile(
    state: listeners.ServiceState, metrics: Metrics
) -> None:
    """A connection that says nothing waits in the listener's event loop, not in a thread, and is
    closed at the head deadline: a client cannot hold the probes."""
    for health, _ in started(Settings(header_timeout_seconds=3), state, metrics):
        port = int(health.rsplit(":", 1)[1])
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        try:
            assert requests.get(f"{health}/healthz", timeout=5).status_code == 200
            silent[0].setblocking(False)
            with pytest.raises(BlockingIOError):  # answered while the silent ones are held
                silent[0].recv(1)
            silent[0].settimeout(10)
            assert silent[0].recv(1) == b""  # closed by the listener, not by us
        finally:
            for connection in silent:
                connection.close()


def test_two_workers_can_listen_on_the_same_ports(
    state: listeners.ServiceState, metrics: Metrics
) -> None:
    first, scrape = listeners.start(Settings(), "127.0.0.1", 0, 0, state, metrics, None)
    try:
        second = listeners.listen(
            "127.0.0.1", first.port, listeners.health_routes(state), None, head_seconds=5
        )
        second.stop()
    finally:
        first.stop()
        scrape.stop()


def test_tls_context_follows_the_settings(tmp_path: Path) -> None:
    assert listeners.server_tls(Settings()) is None
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.cert_chain_pems[0].write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecated protocol
        source = listeners.server_tls(Settings(tls_cert_file=chain, tls_key_file=key))
        assert source is not None
        context = source.context()
    assert isinstance(context, ssl.SSLContext)
    assert context.protocol == ssl.PROTOCOL_TLS_SERVER
    assert context.verify_mode == ssl.CERT_NONE  # no client certificate asked of scrapers


def test_every_answer_is_json_with_its_exact_body_and_length(
    plain: tuple[str, str], state: listeners.ServiceState, tmp_path: Path, metrics: Metrics
) -> None:
    health, _ = plain
    answers = {
        f"{health}/healthz": (200, b'{"status":"ok"}'),
        f"{health}/readyz": (200, b'{"status":"ready"}'),
        f"{health}/nothing": (404, b'{"error":"not found"}'),
    }
    for url, (code, body) in answers.items():
        response = requests.get(url, timeout=5)
        assert (response.status_code, response.content) == (code, body)
        assert response.headers["Content-Type"] == "application/json"
        assert response.headers["Content-Length"] == str(len(body))
    tokens = tmp_path / "tokens"
    tokens.write_text("t\n")
    guarded = Settings(auth_token_file=tokens, metrics_require_auth=True)
    for _, guarded_scrape in started(guarded, state, metrics):
        refused = requests.get(f"{guarded_scrape}/metrics", timeout=5)
        assert refused.content == b'{"error":"missing or invalid bearer token"}'


@pytest.mark.parametrize("query", ["?x=1", "?a?b"])
def test_a_query_string_is_ignored(plain: tuple[str, str], query: str) -> None:
    health, scrape = plain
    assert requests.get(f"{health}/healthz{query}", timeout=5).status_code == 200
    assert requests.get(f"{scrape}/metrics{query}", timeout=5).status_code == 200


def test_metrics_required_to_be_authenticated_with_no_token_file_stay_open(
    state: listeners.ServiceState, metrics: Metrics
) -> None:
    """Without hook tokens there is nothing to present: the setting alone closes nothing."""
    for _, scrape in started(Settings(metrics_require_auth=True), state, metrics):
        assert requests.get(f"{scrape}/metrics", timeout=5).status_code == 200


def test_a_tls_client_that_never_says_hello_is_dropped(
    tmp_path: Path, state: listeners.ServiceState, metrics: Metrics
) -> None:
    settings, _ = tls_settings(tmp_path)
    settings = settings.model_copy(update={"header_timeout_seconds": 0.3})
    for _, scrape in started(settings, state, metrics):
        port = int(scrape.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as silent:
            silent.settimeout(5)
            assert silent.recv(1) == b""  # closed by the listener, not by us


def test_broken_clients_leave_no_trace_and_the_listener_answers_on(
    tmp_path: Path,
    state: listeners.ServiceState,
    metrics: Metrics,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handshake that fails (plain HTTP to the TLS port) and a client reset mid-request are
    nothing to answer or report."""
    settings, ca_file = tls_settings(tmp_path)
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        for health, scrape in started(settings, state, metrics):
            with pytest.raises(requests.exceptions.ConnectionError):
                requests.get(scrape.replace("https", "http") + "/metrics", timeout=5)
            port = int(health.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port)) as reset:
                reset.sendall(b"GET /healthz HTTP/1.1\r\nHost: x")
                reset.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
            time.sleep(0.2)  # the listener's threads meet the failures
            metrics_answer = requests.get(f"{scrape}/metrics", verify=str(ca_file), timeout=5)
            assert metrics_answer.status_code == 200
            assert requests.get(f"{health}/healthz", timeout=5).status_code == 200
    assert capsys.readouterr().err == ""
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_listener_stops_promptly_and_its_thread_never_holds_the_process(
    state: listeners.ServiceState,
) -> None:
    listener = listeners.listen(
        "127.0.0.1", 0, listeners.health_routes(state), None, head_seconds=60
    )
    assert listener.thread.is_alive() and listener.thread.daemon
    assert listener.thread.name == "listener :0"
    time.sleep(0.25)  # well into a poll, whatever its interval
    stopping = time.monotonic()
    listener.stop()
    listener.thread.join(30)
    # woken, not left to wait out its poll (as long as the head deadline, a minute here)
    assert time.monotonic() - stopping < 30
    assert not listener.thread.is_alive()


def test_a_listener_that_stops_unbidden_makes_the_process_neither_ready_nor_live(
    state: listeners.ServiceState,
) -> None:
    """Its port refuses every connection from then on: the probes say so, naming it, and the
    kubelet restarts the pod."""
    routes = listeners.health_routes(state)
    admission = listeners.listen("127.0.0.1", 0, routes, None, head_seconds=5, name="admission")
    state.listeners.append(admission)
    assert routes["/readyz"]({}).code == 200 and routes["/healthz"]({}).code == 200

    def fail() -> None:
        raise RuntimeError("the loop ends")

    admission.call_soon(fail)
    admission.thread.join(10)
    assert admission.stopped
    why = f"the admission port's listener ({admission.port}) stopped"
    for route in ("/readyz", "/healthz"):
        reply = routes[route]({})
        assert reply.code == 503 and why in reply.body.decode()
    stopped_on_purpose = listeners.listen("127.0.0.1", 0, routes, None, head_seconds=5)
    stopped_on_purpose.stop()
    assert not stopped_on_purpose.stopped


def test_a_worker_says_which_ports_it_listens_on(
    state: listeners.ServiceState, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        health, scrape = listeners.start(Settings(), "127.0.0.1", 0, 0, state, metrics, None)
    health.stop()
    scrape.stop()
    [line] = [r for r in caplog.records if r.getMessage() == "listening"]
    assert line.fields == {"health_port": health.port, "metrics_port": scrape.port}  # type: ignore[attr-defined]


def test_an_error_in_a_route_is_one_log_line_and_no_traceback_on_stderr(
    state: listeners.ServiceState,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken(headers: dict[str, str]) -> listeners.Reply:
        raise RuntimeError(headers["authorization"])  # a message that quotes the request

    listener = listeners.listen("127.0.0.1", 0, {"/broken": broken}, None, head_seconds=5)
    try:
        with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
            with pytest.raises(requests.exceptions.ConnectionError):
                requests.get(
                    f"http://127.0.0.1:{listener.port}/broken",
                    headers={"Authorization": "Bearer secret-token-value"},
                    timeout=5,
                )
            time.sleep(0.1)  # the error is logged after the connection is dropped
        assert requests.get(f"http://127.0.0.1:{listener.port}/x", timeout=5).status_code == 404
    finally:
        listener.stop()
    [line] = [r for r in caplog.records if r.getMessage() == "unexpected error"]
    fields = line.fields  # type: ignore[attr-defined]
    assert (fields["route"], fields["error"]) == ("listener", "RuntimeError")
    assert 0 < len(fields["frames"]) <= 3 and "in broken" in fields["frames"][-1]
    assert "secret-token-value" not in repr(fields)
    assert capsys.readouterr().err == ""
