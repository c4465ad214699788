"""The admission port of the real server: reviews served apart from the hooks, on threads and
memory of their own, their bodies read by the event loop before a thread is spent."""

from __future__ import annotations

import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import trustme

from hooks.kubeapi.budget import HELMRELEASES
from hooks.serving import edge
from tests import EXAMPLES
from tests.fake_apiserver import FakeApiServer, list_of
from tests.live import LiveServer, live_server

# Starts the real server (gunicorn) in a process of its own.

TOKEN = "s3cr3t-t0ken"
REVIEW = (EXAMPLES / "admit-gpu-budget.json").read_bytes()


def serving_files(tmp_path: Path, *, client_ca: bool = False) -> tuple[dict[str, str], str]:
    """The settings of a server with TLS, the token and a small admission share; with
    `client_ca`, the hook port asks for a client certificate of the same CA."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    paths = {name: tmp_path / name for name in ("ca.crt", "tls.crt", "tls.key", "token")}
    ca.cert_pem.write_to_path(str(paths["ca.crt"]))
    leaf.cert_chain_pems[0].write_to_path(str(paths["tls.crt"]))
    leaf.private_key_pem.write_to_path(str(paths["tls.key"]))
    paths["token"].write_text(TOKEN)
    env = {
        "GPUCLASS_TLS_CERT_FILE": str(paths["tls.crt"]),
        "GPUCLASS_TLS_KEY_FILE": str(paths["tls.key"]),
        "GPUCLASS_AUTH_TOKEN_FILE": str(paths["token"]),
        "GPUCLASS_ADMISSION_MEMORY_BYTES": str(4 * 1024 * 1024),
    }
    if client_ca:
        env["GPUCLASS_TLS_CLIENT_CA_FILE"] = str(paths["ca.crt"])
    return env, str(paths["ca.crt"])


@pytest.fixture
def served(tmp_path: Path, apiserver: FakeApiServer) -> Iterator[tuple[LiveServer, str]]:
    env, ca = serving_files(tmp_path)
    with live_server(
        {**env, "GPUCLASS_KUBE_API": apiserver.url}, tmp_path, scheme="https"
    ) as server:
        yield server, ca


def test_reviews_are_answered_on_the_admission_port_and_kept_alive(
    served: tuple[LiveServer, str],
) -> None:
    server, ca = served
    with requests.Session() as session:
        for _ in range(3):
            response = session.post(
                f"{server.admission}/admit/gpu-budget", data=REVIEW, verify=ca, timeout=10
            )
            assert response.status_code == 200
            assert response.json()["response"]["uid"]
    scraped = requests.get(f"{server.metrics}/metrics", verify=ca, timeout=10).text
    assert 'cozystack_gpu_hook_requests_total{code="200",route="/admit/gpu-budget"} 3.0' in scraped


def test_the_hook_port_refuses_reviews_and_the_admission_port_refuses_hooks(
    served: tuple[LiveServer, str],
) -> None:
    server, ca = served
    on_hooks = requests.post(f"{server.url}/admit/gpu-budget", data=REVIEW, verify=ca, timeout=10)
    assert on_hooks.status_code == 404
    assert "admission port" in on_hooks.json()["error"]
    on_admission = requests.post(
        f"{server.admission}/status/sync",
        data=b"{}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        verify=ca,
        timeout=10,
    )
    assert on_admission.status_code == 404
    assert "hook port" in on_admission.json()["error"]


def tls_connection(port: int, ca: str) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=ca)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return context.wrap_socket(sock, server_hostname="127.0.0.1")


def test_a_declared_length_holds_no_memory_until_its_bytes_arrive(
    served: tuple[LiveServer, str],
) -> None:
    """Heads declaring the admission limit, with no body: more of them than the port's share
    could hold if it reserved what they declare; a review sent beside them is answered."""
    server, ca = served
    port = int(server.admission.rsplit(":", 1)[1])
    head = (
        "POST /admit/gpu-budget HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {7 * 1024 * 1024}\r\n\r\n"
    ).encode()
    stalled = []
    try:
        for _ in range(8):  # 56 MiB declared against a 4 MiB share
            connection = tls_connection(port, ca)
            connection.sendall(head)
            stalled.append(connection)
        time.sleep(0.5)
        response = requests.post(
            f"{server.admission}/admit/gpu-budget", data=REVIEW, verify=ca, timeout=10
        )
        assert response.status_code == 200
        scraped = requests.get(f"{server.metrics}/metrics", verify=ca, timeout=10).text
        held = [
            line
            for line in scraped.splitlines()
            if line.startswith("cozystack_gpu_hook_admission_memory_held_bytes ")
        ]
        assert float(held[0].split()[1]) <= 8 * (edge.SOCKET_BYTES + edge.TLS_BYTES)
        assert (
            'cozystack_gpu_hook_connections{listener="admission",state="reading_body"} 8.0'
            in scraped
        )
    finally:
        for connection in stalled:
            connection.close()


def test_a_draining_pod_closes_each_review_connection_after_its_answer(
    served: tuple[LiveServer, str],
) -> None:
    """The API server keeps its connection to the Service open and would send its next review to
    this pod, stopping, on it: from SIGTERM on, every review is answered, then its connection
    closed, so that the next one reaches a pod that is ready."""
    server, ca = served
    with requests.Session() as session:
        before = session.post(
            f"{server.admission}/admit/gpu-budget", data=REVIEW, verify=ca, timeout=10
        )
        assert before.status_code == 200 and before.headers.get("Connection") != "close"
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while requests.get(f"{server.health}/readyz", timeout=2).status_code == 200:
            assert time.monotonic() < deadline, "readiness never turned 503 after SIGTERM"
            time.sleep(0.05)
        during = session.post(
            f"{server.admission}/admit/gpu-budget", data=REVIEW, verify=ca, timeout=10
        )
        assert during.status_code == 200 and during.headers.get("Connection") == "close"


def test_with_client_certificates_required_on_the_hook_port_reviews_need_none(
    tmp_path: Path, apiserver: FakeApiServer
) -> None:
    """The API server presents no client certificate: the admission port never asks for one,
    whatever the hook port requires."""
    env, ca = serving_files(tmp_path, client_ca=True)
    env["GPUCLASS_KUBE_API"] = apiserver.url
    with live_server(env, tmp_path, scheme="https") as server:
        review = requests.post(
            f"{server.admission}/admit/gpu-budget", data=REVIEW, verify=ca, timeout=10
        )
        assert review.status_code == 200
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.post(
                f"{server.url}/status/customize",
                data=b"{}",
                headers={"Authorization": f"Bearer {TOKEN}"},
                verify=ca,
                timeout=10,
            )


def test_a_review_on_a_connection_kept_alive_long_before_it_has_its_whole_deadline(
    tmp_path: Path, apiserver: FakeApiServer
) -> None:
    """The API server keeps its connections to a webhook open between reviews: a review's
    deadline (and its wait for a thread) counts from its own head, not from the connection's
    accept. With a 2 s webhook timeout, a review sent 2.5 s after the connection opened is
    judged, not refused as if it had waited past its time."""
    apiserver.serve(HELMRELEASES, 200, list_of([]))  # no budget anywhere: allowed, once read
    env, ca = serving_files(tmp_path)
    env = {**env, "GPUCLASS_KUBE_API": apiserver.url, "GPUCLASS_ADMISSION_TIMEOUT_SECONDS": "2"}
    with live_server(env, tmp_path, scheme="https") as server, requests.Session() as session:
        url = f"{server.admission}/admit/gpu-budget"
        first = session.post(url, data=REVIEW, verify=ca, timeout=10)
        assert first.status_code == 200 and first.json()["response"]["allowed"] is True
        time.sleep(2.5)  # the connection idles, kept alive
        second = session.post(url, data=REVIEW, verify=ca, timeout=10)
        assert second.status_code == 200, second.text
        # read and judged within its own time: not failed closed for want of it
        assert second.json()["response"]["allowed"] is True, second.json()
        scraped = requests.get(f"{server.metrics}/metrics", verify=ca, timeout=10).text
        assert "cozystack_gpu_hook_calls_refused_busy_total 0.0" in scraped
