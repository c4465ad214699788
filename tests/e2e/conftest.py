"""The install as a cluster runs it (`make e2e`): these tests run inside the network namespace of a
real two-node cluster that testenv/cluster.py boots around them, and drive it only with the
commands docs/install.md and docs/operating.md give (kubectl, helm, openssl, ctr).

They are collected only there (tests/conftest.py): `make test` has no cluster to give them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import cozystack as cozystack_sources
from tests.controlplane import manifests
from tests.e2e.cluster import GPU, Cluster, wait_for
from tests.e2e.load import tenancy
from tests.e2e.steps import (
    COZYSTACK,
    doc_block,
    image_digest,
    import_image,
    install_with_cert_manager,
    remove_release,
    upgrade,
)
from tests.fake_apiserver import kubevirt_cr


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    directory = Path(os.environ["GPUCLASS_E2E_DIR"])
    tools = Path(os.environ["GPUCLASS_TESTENV_CACHE"])
    return Cluster(directory, tools)


# --- what the cluster needs (step 1) and the image (step 2) ---------------------------------


@pytest.fixture(scope="session")
def metacontroller(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Step 1: Metacontroller from its own chart (its source's, as no registry is reachable),
    with the values docs/cozystack.md gives it: two replicas under leader election, the apply
    strategy docs/install.md recommends, and a ClusterRole of only what the two controllers need
    (every test after this one shows it is enough)."""
    values = tmp_path_factory.mktemp("metacontroller") / "values.yaml"
    values.write_text(doc_block("with these values:", COZYSTACK, language="yaml"))
    cluster.helm(
        "install",
        "metacontroller",
        str(cluster.tools / "metacontroller-chart"),
        "--namespace",
        "metacontroller",
        "--create-namespace",
        "--values",
        str(values),
        "--set",
        "image.repository=e2e.local/metacontroller",
        "--set",
        "image.tag=1",
        "--set",
        "image.pullPolicy=Never",
        "--wait",
        "--timeout=180s",
    )


@pytest.fixture(scope="session")
def cert_manager(cluster: Cluster) -> None:
    """cert-manager's controller and cainjector, as pods, with its own CRDs."""
    for crd in sorted((cluster.tools / "cert-manager-crds").glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "-f", str(crd))
    labels = {"app": "cert-manager"}
    documents: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cert-manager"}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "cert-manager", "namespace": "cert-manager"},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "cert-manager"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "cert-manager", "namespace": "cert-manager"}
            ],
        },
    ]
    for part in ("controller", "cainjector"):
        documents.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": f"cert-manager-{part}", "namespace": "cert-manager"},
                "spec": {
                    "selector": {"matchLabels": {**labels, "part": part}},
                    "template": {
                        "metadata": {"labels": {**labels, "part": part}},
                        "spec": {
                            "serviceAccountName": "cert-manager",
                            "containers": [
                                {
                                    "name": part,
                                    "image": f"e2e.local/cert-manager-{part}:1",
                                    "imagePullPolicy": "Never",
                                }
                            ],
                        },
                    },
                },
            }
        )
    cluster.apply(*documents)
    for part in ("controller", "cainjector"):
        cluster.rollout("deployment", "cert-manager", f"cert-manager-{part}")


@pytest.fixture(scope="session")
def image_on_node(
    cluster: Cluster, pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Step 2, "as a file": the image as `make release` writes it, imported on the node under its
    tag and its digest, which the chart installs it by."""
    tag: str = pytestconfig.getoption("--e2e-image")
    digest = import_image(cluster, tag, tmp_path_factory.mktemp("image"))
    assert image_digest(cluster) == digest


@pytest.fixture(scope="session")
def cozystack(cluster: Cluster) -> None:
    """What a Cozystack cluster serves that the hooks read: its app kinds (the tests' CRDs stand
    for its aggregated API), HelmReleases, the KubeVirt object, and Cozystack's own cluster
    instance types and tenant roles, applied as they are."""
    cluster.apply(*cozystack_sources.app_crds(), *manifests("kubevirt-crd.yaml"))
    cluster.apply(*cozystack_sources.instance_types(), *cozystack_sources.tenant_roles())
    cluster.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cozy-kubevirt"}},
    )
    wait_for("the KubeVirt kind", lambda: cluster.get("kubevirts", "-A") is not None)
    cluster.apply(kubevirt_cr(GPU))


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
    tenancy(cluster)
    yield
    remove_release(cluster)
