"""The probe and metrics listeners (`hooks.ops`), on loopback ports of their own: plain HTTP for
the probes, the hooks' TLS for the metrics, the token when metrics require it."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import trustme

from hooks import ops
from hooks.metrics import Metrics
from hooks.settings import Settings

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture
def state() -> ops.ServiceState:
    return ops.ServiceState()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(180.0)


def started(
    settings: Settings, state: ops.ServiceState, metrics: Metrics
) -> Iterator[tuple[str, str]]:
    health, scrape = ops.start(settings, "127.0.0.1", 0, 0, state, metrics)
    try:
        scheme = "https" if settings.tls_cert_file else "http"
        yield f"http://127.0.0.1:{health.port}", f"{scheme}://127.0.0.1:{scrape.port}"
    finally:
        health.stop()
        scrape.stop()


@pytest.fixture
def plain(state: ops.ServiceState, metrics: Metrics) -> Iterator[tuple[str, str]]:
    yield from started(Settings(), state, metrics)


def test_health_answers_up_and_ready_until_the_drain(
    plain: tuple[str, str], state: ops.ServiceState
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
    tmp_path: Path, state: ops.ServiceState, metrics: Metrics
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
    tmp_path: Path, state: ops.ServiceState, metrics: Metrics
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain, key, ca_file = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    cert.cert_chain_pems[0].write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    # a client CA on the hooks (Metacontroller's mTLS) asks nothing of Prometheus or kubelet
    settings = Settings(tls_cert_file=chain, tls_key_file=key, tls_client_ca_file=ca_file)
    for health, scrape in started(settings, state, metrics):
        assert scrape.startswith("https://")
        assert requests.get(f"{scrape}/metrics", verify=str(ca_file), timeout=5).status_code == 200
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(scrape.replace("https", "http") + "/metrics", timeout=5)
        assert requests.get(f"{health}/readyz", timeout=5).status_code == 200


def test_a_silent_client_is_dropped_and_others_are_answered_meanwhile(
    state: ops.ServiceState, metrics: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each connection has its own thread, and one that says nothing is closed after the request
    timeout: a client cannot hold the probes."""
    monkeypatch.setattr(ops, "REQUEST_TIMEOUT_SECONDS", 0.5)
    for health, _ in started(Settings(), state, metrics):
        port = int(health.rsplit(":", 1)[1])
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        try:
            started_at = time.monotonic()
            assert requests.get(f"{health}/healthz", timeout=5).status_code == 200
            assert time.monotonic() - started_at < 1.0
            silent[0].settimeout(5)
            assert silent[0].recv(1) == b""  # closed by the listener, not by us
        finally:
            for connection in silent:
                connection.close()


def test_two_workers_can_listen_on_the_same_ports(
    state: ops.ServiceState, metrics: Metrics
) -> None:
    first, scrape = ops.start(Settings(), "127.0.0.1", 0, 0, state, metrics)
    try:
        second = ops.listen("127.0.0.1", first.port, ops.health_routes(state), None)
        second.stop()
    finally:
        first.stop()
        scrape.stop()


def test_tls_context_follows_the_settings(tmp_path: Path) -> None:
    assert ops.server_tls(Settings()) is None
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.cert_chain_pems[0].write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    context = ops.server_tls(Settings(tls_cert_file=chain, tls_key_file=key))
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_NONE  # no client certificate asked of scrapers
