"""The dashboard and the alerts against a real Prometheus: the server, started on loopback,
scrapes the live service as the chart's ServiceMonitor says (HTTPS with the chart's CA and
server name, the token), while a licensed and an unlicensed class are synced and a call is
refused; then every dashboard query returns data and every alert expression returns what this
state calls for."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import trustme
import yaml

from tests.builders import (
    GPU,
    OTHER_GPU,
    example_of,
    gpuclass,
    license_sync_request,
    licensed_class,
    namespace,
    node,
    pod,
    source_secret,
    status_sync_request,
)
from tests.chart import one, render
from tests.chart.test_monitoring import dashboard
from tests.fake_apiserver import KUBEVIRT_PATH, FakeApiServer, kubevirt_cr
from tests.live import LiveServer, free_port, live_server

# Renders the chart (helm), runs Prometheus (`make tools`) and the real server (gunicorn).
pytestmark = pytest.mark.live

TOKEN = "scrape-and-hook-token"
NAMESPACE = "cozy-gpu"
# The state the service is driven into: l40s is licensed and Ready, h100 unlicensed and Ready,
# "ghost" names a resource no node advertises, and one call in every round is refused (401).
FIRING = {"GPUClassNotReady", "GPUClassResourceNotAdvertised", "GPUClassHookClientErrors"}
CLASSES = [
    licensed_class("l40s", created="2025-01-01T00:00:00Z"),
    gpuclass("h100", resource=OTHER_GPU, created="2025-01-01T00:00:00Z"),
    gpuclass("ghost", resource="nvidia.com/NOT_ADVERTISED", created="2025-01-01T00:00:00Z"),
]


@pytest.fixture(scope="module")
def chart() -> list[dict[str, Any]]:
    return render(
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "metrics.requireAuth=true",
        namespace=NAMESPACE,
    )


def scrape_config(
    chart: list[dict[str, Any]], target: str, files: dict[str, Path]
) -> dict[str, Any]:
    """The chart's ServiceMonitor as a Prometheus scrape job: its scheme, path, interval (made
    short here), CA, server name and token; the job named after the Service, as the operator
    names it, and the namespace label it adds."""
    monitor = one(chart, "ServiceMonitor")
    [endpoint] = monitor["spec"]["endpoints"]
    job: dict[str, Any] = {
        "job_name": one(chart, "Service")["metadata"]["name"],
        "scheme": endpoint["scheme"],
        "metrics_path": endpoint["path"],
        "scrape_interval": "1s",
        "static_configs": [{"targets": [target], "labels": {"namespace": NAMESPACE}}],
    }
    tls = endpoint["tlsConfig"]
    assert tls["ca"]["secret"]["key"] == "ca.crt"
    job["tls_config"] = {"ca_file": str(files["ca.crt"]), "server_name": tls["serverName"]}
    credentials = endpoint["authorization"]["credentials"]
    assert credentials["key"] == "token"
    job["authorization"] = {"type": "Bearer", "credentials_file": str(files["token"])}
    return job


@pytest.fixture(scope="module")
def service(
    chart: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, dict[str, Path]]]:
    from tests.fake_apiserver import fake_apiserver

    directory = tmp_path_factory.mktemp("prometheus-service")
    ca = trustme.CA()
    monitor = one(chart, "ServiceMonitor")
    server_name = monitor["spec"]["endpoints"][0]["tlsConfig"]["serverName"]
    issued = ca.issue_cert("127.0.0.1", server_name)
    files = {name: directory / name for name in ("ca.crt", "tls.crt", "tls.key", "token")}
    ca.cert_pem.write_to_path(str(files["ca.crt"]))
    issued.cert_chain_pems[0].write_to_path(str(files["tls.crt"]))
    issued.private_key_pem.write_to_path(str(files["tls.key"]))
    files["token"].write_text(TOKEN)
    with fake_apiserver() as api:
        api_server: FakeApiServer = api
        api_server.serve(KUBEVIRT_PATH, 200, kubevirt_cr(GPU, OTHER_GPU))
        env = {
            "GPUCLASS_TLS_CERT_FILE": str(files["tls.crt"]),
            "GPUCLASS_TLS_KEY_FILE": str(files["tls.key"]),
            "GPUCLASS_AUTH_TOKEN_FILE": str(files["token"]),
            "GPUCLASS_METRICS_REQUIRE_AUTH": "true",
            "GPUCLASS_KUBE_API": api_server.url,
            "GPUCLASS_KUBEVIRT_CACHE_SECONDS": "0",
        }
        with live_server(env, directory, scheme="https") as server:
            yield server, files


def drive(server: LiveServer, files: dict[str, Path]) -> None:
    """One round of what Metacontroller sends: a status sync of every class, a license sync of
    the licensed one; and a call without the token."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {TOKEN}"
    ca = str(files["ca.crt"])  # per call: a session's verify loses to REQUESTS_CA_BUNDLE
    for parent in CLASSES:
        request = status_sync_request(
            parent,
            nodes=[
                node("gpu-1"),
                node("gpu-2", unschedulable=True),
                node("gpu-3", resource=OTHER_GPU, gpus=2),
            ],
            pods=[pod("vm-1")],
            classes=CLASSES,
            secrets=[source_secret()],
            namespaces=[namespace("tenant-a")],
        )
        assert session.post(f"{server.url}/status/sync", json=request, verify=ca, timeout=10).ok
    licensed = license_sync_request(
        CLASSES[0], secrets=[source_secret()], namespaces=[namespace("tenant-a")]
    )
    assert session.post(f"{server.url}/license/sync", json=licensed, verify=ca, timeout=10).ok
    report = example_of("/budget-pools/sync")
    assert session.post(f"{server.url}/budget-pools/sync", data=report, verify=ca, timeout=10).ok
    refused = requests.post(
        f"{server.url}/status/customize", json={}, verify=str(files["ca.crt"]), timeout=10
    )
    assert refused.status_code == 401


@pytest.fixture(scope="module")
def prometheus(
    chart: list[dict[str, Any]],
    service: tuple[LiveServer, dict[str, Path]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: `make tools` installs it (make test does this)")
    server, files = service
    directory = tmp_path_factory.mktemp("prometheus")
    groups = one(chart, "PrometheusRule")["spec"]["groups"]
    (directory / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    target = server.metrics.removeprefix("https://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(directory / "rules.yaml")],
        "scrape_configs": [scrape_config(chart, target, files)],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (directory / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert process.poll() is None, (directory / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "Prometheus did not become ready"
            time.sleep(0.2)
        # Calls spread over several scrapes, so that every rate has increases to see.
        for _ in range(8):
            drive(server, files)
            time.sleep(1)
        up = query(url, 'up{job="gpu-gpuclass-hooks"}')
        assert [s["value"][1] for s in up] == ["1"], (directory / "prometheus.log").read_text()
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def query(url: str, expr: str) -> list[dict[str, Any]]:
    answer = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    if answer["data"]["resultType"] == "scalar":
        return [{"metric": {}, "value": result}]
    return result


def substituted(expr: str) -> str:
    """A dashboard query as Grafana sends it with every class selected."""
    return expr.replace("$class", "l40s|h100|ghost")


def panel_queries() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def test_every_dashboard_query_returns_finite_values(prometheus: str) -> None:
    assert len(panel_queries()) > 15
    for title, expr in panel_queries():
        series = query(prometheus, substituted(expr))
        assert series, f"panel {title!r} shows nothing: {expr}"
        values = [float(s["value"][1]) for s in series]
        assert all(math.isfinite(v) for v in values), (title, values)
        print(f"panel {title}: {len(series)} series, {sorted(round(v, 4) for v in values)}")


def test_the_class_variable_lists_every_class(prometheus: str) -> None:
    [variable] = [v for v in dashboard()["templating"]["list"] if v["name"] == "class"]
    metric = re.fullmatch(r"label_values\((\w+), *class\)", variable["definition"])
    assert metric
    found = {s["metric"]["class"] for s in query(prometheus, metric.group(1))}
    assert found == {"l40s", "h100", "ghost"}


def test_every_alert_expression_returns_what_the_state_calls_for(
    prometheus: str, chart: list[dict[str, Any]]
) -> None:
    rules = [r for g in one(chart, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= FIRING
    results = {rule["alert"]: query(prometheus, rule["expr"]) for rule in rules}
    for name, series in results.items():
        print(f"alert {name}: {[s['metric'] for s in series]}")
    assert {name for name, series in results.items() if series} == FIRING
    assert {s["metric"]["class"] for s in results["GPUClassResourceNotAdvertised"]} == {"ghost"}
    assert {s["metric"]["class"] for s in results["GPUClassNotReady"]} == {"ghost"}
    assert {s["metric"]["route"] for s in results["GPUClassHookClientErrors"]} == {
        "/status/customize"
    }
    # and Prometheus itself evaluates them: pending, since each has a `for:`
    alerts = requests.get(f"{prometheus}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    assert {a["labels"]["alertname"] for a in alerts} <= FIRING
