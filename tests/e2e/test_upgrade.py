"""An upgrade from the previous release to the tree under test, on a real cluster (docs/install.md,
step 7): the previous release's chart and image (`make e2e` builds them from its commit, with
`python -m release.previous`), its license copies, budgets and class; then `helm upgrade
--reset-then-reuse-values` to this chart and image while syncs and reviews arrive. No call may be
refused, no copy lost, no budget verdict changed, and the GPUClass CRD is upgraded in place: the
same object, and every class in it, with this chart's schema."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import CHART, NAMESPACE, RELEASE, Cluster, wait_for
from tests.e2e.load import SETTLE_SECONDS, cost_nothing, images_running, scenario_load, tenancy
from tests.e2e.steps import IMAGE, image_digest, import_image, remove_release

CRD = "gpuclasses.cozystack.io"


def previous_release(pytestconfig: pytest.Config) -> dict[str, str]:
    into = pytestconfig.getoption("--e2e-previous")
    assert into, "make e2e passes --e2e-previous (python -m release.previous builds it)"
    described: dict[str, str] = json.loads((Path(into) / "release.json").read_text())
    return described


def crd_versions(cluster: Cluster, chart: Path) -> list[dict[str, Any]]:
    """The GPUClass CRD's versions (their schemas, columns and subresources) as the chart
    renders them."""
    rendered = cluster.helm("template", RELEASE, str(chart), "--namespace", NAMESPACE).stdout
    (crd,) = [
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "CustomResourceDefinition" and d["metadata"]["name"] == CRD
    ]
    versions: list[dict[str, Any]] = crd["spec"]["versions"]
    return versions


def test_an_upgrade_from_the_previous_release_under_load_refuses_no_call_and_changes_no_verdict(
    cluster: Cluster,
    metacontroller: None,
    cert_manager: None,
    image_on_node: None,
    cozystack: None,
    pytestconfig: pytest.Config,
    tmp_path: Path,
) -> None:
    previous = previous_release(pytestconfig)
    remove_release(cluster)
    previous_digest = import_image(cluster, previous["image"], tmp_path)
    cluster.helm(
        "install", RELEASE, previous["chart"], "--namespace", NAMESPACE, "--create-namespace",
        "--set", "gpuOperator.variant=vgpu", "--set", f"image.repository={IMAGE}",
        "--set", f"image.digest={previous_digest}", "--set", "image.pullPolicy=Never",
        "--set", "admission.enabled=true", "--wait", "--timeout=180s",
    )  # fmt: skip
    cluster.rollout("deployment", NAMESPACE, RELEASE)
    tenancy(cluster)
    assert images_running(cluster) == {f"{IMAGE}@{previous_digest}"}
    crd_before = cluster.get("crd", CRD)
    assert crd_before["spec"]["versions"] == crd_versions(cluster, Path(previous["chart"]))
    class_before = cluster.get("gpuclass", "l40s")

    digest = image_digest(cluster)
    with scenario_load(cluster) as running:
        time.sleep(SETTLE_SECONDS)
        cluster.helm(
            "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--reset-then-reuse-values", "--set", f"image.digest={digest}",
            "--wait", "--timeout=180s",
        )  # fmt: skip
        wait_for(
            "only pods of the tree's image",
            lambda: images_running(cluster) == {f"{IMAGE}@{digest}"},
            seconds=180,
        )
        time.sleep(SETTLE_SECONDS)
    cost_nothing(cluster, f"upgrade-from-{previous['version']}", running.outcomes)

    crd_after = cluster.get("crd", CRD)
    assert crd_after["metadata"]["uid"] == crd_before["metadata"]["uid"]
    assert crd_after["spec"]["versions"] == crd_versions(cluster, CHART)
    assert cluster.get("gpuclass", "l40s")["metadata"]["uid"] == class_before["metadata"]["uid"]
    remove_release(cluster)
