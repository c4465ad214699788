"""The serving certificate rotated under load on the real server, as the kubelet rotates a
Secret volume: each generation in a directory of its own, `..data` swapped to it in one rename,
the files links through `..data`. Calls on both TLS ports (hooks and metrics) open a connection
each, so that every one of them is a handshake with whatever the server holds at that moment."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path

import trustme

from tests import EXAMPLES
from tests.live import LiveServer, live_server
from tests.volumes import MountedVolume, tls_files

# Starts the real server (gunicorn) in a process of its own.

SWAPS = 200
# How soon after a swap each port must serve the new certificate.
SERVED_WITHIN_SECONDS = 1.0


def call(port: int, context: ssl.SSLContext, request: bytes) -> tuple[bytes, bytes]:
    """One call on a connection of its own: the certificate served, and the answer's first
    line."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    with raw, context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        served = tls.getpeercert(binary_form=True) or b""
        tls.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            chunk = tls.recv(4096)
            if not chunk:
                break
            answer += chunk
    return served, answer.split(b"\r\n", 1)[0]


def requests_by_port(server: LiveServer) -> dict[int, bytes]:
    body = (EXAMPLES / "status-customize.json").read_bytes()
    hook = (
        f"POST /status/customize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    scrape = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    return {port_of(server.url): hook, port_of(server.metrics): scrape}


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def test_200_certificate_swaps_under_load_fail_no_handshake_and_are_served_at_once(
    tmp_path: Path,
) -> None:
    ca = trustme.CA()
    volume = MountedVolume(tmp_path / "tls", tls_files(ca.issue_cert("127.0.0.1")))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    env = {
        "GPUCLASS_TLS_CERT_FILE": str(volume.path("tls.crt")),
        "GPUCLASS_TLS_KEY_FILE": str(volume.path("tls.key")),
    }
    with live_server(env, tmp_path, scheme="https", args=("--threads", "8")) as server:
        calls = requests_by_port(server)
        failures: list[str] = []
        answered = 0
        stop = threading.Event()

        def load(port: int, request: bytes) -> None:
            nonlocal answered
            while not stop.is_set():
                try:
                    _, status = call(port, context, request)
                except (OSError, ssl.SSLError) as error:
                    failures.append(f"{port}: {error!r}")
                    continue
                if status != b"HTTP/1.1 200 OK":
                    failures.append(f"{port}: {status!r}")
                answered += 1

        threads = [
            threading.Thread(target=load, args=item, daemon=True)
            for item in list(calls.items()) * 2
        ]
        for thread in threads:
            thread.start()
        late = []
        try:
            for number in range(1, SWAPS + 1):
                leaf = ca.issue_cert("127.0.0.1", f"generation-{number}.test")
                expected = ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())
                volume.update(tls_files(leaf))
                swapped = time.monotonic()
                for port, request in calls.items():
                    while call(port, context, request)[0] != expected:
                        if time.monotonic() - swapped > SERVED_WITHIN_SECONDS:
                            late.append((number, port))
                            break
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=10)
    assert failures == []
    assert late == []
    assert answered > SWAPS, answered
