"""The dashboard and the alert rules: every PromQL expression parses, uses only metrics the
service really exports, and the chart ships both unchanged."""

from __future__ import annotations

import json
import re
from typing import Any

import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hooks.serving.app import create_app
from hooks.serving.credentials import CredentialWatch, Watched
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from tests.builders import (
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
from tests.chart import CERT_MANAGER, CHART, PLAIN, by_kind, env_of, one, render

# Renders the chart with helm (`make tools`).

ROOT = CHART.parent
DASHBOARD = CHART / "dashboards" / "gpu-classes.json"
MONITORING = (
    "monitoring.dashboard.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.vmRule.enabled=true",
)
METRIC = re.compile(r"\bcozystack_[a-z_]+\b")


@pytest.fixture(scope="module")
def exported_names(exported: dict[str, set[str]]) -> set[str]:
    return set(exported)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Sample names of a real /metrics scrape after syncing sample classes through the hooks,
    each with the labels its samples carry."""
    from tests.fake_apiserver import fake_apiserver

    with fake_apiserver() as api:
        metrics = Metrics(180.0)
        client = create_app(
            Settings(kube_api=api.url, kube_token_file=tmp_path_factory.mktemp("t") / "none"),
            metrics=metrics,
        ).test_client()
        classes = [
            licensed_class("l40s", created="2025-01-01T00:00:00Z"),
            gpuclass("h100", resource=OTHER_GPU),
            gpuclass("young", created="2026-06-01T00:00:00Z"),
        ]
        for parent in classes:
            request = status_sync_request(
                parent,
                nodes=[node("g1"), node("g2", unschedulable=True)],
                pods=[pod("p")],
                classes=classes,
                secrets=[source_secret()],
                namespaces=[namespace("a")],
            )
            assert client.post("/status/sync", json=request).status_code == 200
        report = client.post("/budget-pools/sync", data=example_of("/budget-pools/sync"))
        assert report.status_code == 200
        index = client.post("/budget-report/sync", data=example_of("/budget-report/sync"))
        assert index.status_code == 200
        client.post(
            "/license/sync",
            json=license_sync_request(
                classes[0], secrets=[source_secret()], namespaces=[namespace("a")]
            ),
        )
        client.post("/status/sync", data=b"not json")
        metrics.watch_tls("hooks", lambda: 2e9)  # what a TLS listener registers
        metrics.watch_client_certificates(lambda: 2e9)  # what a TLS listener registers
        metrics.watch_credentials(CredentialWatch([Watched("token", "/tokens", lambda: None)]))
        text = metrics.exposition()[0].decode()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_expressions() -> list[str]:
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard()["templating"]["list"] if "definition" in v]
    return exprs


def rule_groups(kind: str) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = one(render(*MONITORING), kind)["spec"]["groups"]
    return groups


def rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups("PrometheusRule") for rule in group["rules"]]


def promql(expr: str) -> str:
    """Grafana variables expanded; label_values() is Grafana's own, not PromQL."""
    expr = expr.replace("$class", ".*")
    match = re.fullmatch(r"label_values\((.+), *\w+\)", expr)
    return match.group(1) if match else expr


def test_every_promql_expression_parses() -> None:
    expressions = dashboard_expressions() + [r["expr"] for r in rules()]
    assert len(expressions) > 20
    for expr in expressions:
        promql_parser.parse(promql(expr))


def test_a_broken_expression_would_be_caught() -> None:
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (class (cozystack_gpu_class_free_units)")


def test_every_metric_used_is_exported(exported_names: set[str]) -> None:
    used = {
        name
        for expr in dashboard_expressions() + [r["expr"] for r in rules()]
        for name in METRIC.findall(expr)
    }
    assert used
    assert used <= exported_names, used - exported_names


# Labels Prometheus adds to every scraped series (and `le`, a histogram bucket's bound).
SCRAPE_LABELS = {"instance", "job", "namespace", "pod", "service", "container", "endpoint"}


def unexported_labels(expr: str, exported: dict[str, set[str]]) -> set[str]:
    """Labels the expression uses that the service's series do not carry: every label matched on
    a metric must be one its samples carry, and every label grouped or joined on one that a
    metric of the expression carries (or the scrape adds)."""
    expr = promql(expr)
    missing = set()
    for metric, matchers in re.findall(r"\b(cozystack_[a-z_]+)\{([^}]*)\}", expr):
        names = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
        missing |= names - exported[metric] - SCRAPE_LABELS
    carried = set().union(*(exported[m] for m in METRIC.findall(expr))) | SCRAPE_LABELS
    for group in re.findall(r"\b(?:by|on|without|ignoring) *\(([^)]*)\)", expr):
        missing |= {name.strip() for name in group.split(",") if name.strip()} - carried
    return missing


def test_every_label_the_dashboard_and_alerts_use_is_exported(
    exported: dict[str, set[str]],
) -> None:
    """A renamed label would leave a panel or an alert silently empty."""
    for expr in dashboard_expressions() + [r["expr"] for r in rules()]:
        assert unexported_labels(expr, exported) == set(), expr


def test_a_renamed_label_would_be_caught(exported: dict[str, set[str]]) -> None:
    renamed = 'max by (class, cause) (cozystack_gpu_class_condition{type="Ready"})'
    assert unexported_labels(renamed, exported) == {"cause"}
    matched = 'cozystack_gpu_hook_requests_total{status=~"5.."}'
    assert unexported_labels(matched, exported) == {"status"}


def test_dashboard_follows_cozystack_conventions() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource"
        and variables["datasource"]["query"] == "prometheus"
    )
    types = {p["type"] for p in board["panels"]}
    assert {"row", "stat", "timeseries", "table"} <= types
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
    titles = {p["title"] for p in board["panels"]}
    assert {
        "Free units per class",
        "Capacity (allocatable)",
        "Used (effective requests)",
        "Max free units on one node",
        "Classes",
        "License copies per class",
        "Hook latency p95 by route",
        "Hook error rate by route",
    } <= titles


CLASS_GAUGES = (
    "capacity_units",
    "used_units",
    "free_units",
    "max_free_per_node_units",
    "condition",
    "license_copies",
)


def test_class_panels_take_the_freshest_replica() -> None:
    checked = 0
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            if any(f"cozystack_gpu_class_{gauge}" in target["expr"] for gauge in CLASS_GAUGES):
                assert "group_left max by (class)" in target["expr"], panel["title"]
                checked += 1
    assert checked >= 9


def test_alert_rules_have_summary_description_and_severity() -> None:
    names = {r["alert"] for r in rules()}
    assert names == {
        "GPUClassHookConnectionsDropped",
        "GPUClassHookListenOverflows",
        "GPUClassHookCertificateExpiresSoon",
        "GPUClassHookClientCertificateExpiresSoon",
        "GPUClassHookTLSHandshakeFailures",
        "GPUClassNotReady",
        "GPUClassLicenseSecretMissing",
        "GPUClassLicenseCopyConflict",
        "GPUClassNoFreeUnits",
        "GPUClassResourceNotAdvertised",
        "GPUClassStatusNotSynced",
        "GPUClassHookServerErrors",
        "GPUClassHookClientErrors",
        "GPUClassHooksDown",
        "GPUClassBudgetReviewsFailingClosed",
        "GPUBudgetPoolOverBudget",
        "GPUInstanceTypeNotInWebhook",
        "GPUClassHookMemoryBudgetRefusals",
        "GPUClassHooksQueueing",
        "GPUClassHookCredentialInvalid",
        "GPUClassHookStalledBodies",
    }
    for rule in rules():
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 60
    by_name = {r["alert"]: r for r in rules()}
    assert by_name["GPUClassNotReady"]["for"] == "15m"
    assert "reason" in by_name["GPUClassNotReady"]["expr"].split("(")[1]  # the reason is a label
    assert by_name["GPUClassLicenseSecretMissing"]["for"] == "10m"
    assert by_name["GPUClassNoFreeUnits"]["for"] == "1h"
    assert "{{ $labels.class }}" in by_name["GPUClassNotReady"]["annotations"]["summary"]


def test_every_alert_links_its_runbook_section() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {h.lower() for h in re.findall(r"^## (\w+)$", runbooks, re.M)}
    for rule in rules():
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "https://github.com/cozystack/gpuclass-hooks/blob/main/docs/runbooks.md"
        assert anchor == rule["alert"].lower() and anchor in anchors, rule["alert"]


def test_alert_rules_render_the_same_for_both_kinds() -> None:
    assert rule_groups("PrometheusRule") == rule_groups("VMRule")
    assert (
        one(render(*MONITORING), "VMRule")["apiVersion"] == "operator.victoriametrics.com/v1beta1"
    )


MONITORED_KINDS = (
    "PrometheusRule",
    "ServiceMonitor",
    "VMRule",
    "VMServiceScrape",
    "GrafanaDashboard",
)


def kinds_rendered(documents: list[dict[str, Any]]) -> set[str]:
    return {kind for kind in MONITORED_KINDS if by_kind(documents, kind)}


def test_monitoring_objects_follow_the_apis_the_cluster_serves_unless_told() -> None:
    """Cozystack's VMAgent selects every VMServiceScrape and its Grafana loads GrafanaDashboards:
    on a cluster serving those APIs the chart is monitored without a word, and on one without them
    it still installs. The sidecar ConfigMap stays opt-in."""
    assert kinds_rendered(render()) == set()
    assert by_kind(render(), "ConfigMap") == []
    victoria = [f"operator.victoriametrics.com/v1beta1/{k}" for k in ("VMRule", "VMServiceScrape")]
    grafana = ["grafana.integreatly.org/v1beta1/GrafanaDashboard"]
    cozystack = render(api_versions=(CERT_MANAGER, *victoria, *grafana))
    assert kinds_rendered(cozystack) == {"VMRule", "VMServiceScrape", "GrafanaDashboard"}
    prometheus = [f"monitoring.coreos.com/v1/{k}" for k in ("PrometheusRule", "ServiceMonitor")]
    assert kinds_rendered(render(api_versions=(CERT_MANAGER, *prometheus))) == {
        "PrometheusRule", "ServiceMonitor"
    }  # fmt: skip
    told = render(
        "monitoring.vmServiceScrape.enabled=false", api_versions=(CERT_MANAGER, *victoria)
    )
    assert kinds_rendered(told) == {"VMRule"}
    only_vm = render("monitoring.vmRule.enabled=true")
    assert kinds_rendered(only_vm) == {"VMRule"}


def test_grafana_operator_gets_the_same_dashboard_for_the_selected_instances() -> None:
    """Cozystack runs Grafana with grafana-operator, which loads GrafanaDashboard objects."""
    [grafana] = by_kind(render("monitoring.grafanaDashboard.enabled=true"), "GrafanaDashboard")
    assert grafana["apiVersion"] == "grafana.integreatly.org/v1beta1"
    assert json.loads(grafana["spec"]["json"]) == dashboard()
    assert grafana["spec"]["instanceSelector"] == {"matchLabels": {"dashboards": "grafana"}}
    assert grafana["spec"]["allowCrossNamespaceImport"] is True and "folder" not in grafana["spec"]
    chosen = render(
        "monitoring.grafanaDashboard.enabled=true",
        "monitoring.grafanaDashboard.folder=GPU",
        "monitoring.grafanaDashboard.instanceSelector.matchLabels.dashboards=mine",
    )
    [grafana] = by_kind(chosen, "GrafanaDashboard")
    assert grafana["spec"]["folder"] == "GPU"
    assert grafana["spec"]["instanceSelector"] == {"matchLabels": {"dashboards": "mine"}}


def test_dashboard_configmap_holds_the_file_unchanged_with_the_sidecar_label() -> None:
    configmap = one(render(*MONITORING), "ConfigMap")
    assert configmap["data"]["gpu-classes.json"] == DASHBOARD.read_text()
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    custom = one(
        render(
            "monitoring.dashboard.enabled=true",
            "monitoring.dashboard.label=dashboards",
            "monitoring.dashboard.labelValue=gpu",
            "monitoring.dashboard.namespace=monitoring",
        ),
        "ConfigMap",
    )
    assert custom["metadata"]["labels"]["dashboards"] == "gpu"
    assert custom["metadata"]["namespace"] == "monitoring"


# --- scraping ------------------------------------------------------------------------------------


def scrape_endpoint(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    scrape = one(documents, kind)
    service = one(documents, "Service")
    assert (
        scrape["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert scrape["spec"]["namespaceSelector"] == {"matchNames": ["cozy-gpu"]}
    [endpoint] = scrape["spec"]["endpoints"]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports[endpoint["port"]]["targetPort"] == "metrics"  # the metrics port, not the hooks'
    return dict(endpoint)


SCRAPES = ("monitoring.serviceMonitor.enabled=true", "monitoring.vmServiceScrape.enabled=true")


def test_scrape_objects_are_off_by_default() -> None:
    documents = render()
    assert (
        by_kind(documents, "ServiceMonitor") == [] and by_kind(documents, "VMServiceScrape") == []
    )


def test_scrape_objects_follow_the_charts_tls_and_token() -> None:
    secure = render(*SCRAPES)
    token = {"name": "gpu-gpuclass-hooks-hook-token", "key": "token"}
    monitor = scrape_endpoint(secure, "ServiceMonitor")
    assert monitor["scheme"] == "https" and monitor["path"] == "/metrics"
    assert monitor["tlsConfig"] == {
        "serverName": "gpu-gpuclass-hooks.cozy-gpu.svc",
        "ca": {"secret": {"name": "gpu-gpuclass-hooks-tls", "key": "ca.crt"}},
    }
    # metrics.requireAuth is on by default: the scrape carries the token the hooks then require
    assert monitor["authorization"] == {"type": "Bearer", "credentials": token}
    assert env_of(secure)["GPUCLASS_METRICS_REQUIRE_AUTH"] == "true"
    vm = scrape_endpoint(secure, "VMServiceScrape")
    assert vm["tlsConfig"] == monitor["tlsConfig"] and vm["bearerTokenSecret"] == token

    open_metrics = render(
        *SCRAPES, "metrics.requireAuth=false", "tls.existingSecret=own", "admission.enabled=false"
    )
    monitor = scrape_endpoint(open_metrics, "ServiceMonitor")
    assert "authorization" not in monitor
    assert monitor["tlsConfig"]["ca"]["secret"]["name"] == "own"
    assert "bearerTokenSecret" not in scrape_endpoint(open_metrics, "VMServiceScrape")
    assert env_of(open_metrics)["GPUCLASS_METRICS_REQUIRE_AUTH"] == "false"

    plain = render(*SCRAPES, *PLAIN, api_versions=())
    for kind in ("ServiceMonitor", "VMServiceScrape"):
        endpoint = scrape_endpoint(plain, kind)
        assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint
        # no token to require without auth
        assert "authorization" not in endpoint and "bearerTokenSecret" not in endpoint
    assert env_of(plain)["GPUCLASS_METRICS_REQUIRE_AUTH"] == "false"
