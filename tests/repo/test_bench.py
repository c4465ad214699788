"""The benchmark's generator and its equality check, on size S (timings are not tested)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import msgspec
import pytest

from bench.cluster import GPU_RESOURCES, generate, license_sync_body, status_sync_body
from bench.common import free_units
from bench.load import echo_round_trip
from bench.run import KUBEVIRT, decode_floor, in_process
from hooks.controllers import license
from hooks.rules.permitted_devices import KubeVirtFound
from hooks.settings import Settings
from hooks.wire.kube import KubeVirt
from hooks.wire.metacontroller import decode_decorator_sync, encode
from tests import ROOT

VIEW = KubeVirtFound(msgspec.convert(KUBEVIRT, KubeVirt), "cozy-kubevirt/kubevirt")


def test_generator_is_seeded_and_realistic() -> None:
    cluster = generate("S")
    assert generate("S") == cluster
    assert generate("S", seed=8) != cluster
    assert (len(cluster.nodes), len(cluster.pods)) == (50, 1500)
    node_kb = sum(map(len, cluster.nodes.values())) / len(cluster.nodes) / 1024
    pod_kb = sum(map(len, cluster.pods.values())) / len(cluster.pods) / 1024
    assert 8 <= node_kb <= 12
    assert 6.5 <= pod_kb <= 9.5
    nodes = [json.loads(n) for n in cluster.nodes.values()]
    pods = [json.loads(p) for p in cluster.pods.values()]
    assert all({"images", "conditions", "addresses"} <= set(n["status"]) for n in nodes)
    assert all("managedFields" in n["metadata"] for n in nodes)
    assert any(GPU_RESOURCES[0] in n["status"]["allocatable"] for n in nodes)
    assert any(GPU_RESOURCES[1] in n["status"]["allocatable"] for n in nodes)
    assert any(n["spec"].get("taints") for n in nodes)
    assert all(len(p["spec"]["containers"]) >= 2 and p["spec"]["volumes"] for p in pods)
    assert any(
        c.get("restartPolicy") == "Always" for p in pods for c in p["spec"]["initContainers"]
    )
    assert all("containerStatuses" in p["status"] for p in pods)


def test_every_method_produces_the_same_status_on_size_s() -> None:
    cluster = generate("S")
    settings = Settings()
    first = json.loads(in_process(status_sync_body(cluster), settings, VIEW))
    body = status_sync_body(cluster, parent_status=first["status"])
    again = json.loads(in_process(body, settings, VIEW))
    assert again == first
    assert (first["status"]["free"], first["status"]["maxFreePerNode"]) == free_units(body)
    floor = decode_floor(body)
    assert len(floor.related.nodes) == 50
    assert len(floor.related.pods) == 1500
    assert first["status"]["conditions"][-1]["reason"] == "Ready"


def test_selectors_keep_requests_small() -> None:
    cluster = generate("S")
    assert len(status_sync_body(cluster, selected=True)) * 5 < len(status_sync_body(cluster))


def test_license_request_of_the_benchmark() -> None:
    cluster = generate("S")
    outcome = license.sync(decode_decorator_sync(license_sync_body(cluster)), Settings())
    assert len(json.loads(encode(outcome.response))["attachments"]) == 20


def test_the_echo_the_slow_client_benchmark_reports_for_scale_answers_every_round_trip() -> None:
    with echo_round_trip() as round_trip:
        times = [round_trip() for _ in range(20)]
    assert all(0 < ms < 1000 for ms in times)


def test_the_report_benchmark_sends_a_tenancy_of_a_thousand_tenants_with_nested_pools() -> None:
    from bench import report

    bodies = report.pool_bodies(apps_per_tenant=2)
    assert len(bodies) == 1 + report.TOP_LEVEL * (1 + report.SUB_TENANTS)
    answers = {name: json.loads(report.in_process(body)) for name, body in bodies.items()}
    attached = {
        made["metadata"]["namespace"]: made
        for answer in answers.values()
        for made in answer["attachments"]
    }
    # every top-level tenant, and every other sub-tenant, is bounded with GPU keys
    assert len(attached) == report.TOP_LEVEL * (1 + report.SUB_TENANTS // 2)
    acme = json.loads(attached["tenant-t000"]["data"]["budget.json"])
    assert {k["key"] for k in acme["keys"]} == {
        "gpuclass.cozystack.io/devices",
        "l40s-24q.gpuclass.cozystack.io/devices",
        "h100.gpuclass.cozystack.io/devices",
    }
    assert acme["keys"][0]["carvedOut"] == 4 * 20  # the four bounded sub-tenants


@pytest.mark.tools  # the chart is rendered with helm
def test_a_design_at_a_commit_is_that_commits_service_and_chart(tmp_path: Path) -> None:
    from bench.metacontroller import hooks_at

    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    design = hooks_at("HEAD", tmp_path / "tree")
    assert (design.label, design.root) == (head, tmp_path / "tree")
    committed = subprocess.run(
        ["git", "-C", str(ROOT), "show", "HEAD:hooks/routes.py"], capture_output=True, check=True
    ).stdout
    assert (design.root / "hooks" / "routes.py").read_bytes() == committed
    # the chart rendered is the unpacked tree's, not this one's
    marker = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "only-in-that-tree"}}
    (design.root / "metacontroller" / "templates" / "marker.yaml").write_text(json.dumps(marker))
    assert marker in design.chart
