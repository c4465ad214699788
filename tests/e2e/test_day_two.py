"""Day two on a real one-node cluster: a rolling upgrade and a deleted pod while Metacontroller
syncs and the API server sends admission reviews. Neither may cost a call or a copy: every review
gets its verdict, no sync fails, and no entitled namespace is ever without its license copy, not
even for a moment (a watch sees every deletion).

Each scenario writes what its calls came to in the run's logs folder
(`<GPUCLASS_E2E_DIR>/logs/<scenario>.json`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest

from hooks.rules.budget.keys import TOTAL_KEY
from tests.builders import helmrelease
from tests.e2e.conftest import CHART, GPU, NAMESPACE, RELEASE, Cluster, wait_for
from tests.e2e.load import ENTITLED_LABEL, Load, Outcomes
from tests.e2e.steps import (
    COPY,
    install_with_cert_manager,
    licensed_setup,
    remove_release,
    upgrade,
    webhook_ca_injected,
)

ENTITLED = ["tenant-entitled", "tenant-e1", "tenant-e2"]
CHURN = "tenant-churn"
FITS, EXCEEDS = "tenant-load", "tenant-a"
NEXT_TAG = "e2e-next"
# Calls before, during and after each change, so the change happens with calls in flight.
SETTLE_SECONDS = 5


@pytest.fixture(scope="module")
def serving(
    cluster: Cluster,
    metacontroller: None,
    cert_manager: None,
    image_on_node: None,
    cozystack: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """The install with cert-manager and admission on, copies in three entitled namespaces, one
    tenant with room for a VM and one without."""
    remove_release(cluster)
    install_with_cert_manager(cluster, tmp_path_factory.mktemp("install"))
    upgrade(cluster, "admission.enabled=true")
    licensed_setup(cluster)
    namespaces = [*ENTITLED[1:], CHURN, "tenant-root", FITS, EXCEEDS]
    cluster.apply(
        *(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": name,
                    "labels": {ENTITLED_LABEL: "true"} if name in ENTITLED else {},
                },
            }
            for name in namespaces
        ),
        helmrelease("Tenant", "tenant-root", "load", {"resourceQuotas": {TOTAL_KEY: "1000"}}),
        helmrelease("Tenant", "tenant-root", "a", {"resourceQuotas": {TOTAL_KEY: "1"}}),
        helmrelease("VMInstance", EXCEEDS, "render", {"gpus": [{"name": GPU}]}),
    )
    for namespace in ENTITLED:
        wait_for(f"the copy in {namespace}", lambda n=namespace: cluster.secret_data(n, COPY))
    wait_for("the webhook's CA bundle", lambda: webhook_ca_injected(cluster))
    yield
    remove_release(cluster)


def load(cluster: Cluster) -> Load:
    return Load(
        cluster, entitled=ENTITLED, churn=CHURN, fits=FITS, exceeds=EXCEEDS, gpuclass="l40s"
    )


def hook_pods(cluster: Cluster) -> list[Any]:
    """The Deployment's pods, terminating ones included (not `helm test`'s)."""
    listed = cluster.get("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")
    owned = [(pod, pod["metadata"].get("ownerReferences", [])) for pod in listed["items"]]
    return [pod for pod, owners in owned if any(o["kind"] == "ReplicaSet" for o in owners)]


def cost_nothing(cluster: Cluster, scenario: str, outcomes: Outcomes) -> None:
    """Every review had its verdict, no sync failed, no copy went, and syncs ran throughout."""
    record = cluster.directory / "logs" / f"{scenario}.json"
    record.write_text(json.dumps(asdict(outcomes), indent=2))
    assert outcomes.review_failures == []
    assert outcomes.reviews["allowed"] >= 10 and outcomes.reviews["denied"] >= 10, outcomes.reviews
    assert outcomes.sync_failures == []
    assert outcomes.watch_failures == []
    assert outcomes.copies_deleted == []
    assert outcomes.churn_copies_created >= 2, "no license sync ran under the load"
    for namespace in ENTITLED:
        assert cluster.secret_data(namespace, COPY) is not None


def test_a_rolling_upgrade_under_load_refuses_no_call_and_loses_no_copy(
    cluster: Cluster, serving: None, pytestconfig: pytest.Config
) -> None:
    """Step 7's upgrade to a new image while syncs and reviews arrive: the Deployment surges a
    new pod, then drains the old ones."""
    image = f"docker.io/library/{pytestconfig.getoption('--e2e-image')}"
    repository = image.rsplit(":", 1)[0]
    cluster.ctr("images", "tag", "--force", image, f"{repository}:{NEXT_TAG}")
    with load(cluster) as running:
        time.sleep(SETTLE_SECONDS)
        cluster.kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
        upgrade(cluster, f"image.tag={NEXT_TAG}")
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
    with load(cluster) as running:
        time.sleep(SETTLE_SECONDS)
        victim = hook_pods(cluster)[0]["metadata"]["name"]
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, victim, "--wait=true")
        cluster.rollout("deployment", NAMESPACE, RELEASE)
        time.sleep(SETTLE_SECONDS)
    cost_nothing(cluster, "pod-deleted", running.outcomes)
