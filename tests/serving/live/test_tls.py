"""The real server over HTTPS, with certificates made in the test; and its shutdown."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
import requests
import trustme

from hooks.serving.memory import LARGE_BODY_BYTES
from hooks.wire.certificates import not_after
from tests import EXAMPLES
from tests.builders import GPU
from tests.fake_apiserver import KUBEVIRT_PATH, FakeApiServer, kubevirt_cr
from tests.live import live_server

# Starts the real server (gunicorn) in a process of its own.


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("metacontroller.metacontroller.svc")
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "client")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    client.private_key_and_cert_chain_pem.write_to_path(str(paths["client"]))
    return {name: str(path) for name, path in paths.items()}


def test_https_only_with_a_server_certificate(
    pki: dict[str, str], apiserver: FakeApiServer, tmp_path: Path
) -> None:
    env = {
        "GPUCLASS_TLS_CERT_FILE": pki["cert"],
        "GPUCLASS_TLS_KEY_FILE": pki["key"],
        "GPUCLASS_KUBE_API": apiserver.url,
    }
    body = (EXAMPLES / "status-sync.json").read_bytes()
    with live_server(env, tmp_path, scheme="https") as server:
        response = requests.post(
            f"{server.url}/status/sync", data=body, verify=pki["ca"], timeout=10
        )
        assert response.status_code == 200
        assert response.json()["status"]["free"] == 1
        # A large body, read through TLS here and computed in another process; the status fed
        # back so that no second can tick between the answers.
        synced = json.loads(body)
        synced["parent"]["status"] = response.json()["status"]
        large = json.dumps(synced).encode() + b" " * LARGE_BODY_BYTES
        answer = requests.post(
            f"{server.url}/status/sync", data=large, verify=pki["ca"], timeout=30
        )
        assert (answer.status_code, answer.json()) == (200, response.json())
        plain = server.url.replace("https://", "http://")
        with pytest.raises(requests.RequestException):
            requests.post(f"{plain}/status/sync", data=body, timeout=5)


def test_client_certificates_required_with_a_client_ca(
    pki: dict[str, str], apiserver: FakeApiServer, tmp_path: Path
) -> None:
    env = {
        "GPUCLASS_TLS_CERT_FILE": pki["cert"],
        "GPUCLASS_TLS_KEY_FILE": pki["key"],
        "GPUCLASS_TLS_CLIENT_CA_FILE": pki["ca"],
        "GPUCLASS_KUBE_API": apiserver.url,
    }
    body = (EXAMPLES / "status-sync.json").read_bytes()
    cert = (pki["client"], pki["client"])
    with live_server(env, tmp_path, scheme="https") as server:
        ok = requests.post(
            f"{server.url}/status/sync", data=body, verify=pki["ca"], cert=cert, timeout=10
        )
        assert ok.status_code == 200
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.post(f"{server.url}/status/sync", data=body, verify=pki["ca"], timeout=10)
        other_ca = trustme.CA().issue_cert("intruder")
        intruder = tmp_path / "intruder.pem"
        other_ca.private_key_and_cert_chain_pem.write_to_path(str(intruder))
        with pytest.raises(
            (requests.exceptions.SSLError, requests.exceptions.ConnectionError, ssl.SSLError)
        ):
            requests.post(
                f"{server.url}/status/sync",
                data=body,
                verify=pki["ca"],
                cert=(str(intruder), str(intruder)),
                timeout=10,
            )
        # What each TLS port serves, and what Metacontroller presented, seen before it ends; the
        # refused handshakes counted by what they point at.
        scraped = requests.get(f"{server.metrics}/metrics", verify=pki["ca"], timeout=10).text
        ends = not_after(Path(pki["client"]).read_bytes())
        served = not_after(Path(pki["cert"]).read_bytes())
        assert (
            sample(scraped, "cozystack_gpu_hook_client_certificate_expiry_timestamp_seconds")
            == ends
        )
        for listener in ("hooks", "metrics"):
            expiry = (
                f'cozystack_gpu_hook_certificate_expiry_timestamp_seconds{{listener="{listener}"}}'
            )
            assert sample(scraped, expiry) == served
        failed = (
            "cozystack_gpu_hook_tls_handshake_failures_total"
            '{listener="hooks",reason="client_certificate"}'
        )
        assert sample(scraped, failed) == 2


def sample(exposition: str, series: str) -> float:
    [line] = [line for line in exposition.splitlines() if line.startswith(series + " ")]
    return float(line.split()[-1])


def test_sigterm_turns_readiness_false_then_drains_in_flight_calls(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    # A slow KubeVirt read keeps one sync in flight across the SIGTERM.
    apiserver.serve(KUBEVIRT_PATH, 200, kubevirt_cr(GPU), delay=2.0)
    env = {
        "GPUCLASS_KUBE_API": apiserver.url,
        "GPUCLASS_SHUTDOWN_DELAY_SECONDS": "1",
        "GPUCLASS_KUBE_TIMEOUT_SECONDS": "5",
    }
    body = (EXAMPLES / "status-sync.json").read_bytes()
    with live_server(env, tmp_path) as server:
        results: dict[str, int] = {}

        def call() -> None:
            results["sync"] = requests.post(
                f"{server.url}/status/sync", data=body, timeout=20
            ).status_code

        in_flight = threading.Thread(target=call)
        in_flight.start()
        time.sleep(0.5)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert requests.get(f"{server.health}/readyz", timeout=5).status_code == 503
        in_flight.join(timeout=20)
        assert results == {"sync": 200}
        assert server.process.wait(timeout=30) == 0
        assert time.monotonic() - started < 25


@pytest.mark.parametrize("declared", [4000, 2 * LARGE_BODY_BYTES], ids=["small", "large"])
def test_a_stalled_body_over_tls_gets_its_408_over_tls(
    pki: dict[str, str], apiserver: FakeApiServer, tmp_path: Path, declared: int
) -> None:
    """The deadline shuts the plain socket's read side under the TLS layer: the stalled read
    returns, and the 408 still goes out encrypted on the same connection."""
    env = {
        "GPUCLASS_TLS_CERT_FILE": pki["cert"],
        "GPUCLASS_TLS_KEY_FILE": pki["key"],
        "GPUCLASS_KUBE_API": apiserver.url,
        "GPUCLASS_BODY_TIMEOUT_SECONDS": "1",
    }
    with live_server(env, tmp_path, scheme="https") as server:
        port = int(server.url.rsplit(":", 1)[1])
        context = ssl.create_default_context(cafile=pki["ca"])
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as connection,
        ):
            head = (
                "POST /status/sync HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
            )
            connection.sendall(head.encode() + b'{"par')
            connection.settimeout(20)
            received = b""
            while not received.endswith(b"}"):
                chunk = connection.recv(65536)
                if not chunk:
                    break
                received += chunk
        status_line = received.split(b"\r\n", 1)[0]
        assert status_line.split()[1] == b"408"
        assert b"the request body did not arrive within" in received
