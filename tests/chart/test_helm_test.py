"""The chart's `helm test` Pod: its command, run here against the live service with the files its
volumes would hold (a cluster with a kubelet runs the Pod itself; docs/install.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chart import PLAIN, render
from tests.live import live_server
from tests.pki import write_pki

# Renders the chart (helm) and starts the real server (gunicorn).
pytestmark = pytest.mark.live

TOKEN = "the-hook-token"


def helm_test_pod(*sets: str) -> dict[str, Any]:
    [pod] = [
        d
        for d in render(*sets)
        if d["kind"] == "Pod" and d["metadata"]["annotations"].get("helm.sh/hook") == "test"
    ]
    return pod


def run_pod_command(
    pod: dict[str, Any], url: str, files: dict[str, Path]
) -> subprocess.CompletedProcess[str]:
    """The Pod's arguments, with the Service's URL replaced by the live server's and each mounted
    path by the file the named Secret key would be: the check fails if the Pod names a file its
    volumes do not hold."""
    [container] = pod["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    mounted = {}
    for volume in pod["spec"].get("volumes", []):
        keys = [i["path"] for i in volume["secret"].get("items", [])] or ["tls.crt", "tls.key"]
        for key in keys:
            mounted[f"{mounts[volume['name']]}/{key}"] = files[f"{volume['name']}/{key}"]
    args = list(container["args"])
    assert args[0] == "check" and args[1].endswith((".svc:443", ".svc:80"))
    args[1] = url
    for index, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if value.startswith("/"):
            args[index] = f"{name}={mounted[value]}"
    return subprocess.run(
        [sys.executable, "-m", "hooks.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def secrets(tmp_path: Path) -> dict[str, Path]:
    """The Secret keys the chart's Pod mounts, as files: the token, the CA, a client certificate."""
    pki = write_pki(tmp_path)
    files = {
        "auth/token": tmp_path / "token",
        "tls/ca.crt": pki["ca"],
        "client/tls.crt": pki["client.crt"],
        "client/tls.key": pki["client.key"],
        "server.crt": pki["cert"],
        "server.key": pki["key"],
        "accepted": tmp_path / "accepted-tokens",
    }
    files["auth/token"].write_text(TOKEN)
    files["accepted"].write_text(TOKEN + "\n")
    return files


def serving_env(files: dict[str, Path], *, client_auth: bool = False) -> dict[str, str]:
    env = {
        "GPUCLASS_TLS_CERT_FILE": str(files["server.crt"]),
        "GPUCLASS_TLS_KEY_FILE": str(files["server.key"]),
        "GPUCLASS_AUTH_TOKEN_FILE": str(files["accepted"]),
    }
    if client_auth:
        env["GPUCLASS_TLS_CLIENT_CA_FILE"] = str(files["tls/ca.crt"])
    return env


def test_the_helm_test_pod_passes_against_the_service_as_the_chart_configures_it(
    secrets: dict[str, Path], tmp_path: Path
) -> None:
    pod = helm_test_pod()
    with live_server(serving_env(secrets), tmp_path, scheme="https") as server:
        passed = run_pod_command(pod, server.url, secrets)
        assert passed.returncode == 0, passed.stderr
        assert "refuse calls without the token" in passed.stdout
        secrets["auth/token"].write_text("a-token-the-service-does-not-accept")
        refused = run_pod_command(pod, server.url, secrets)
    assert refused.returncode == 1
    assert "with the token: HTTP 401, expected 200" in refused.stderr
    assert "a-token" not in refused.stdout + refused.stderr


def test_the_helm_test_pod_fails_against_a_service_that_accepts_anyone(
    secrets: dict[str, Path], tmp_path: Path
) -> None:
    env = serving_env(secrets)
    del env["GPUCLASS_AUTH_TOKEN_FILE"]
    with live_server(env, tmp_path, scheme="https") as server:
        result = run_pod_command(helm_test_pod(), server.url, secrets)
    assert result.returncode == 1
    assert "without a token: HTTP 200, expected 401" in result.stderr


def test_the_helm_test_pod_presents_the_client_certificate_under_mtls(
    secrets: dict[str, Path], tmp_path: Path
) -> None:
    pod = helm_test_pod(
        "tls.existingSecret=own-tls",
        "tls.clientAuth.enabled=true",
        "tls.clientAuth.existingSecret=own-client",
        "admission.enabled=false",
    )
    with live_server(serving_env(secrets, client_auth=True), tmp_path, scheme="https") as server:
        result = run_pod_command(pod, server.url, secrets)
    assert result.returncode == 0, result.stderr


def test_the_helm_test_pod_of_a_plain_install_calls_plain_http(tmp_path: Path) -> None:
    pod = helm_test_pod(*PLAIN)
    assert pod["spec"]["containers"][0]["args"][1].startswith("http://")
    with live_server({}, tmp_path) as server:
        result = run_pod_command(pod, server.url, {})
    assert result.returncode == 0, result.stderr


def test_check_reports_a_service_it_cannot_reach_in_one_line() -> None:
    from hooks.cli.check import Target, check
    from tests.live import free_port

    problems = check(Target(f"http://127.0.0.1:{free_port()}"))
    assert len(problems) == 1 and "ConnectionRefusedError" in problems[0]
