"""Render the chart with helm, for the chart tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import ROOT

CHART = ROOT / "metacontroller"
# The chart's minimum Kubernetes (CEL, matchConditions).
KUBE_VERSION = "1.30.0"
# What a cluster serves beyond Kubernetes itself decides what the chart renders: by default the
# renders assume cert-manager, which the secure defaults use for TLS.
CERT_MANAGER = "cert-manager.io/v1"
# What the render's lookup of the EndpointSlice default/kubernetes finds on a cluster, which helm
# template cannot read: the NetworkPolicy needs the API servers' addresses (a documentation range,
# never dialled).
API_SERVERS = ("192.0.2.10/32",)
API_SERVERS_SET = f"networkPolicy.apiServerCIDRs={{{','.join(API_SERVERS)}}}"
# helm's flags for a render as on such a cluster.
ON_A_CLUSTER = ("--api-versions", CERT_MANAGER, "--set", API_SERVERS_SET)


def helm() -> str:
    path = shutil.which("helm")
    if path is None:
        pytest.fail("helm is not installed: `make tools` builds it (make test does this)")
    return path


# A plain-HTTP install: everything that needs TLS off (the API server calls webhooks over HTTPS).
PLAIN = ("tls.enabled=false", "auth.enabled=false", "admission.enabled=false")


def helm_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120)


def template(
    *sets: str,
    namespace: str = "cozy-gpu",
    api_versions: tuple[str, ...] = (CERT_MANAGER,),
    api_servers: tuple[str, ...] = API_SERVERS,
    chart: Path = CHART,
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart (this tree's unless another is named) with these --set
    values, on a cluster serving these APIs whose API servers have these addresses."""
    args = ["template", "gpu", str(chart), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for api in api_versions:
        args += ["--api-versions", api]
    if api_servers:
        args += ["--set", f"networkPolicy.apiServerCIDRs={{{','.join(api_servers)}}}"]
    for value in sets:
        args += ["--set", value]
    return helm_run(*args)


def render(
    *sets: str,
    namespace: str = "cozy-gpu",
    api_versions: tuple[str, ...] = (CERT_MANAGER,),
    api_servers: tuple[str, ...] = API_SERVERS,
    chart: Path = CHART,
) -> list[dict[str, Any]]:
    result = template(
        *sets, namespace=namespace, api_versions=api_versions, api_servers=api_servers, chart=chart
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == kind]


def one(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = by_kind(documents, kind)
    return found


def named(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of this kind and name."""
    [found] = [d for d in by_kind(documents, kind) if d["metadata"]["name"] == name]
    return found


def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(
        (CHART / "files" / "gpuclasses.cozystack.io.yaml").read_text()
    )
    return loaded


def container_of(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """The hook container of the rendered Deployment."""
    container: dict[str, Any] = one(documents, "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


def env_of(documents: list[dict[str, Any]]) -> dict[str, str]:
    """The hook container's environment variables that have a literal value."""
    return {e["name"]: e["value"] for e in container_of(documents)["env"] if "value" in e}
