"""Metrics after syncing sample classes, through the routes."""

from __future__ import annotations

import re
import selectors
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from hooks.rules.budget.usage import PoolUse
from hooks.serving.app import create_app, stale_after_seconds
from hooks.serving.credentials import CredentialWatch, Watched
from hooks.serving.edge import Allowance, Edge
from hooks.serving.listeners import metrics_routes
from hooks.serving.metrics import Metrics, listen_overflows
from hooks.settings import Settings
from tests import ROOT
from tests.builders import (
    conditions_in_order,
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
from tests.fake_apiserver import KUBEVIRT_PATH, FakeApiServer

STALE_AFTER_SECONDS = 180.0  # three status resyncs of 60 s


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics(clock: Clock) -> Metrics:
    return Metrics(STALE_AFTER_SECONDS, clock)


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What the metrics port answers a scrape."""
    reply = metrics_routes(metrics, None)["/metrics"]({})
    assert reply.code == 200
    assert reply.content_type.startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def series(samples: dict[Any, float], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (metric, labels), value in samples.items() if metric == name}


def cluster_request(
    parent: dict[str, Any], classes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return status_sync_request(
        parent,
        nodes=[
            node("gpu-1", gpus=4),
            node("gpu-2", gpus=2, unschedulable=True),
            node("cpu", gpus=None),
        ],
        pods=[pod("a", node_name="gpu-1", gpus=1), pod("b", node_name="gpu-2", gpus=2)],
        classes=classes,
    )


def quiet_edge() -> Edge:
    """An edge with no connection."""
    return Edge(
        selectors.DefaultSelector(),
        lambda connection, head, rest: None,
        head_seconds=1,
        idle_seconds=1,
        max_connections=1,
        held_bytes_limit=1,
    )


def labels(**kwargs: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kwargs.items()))


def test_capacity_and_use_split_by_eligibility(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    metered_client.post("/status/sync", json=cluster_request(gpuclass("l40s")))
    samples = scrape(metrics)
    resource = "nvidia.com/NVIDIA_L40S-24Q"
    assert series(samples, "cozystack_gpu_class_capacity_units") == {
        labels(**{"class": "l40s", "resource": resource, "eligible": "true"}): 4.0,
        labels(**{"class": "l40s", "resource": resource, "eligible": "false"}): 2.0,
    }
    assert series(samples, "cozystack_gpu_class_used_units") == {
        labels(**{"class": "l40s", "resource": resource, "eligible": "true"}): 1.0,
        labels(**{"class": "l40s", "resource": resource, "eligible": "false"}): 2.0,
    }
    assert series(samples, "cozystack_gpu_class_free_units") == {labels(**{"class": "l40s"}): 3.0}
    assert series(samples, "cozystack_gpu_class_max_free_per_node_units") == {
        labels(**{"class": "l40s"}): 3.0
    }
    ready = labels(**{"class": "l40s", "type": "Ready", "status": "True", "reason": "Ready"})
    assert series(samples, "cozystack_gpu_class_condition")[ready] == 1.0
    assert len(series(samples, "cozystack_gpu_class_condition")) == len(
        conditions_in_order(licensed=False)
    )


def test_a_dra_class_exports_its_units_and_taken_units(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    from tests.controllers.test_status_dra import cluster as dra_cluster
    from tests.controllers.test_status_dra import gpu_nodes

    cordoned = [*gpu_nodes()[:1], node("n2", gpus=None, unschedulable=True)]
    metered_client.post("/status/sync", json=dra_cluster(nodes=cordoned))
    samples = scrape(metrics)
    device_class = {"class": "a10", "resource": "a10.gpuclass.cozystack.io"}
    # n1: three units, one taken; n2 (cordoned): one unit
    assert series(samples, "cozystack_gpu_class_capacity_units") == {
        labels(**device_class, eligible="true"): 3.0,
        labels(**device_class, eligible="false"): 1.0,
    }
    assert series(samples, "cozystack_gpu_class_used_units") == {
        labels(**device_class, eligible="true"): 1.0,
        labels(**device_class, eligible="false"): 0.0,
    }
    assert series(samples, "cozystack_gpu_class_free_units") == {labels(**{"class": "a10"}): 2.0}
    assert len(series(samples, "cozystack_gpu_class_condition")) == len(
        conditions_in_order(dra=True)
    )


def test_conflicting_class_exports_no_inventory(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    older = gpuclass("a-old", created="2025-01-01T00:00:00Z")
    younger = gpuclass("b-new", created="2026-01-01T00:00:00Z")
    metered_client.post("/status/sync", json=cluster_request(younger, [older, younger]))
    samples = scrape(metrics)
    for name in (
        "cozystack_gpu_class_capacity_units",
        "cozystack_gpu_class_used_units",
        "cozystack_gpu_class_free_units",
        "cozystack_gpu_class_max_free_per_node_units",
    ):
        assert series(samples, name) == {}
    conflict = labels(
        **{
            "class": "b-new",
            "type": "ResourceNameConflict",
            "status": "True",
            "reason": "OlderClassHasResource",
        }
    )
    assert series(samples, "cozystack_gpu_class_condition")[conflict] == 1.0


def test_a_class_without_inventory_hides_no_other_classes(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    older = gpuclass("b-old", created="2025-01-01T00:00:00Z")
    conflicting = gpuclass("a-new", created="2026-01-01T00:00:00Z")  # sorts first
    classes = [older, conflicting]
    metered_client.post("/status/sync", json=cluster_request(conflicting, classes))
    metered_client.post("/status/sync", json=cluster_request(older, classes))
    assert list(series(scrape(metrics), "cozystack_gpu_class_free_units")) == [
        labels(**{"class": "b-old"})
    ]


def test_deleted_class_series_disappear_when_time_advances(
    metered_client: FlaskClient, metrics: Metrics, clock: Clock
) -> None:
    metered_client.post("/status/sync", json=cluster_request(gpuclass("l40s")))
    clock.now += STALE_AFTER_SECONDS  # three resyncs exactly: still the latest computation
    assert series(scrape(metrics), "cozystack_gpu_class_free_units")
    assert series(scrape(metrics), "cozystack_gpu_class_last_sync_timestamp_seconds") == {
        labels(**{"class": "l40s"}): 1_800_000_000.0
    }
    clock.now += 0.001
    samples = scrape(metrics)
    assert series(samples, "cozystack_gpu_class_free_units") == {}
    assert series(samples, "cozystack_gpu_class_last_sync_timestamp_seconds") == {}


def test_class_missing_from_a_sync_class_list_is_forgotten_at_once(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    first, second = gpuclass("a"), gpuclass("b", resource="nvidia.com/OTHER")
    metered_client.post("/status/sync", json=cluster_request(first, [first, second]))
    metered_client.post("/status/sync", json=cluster_request(second, [first, second]))
    assert len(series(scrape(metrics), "cozystack_gpu_class_last_sync_timestamp_seconds")) == 2
    metered_client.post("/status/sync", json=cluster_request(second, [second]))
    assert list(series(scrape(metrics), "cozystack_gpu_class_last_sync_timestamp_seconds")) == [
        labels(**{"class": "b"})
    ]


def test_one_value_per_series_the_most_recent(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    metered_client.post("/status/sync", json=cluster_request(gpuclass("l40s")))
    request = cluster_request(gpuclass("l40s"))
    request["related"]["Pod.v1"] = {}
    metered_client.post("/status/sync", json=request)
    assert series(scrape(metrics), "cozystack_gpu_class_free_units") == {
        labels(**{"class": "l40s"}): 4.0
    }


def test_license_copies_gauge(metered_client: FlaskClient, metrics: Metrics) -> None:
    request = license_sync_request(
        licensed_class(), secrets=[source_secret()], namespaces=[namespace("a"), namespace("b")]
    )
    metered_client.post("/license/sync", json=request)
    assert series(scrape(metrics), "cozystack_gpu_class_license_copies") == {
        labels(**{"class": "l40s"}): 2.0
    }
    metered_client.post(
        "/license/sync", json=license_sync_request(gpuclass("l40s"), secrets=[], namespaces=[])
    )
    assert series(scrape(metrics), "cozystack_gpu_class_license_copies") == {}


def test_hook_metrics_by_route_template_and_code(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    metered_client.post("/status/sync", json=cluster_request(gpuclass("l40s")))
    metered_client.post("/status/sync", data=b"nope")
    metered_client.post("/nowhere/at/all", data=b"x")
    samples = scrape(metrics)
    requests = series(samples, "cozystack_gpu_hook_requests_total")
    assert requests[labels(route="/status/sync", code="200")] == 1.0
    assert requests[labels(route="/status/sync", code="400")] == 1.0
    assert requests[labels(route="unmatched", code="404")] == 1.0
    assert (
        series(samples, "cozystack_gpu_hook_request_duration_seconds_count")[
            labels(route="/status/sync")
        ]
        == 2.0
    )
    sizes = series(samples, "cozystack_gpu_hook_request_body_bytes_sum")
    assert sizes[labels(route="/status/sync")] > 1000


def test_kubevirt_reads_by_outcome(
    metered_client: FlaskClient, metrics: Metrics, apiserver: FakeApiServer
) -> None:
    metered_client.post("/status/sync", json=cluster_request(gpuclass("l40s")))
    apiserver.serve(KUBEVIRT_PATH, 500, {})
    metered_client.post("/status/sync", json=cluster_request(gpuclass("l40s")))
    apiserver.serve(KUBEVIRT_PATH, 404, {"kind": "Status", "code": 404})
    metered_client.post("/status/sync", json=cluster_request(gpuclass("l40s")))
    reads = series(scrape(metrics), "cozystack_gpu_kubevirt_reads_total")
    assert reads == {
        labels(outcome="found"): 1.0,
        labels(outcome="unreadable"): 1.0,
        labels(outcome="absent"): 1.0,
    }


def test_the_workers_threads_and_queue_are_exported_as_they_are_at_the_scrape(
    metrics: Metrics,
) -> None:
    queued = [2]
    metrics.watch_threads(8, lambda: queued[0])
    samples = scrape(metrics)
    assert series(samples, "cozystack_gpu_hook_threads") == {(): 8.0}
    assert series(samples, "cozystack_gpu_hook_calls_queued") == {(): 2.0}
    queued[0] = 5
    assert series(scrape(metrics), "cozystack_gpu_hook_calls_queued") == {(): 5.0}


def test_disabled_exports_no_class_series(settings: Settings, clock: Clock) -> None:
    metrics = Metrics(STALE_AFTER_SECONDS, clock)
    create_app(settings, metrics=metrics).test_client().post(
        "/status/sync", json=cluster_request(gpuclass("a"))
    )
    off = create_app(settings.model_copy(update={"enabled": False}), metrics=metrics).test_client()
    off.post("/status/sync", json=cluster_request(gpuclass("a")))
    assert series(scrape(metrics), "cozystack_gpu_class_last_sync_timestamp_seconds") == {}


FAMILIES = ROOT / "tests" / "metric-families.txt"


def exported_families(metrics: Metrics) -> list[str]:
    """Each family a scrape returns, one line: name, type, label names, histogram buckets, help."""
    reply = metrics_routes(metrics, None)["/metrics"]({})
    lines = []
    for family in text_string_to_metric_families(reply.body.decode()):
        if family.name.endswith("_created"):
            continue  # prometheus-metered_client's creation times, not ours
        names = sorted({k for s in family.samples for k in s.labels} - {"le"})
        buckets = [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
        buckets = list(dict.fromkeys(buckets))
        shape = f" buckets={','.join(buckets)}" if buckets else ""
        lines.append(
            f"{family.name} {family.type} [{','.join(names)}]{shape}: {family.documentation}"
        )
    return lines


def test_a_scrape_exports_exactly_the_families_dashboards_and_alerts_are_written_for(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    """The families, their types, label names, buckets and help are the interface hosters'
    dashboards and alerts read: a change to any of them is a change to tests/metric-families.txt,
    made on purpose."""
    metered_client.post("/status/sync", json=cluster_request(gpuclass("l40s")))
    request = license_sync_request(
        licensed_class(), secrets=[source_secret()], namespaces=[namespace("a")]
    )
    metered_client.post("/license/sync", json=request)
    metered_client.post("/budget-pools/sync", data=example_of("/budget-pools/sync"))
    metered_client.post("/budget-report/sync", data=example_of("/budget-report/sync"))
    metrics.budgets.record(["tenant-old"], [PoolUse("tenant-old", "old", (), unreadable="unknown")])
    metrics.watch_threads(4, lambda: 0)
    metrics.memory_wait.observe(0.2)
    metrics.kubevirt_reads.labels(outcome="found").inc()
    metrics.apart_calls.labels(outcome="answered").inc()
    metrics.watch_connections("hooks", quiet_edge())
    metrics.watch_admission_memory(Allowance(1024))
    metrics.watch_tls("hooks", lambda: 2e9)
    metrics.watch_client_certificates(lambda: 2e9)
    metrics.watch_credentials(CredentialWatch([Watched("token", "/tokens", lambda: None)]))
    assert exported_families(metrics) == FAMILIES.read_text().splitlines()


def test_the_documented_metrics_are_the_exported_ones(
    metered_client: FlaskClient, metrics: Metrics
) -> None:
    """docs/operating.md's table names every family with its labels."""
    documented = {}
    for line in (ROOT / "docs" / "operating.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| `cozystack_gpu_") and len(cells) == 3:
            for name in re.findall(r"`([a-z_]+)`", cells[0]):
                documented[name] = sorted(re.findall(r"`([a-z_]+)`", cells[1]))
    exported = {}
    for line in FAMILIES.read_text().splitlines():
        name, kind, rest = line.split(" ", 2)
        label_names = rest[1 : rest.index("]")]
        exported[name + ("_total" if kind == "counter" else "")] = [
            label for label in label_names.split(",") if label
        ]
    assert documented == exported


def test_license_series_go_when_gpu_features_are_disabled(
    settings: Settings, metrics: Metrics
) -> None:
    request = license_sync_request(
        licensed_class(), secrets=[source_secret()], namespaces=[namespace("a")]
    )
    create_app(settings, metrics=metrics).test_client().post("/license/sync", json=request)
    assert series(scrape(metrics), "cozystack_gpu_class_license_copies")
    off = create_app(settings.model_copy(update={"enabled": False}), metrics=metrics)
    off.test_client().post("/license/sync", json=request)
    assert series(scrape(metrics), "cozystack_gpu_class_license_copies") == {}


def test_class_series_outlive_three_status_resyncs() -> None:
    assert stale_after_seconds(Settings(status_resync_seconds=60)) == 180
    assert stale_after_seconds(Settings(status_resync_seconds=20)) == 60


def test_counters_of_known_outcomes_are_exported_at_zero_before_the_first(metrics: Metrics) -> None:
    """A first increase is then a rate like any other, not a series appearing, which rate() and
    the alerts cannot see."""
    samples = scrape(metrics)
    assert series(samples, "cozystack_gpu_hook_memory_refused_total") == {
        labels(code="413"): 0.0,
        labels(code="429"): 0.0,
    }
    assert series(samples, "cozystack_gpu_budget_reviews_total") == {
        labels(verdict=verdict): 0.0 for verdict in ("allowed", "denied", "failed_closed")
    }


def test_no_client_certificate_series_unless_client_certificates_are_required() -> None:
    """A series at its default 0 would read as a certificate that ended in 1970, and the
    expiry alert would fire on every install without `tls.clientAuth`."""
    name = "cozystack_gpu_hook_client_certificate_expiry_timestamp_seconds"
    metrics = Metrics(180.0)
    assert name not in metrics.exposition()[0].decode()
    metrics.watch_client_certificates(lambda: 2e9)
    assert f"{name} 2e+09" in metrics.exposition()[0].decode()


def test_the_kernels_listen_overflows_are_read_from_netstat(tmp_path: Path) -> None:
    """TcpExt's ListenOverflows, by its column name (the kernel adds columns over releases)."""
    netstat = tmp_path / "netstat"
    netstat.write_text(
        "TcpExt: SyncookiesSent ListenOverflows ListenDrops\n"
        "TcpExt: 0 17 19\n"
        "IpExt: InNoRoutes\n"
        "IpExt: 3\n"
    )
    assert listen_overflows(netstat) == 17
    assert listen_overflows(tmp_path / "absent") is None
    netstat.write_text("IpExt: InNoRoutes\nIpExt: 3\n")
    assert listen_overflows(netstat) is None
