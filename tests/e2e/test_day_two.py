"""Day two on a real cluster: a rolling upgrade and a deleted pod while Metacontroller
syncs and the API server sends admission reviews. Neither may cost a call or a copy: every review
gets its verdict, no sync fails, and no entitled namespace is ever without its license copy, not
even for a moment (a watch sees every deletion).

Each scenario writes what its calls came to in the run's logs folder
(`<GPUCLASS_E2E_DIR>/logs/<scenario>.json`)."""

from __future__ import annotations

import time

import pytest

from tests.e2e.cluster import NAMESPACE, RELEASE, Cluster, wait_for
from tests.e2e.load import SETTLE_SECONDS, cost_nothing, hook_pods, scenario_load
from tests.e2e.steps import upgrade

NEXT_TAG = "e2e-next"


def test_a_rolling_upgrade_under_load_refuses_no_call_and_loses_no_copy(
    cluster: Cluster, serving: None, pytestconfig: pytest.Config
) -> None:
    """Step 7's upgrade to a new image while syncs and reviews arrive: the Deployment surges a
    new pod, then drains the old ones. The install pinned the image by digest; the upgrade names
    it by a tag of its own, so that its pods are told apart."""
    image = f"docker.io/library/{pytestconfig.getoption('--e2e-image')}"
    repository = image.rsplit(":", 1)[0]
    cluster.ctr("images", "tag", "--force", image, f"{repository}:{NEXT_TAG}")
    with scenario_load(cluster) as running:
        time.sleep(SETTLE_SECONDS)
        upgrade(cluster, "image.digest=", f"image.tag={NEXT_TAG}")
        wait_for(
            "only pods of the new image",
            lambda: all(
                pod["spec"]["containers"][0]["image"].endswith(f":{NEXT_TAG}")
                for pod in hook_pods(cluster)
            ),
            seconds=180,
        )
        time.sleep(SETTLE_SECONDS)
    cost_nothing(cluster, "rolling-upgrade", running.outcomes)


def test_a_pod_deleted_under_load_refuses_no_call_and_loses_no_copy(
    cluster: Cluster, serving: None
) -> None:
    """One of the two pods deleted (as a node drain or an eviction does) while syncs and reviews
    arrive: it drains while the other serves, and the Deployment replaces it."""
    with scenario_load(cluster) as running:
        time.sleep(SETTLE_SECONDS)
        victim = hook_pods(cluster)[0]["metadata"]["name"]
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, victim, "--wait=true")
        cluster.rollout("deployment", NAMESPACE, RELEASE)
        time.sleep(SETTLE_SECONDS)
    cost_nothing(cluster, "pod-deleted", running.outcomes)
