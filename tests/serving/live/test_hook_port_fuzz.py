"""No byte a caller sends stops the hook port or kills its worker: the inputs of
`tests/serving/test_head_fuzz.py` sent with no token to the real server's hook port (gunicorn's
arbiter, `hooks.serving.worker`), the token on. After every input the worker is the one that
booted and a call with the token is answered; the log holds no error of the service's own.
`make fuzz` runs GPUCLASS_FUZZ_HEADS inputs (100,000); the live tier a few hundred."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, example, given, settings

from tests import EXAMPLES
from tests.live import LiveServer, live_server
from tests.serving.test_head_fuzz import FUZZ_LIMIT, HEADS, exchange, requests_

pytestmark = FUZZ_LIMIT
TOKEN = "fuzz-token"
CUSTOMIZE = (EXAMPLES / "status-customize.json").read_bytes()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, list[int]]]:
    tmp_path = tmp_path_factory.mktemp("fuzz")
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    env = {
        "GPUCLASS_AUTH_TOKEN_FILE": str(tokens),
        "GPUCLASS_KUBE_API": "http://127.0.0.1:9",
        "GPUCLASS_KUBE_TIMEOUT_SECONDS": "0.2",
    }
    with live_server(env, tmp_path, args=("--threads", "4")) as running:
        yield running, workers(running)
    log = running.logs()
    assert "Traceback" not in log and "unexpected error" not in log


def workers(server: LiveServer) -> list[int]:
    """The arbiter's children: its workers (a worker's fork server is the worker's child)."""
    pid = server.process.pid
    return sorted(map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split()))


@settings(
    max_examples=HEADS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=requests_())
@example(data=b"POST /status/sync HTTP/1.1\r\nContent-Length: " + b"1" * 4301 + b"\r\n\r\n")
@example(data=b"POST /status/sync HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n")
@example(data=b"POST http://[/status/sync HTTP/1.1\r\n\r\n")
def test_no_input_stops_the_hook_port_or_its_worker(
    server: tuple[LiveServer, list[int]], data: bytes
) -> None:
    running, booted = server
    port = int(running.url.rsplit(":", 1)[1])
    answer = exchange(port, data)
    assert answer == b"" or answer.startswith((b"HTTP/1.1 ", b"HTTP/1.0 "))
    assert workers(running) == booted  # none died and was replaced
    call = requests.post(
        f"{running.url}/status/customize",
        data=CUSTOMIZE,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert call.status_code == 200
