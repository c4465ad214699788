"""docs/install.md, step by step, on a real one-node cluster: Metacontroller from its own chart,
cert-manager, the image loaded into the node, the chart installed with cert-manager and then with
an existing TLS Secret, `helm test`, license copies converging, a budget denial through the API
server, and the documented uninstall. The shell blocks are the document's own, run as written
(the image flags of step 2's "as a file" variant and `--wait` added to each `helm install`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hooks.rules.budget.keys import TOTAL_KEY
from tests.apiserver import kubevirt_cr
from tests.builders import SOURCE_NAME, SOURCE_NS, TOKEN_KEY, helmrelease
from tests.e2e.conftest import CHART, MANIFESTS, NAMESPACE, RELEASE, Cluster, wait_for

INSTALL = Path(__file__).parent.parent.parent / "docs" / "install.md"
IMAGE_FLAGS = (
    "--set image.repository=docker.io/library/gpuclass-hooks --set image.tag=dev "
    "--set image.pullPolicy=Never --wait --timeout=180s"
)
GPU = "nvidia.com/L40S"
LICENSE_RESYNC_SECONDS = 300  # the chart's controllers.licenseResyncPeriodSeconds


def doc_block(after: str) -> str:
    """The first shell block of docs/install.md after the line that holds `after`."""
    text = INSTALL.read_text()
    start = text.index(after)
    match = re.compile(r"```sh\n(.*?)```", re.S).search(text, start)
    assert match is not None, f"no shell block after {after!r} in docs/install.md"
    return match.group(1)


def with_image(block: str) -> str:
    """Each `helm install` and `helm upgrade` of the chart, with the image loaded into the node,
    waiting until the release's pods are Ready."""
    return re.sub(
        r"(helm (?:install|upgrade) gpuclass-hooks \./metacontroller[^\n]*?)(\s*)$",
        lambda m: f"{m.group(1)} {IMAGE_FLAGS}{m.group(2)}",
        block.replace("\\\n", " "),
        flags=re.M,
    )


def run_block(cluster: Cluster, block: str, workdir: Path) -> str:
    """A documented block, in bash, where `./metacontroller` is the chart."""
    link = workdir / "metacontroller"
    if not link.exists():
        link.symlink_to(CHART)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": f"{cluster.tools}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0, f"{block}\nexited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def rollout(cluster: Cluster, kind: str, namespace: str, name: str) -> None:
    cluster.kubectl("-n", namespace, "rollout", "status", f"{kind}/{name}", "--timeout=180s")


# --- what the cluster needs (step 1) and the image (step 2) ---------------------------------


@pytest.fixture(scope="module")
def metacontroller(cluster: Cluster) -> None:
    """Step 1: Metacontroller from its own chart (its source's, as no registry is reachable),
    with the apply strategy docs/install.md recommends."""
    cluster.helm(
        "install",
        "metacontroller",
        str(cluster.tools / "metacontroller-chart"),
        "--namespace",
        "metacontroller",
        "--create-namespace",
        "--set",
        "image.repository=e2e.local/metacontroller",
        "--set",
        "image.tag=1",
        "--set",
        "image.pullPolicy=Never",
        "--set-json",
        'commandArgs=["--zap-log-level=4","--discovery-interval=20s",'
        '"--apply-strategy=server-side-apply"]',
        "--wait",
        "--timeout=180s",
    )


@pytest.fixture(scope="module")
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
        rollout(cluster, "deployment", "cert-manager", f"cert-manager-{part}")


@pytest.fixture(scope="module")
def image_on_node(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    """Step 2, "as a file": docker save, then ctr import on the node."""
    tag: str = request.config.getoption("--e2e-image")
    saved = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE)
    socket = cluster.directory / "containerd" / "containerd.sock"
    imported = subprocess.run(
        ["ctr", f"--address={socket}", "--namespace", "k8s.io", "images", "import", "-"],
        stdin=saved.stdout,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert saved.wait() == 0 and imported.returncode == 0, imported.stderr
    listed = cluster.ctr("images", "ls", "-q").stdout.split()
    assert f"docker.io/library/{tag}" in listed


@pytest.fixture(scope="module")
def cozystack(cluster: Cluster) -> None:
    """What a Cozystack cluster serves that the hooks read: its app kinds (the tests' CRDs stand
    for its aggregated API), HelmReleases, and the KubeVirt object."""
    for name in ("cozystack-crds.yaml", "kubevirt-crd.yaml"):
        cluster.apply(*yaml.safe_load((MANIFESTS / name).read_text())["documents"])
    cluster.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cozy-kubevirt"}},
    )
    wait_for("the KubeVirt kind", lambda: cluster.get("kubevirts", "-A") is not None)
    cluster.apply(kubevirt_cr(GPU))


# --- the install (steps 3 and 4) ----------------------------------------------------------------


def helm_test(cluster: Cluster) -> str:
    done = cluster.helm("test", RELEASE, "--namespace", NAMESPACE, "--timeout=180s")
    return done.stdout


def test_install_with_cert_manager_then_helm_test_passes(
    cluster: Cluster,
    metacontroller: None,
    cert_manager: None,
    image_on_node: None,
    cozystack: None,
    tmp_path: Path,
) -> None:
    block = doc_block("With cert-manager:")
    block = block.replace(
        "--set image.repository=registry.example.com/gpuclass-hooks --set image.tag=0.1.0", ""
    )
    run_block(cluster, with_image(block), tmp_path)
    rollout(cluster, "deployment", NAMESPACE, RELEASE)
    ready = cluster.get("certificate", "-n", NAMESPACE)
    assert ready is not None and all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in item["status"]["conditions"])
        for item in ready["items"]
    )
    output = helm_test(cluster)
    assert "Phase:          Succeeded" in output, output


def licensed_setup(cluster: Cluster) -> None:
    cluster.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SOURCE_NS}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SOURCE_NAME, "namespace": SOURCE_NS},
            "stringData": {TOKEN_KEY: "e2e-license-token"},
        },
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": "tenant-entitled",
                "labels": {"namespace.cozystack.io/vgpu": "true"},
            },
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-plain"}},
        {
            "apiVersion": "cozystack.io/v1alpha1",
            "kind": "GPUClass",
            "metadata": {"name": "l40s"},
            "spec": {
                "resourceName": GPU,
                "license": {"secretRef": {"name": SOURCE_NAME}, "featureType": 1},
            },
        },
    )


COPY = "gpuclass-l40s-license"


def test_license_copies_converge_in_entitled_namespaces_only(cluster: Cluster) -> None:
    licensed_setup(cluster)
    copy = wait_for(
        "the license copy in tenant-entitled",
        lambda: cluster.secret_data("tenant-entitled", COPY),
    )
    assert copy[TOKEN_KEY] == b"e2e-license-token"
    assert b"FeatureType=1" in copy["gridd.conf"]
    assert cluster.secret_data("tenant-plain", COPY) is None
    # entitlement given, then taken away
    cluster.kubectl("label", "namespace", "tenant-plain", "namespace.cozystack.io/vgpu=true")
    wait_for(
        "the copy in a newly labelled namespace", lambda: cluster.secret_data("tenant-plain", COPY)
    )
    cluster.kubectl("label", "namespace", "tenant-plain", "namespace.cozystack.io/vgpu-")
    wait_for("the copy gone", lambda: cluster.secret_data("tenant-plain", COPY) is None)
    status = wait_for(
        "the class's computed status",
        lambda: (cluster.get("gpuclass", "l40s") or {}).get("status", {}).get("conditions"),
    )
    assert {c["type"] for c in status} >= {"Ready"}


def vm(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMInstance",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gpus": [{"name": GPU}]},
    }


def upgrade(cluster: Cluster, *sets: str) -> None:
    """`helm upgrade --reuse-values` of the release with these values, until its pods are Ready."""
    flags = [flag for value in sets for flag in ("--set", value)]
    cluster.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--reuse-values",
        *flags,
        "--wait",
        "--timeout=180s",
    )


def webhook_ca_injected(cluster: Cluster) -> bool:
    listed = cluster.get("validatingwebhookconfiguration") or {"items": []}
    webhooks = [w for item in listed["items"] for w in item["webhooks"]]
    return bool(webhooks) and all(w["clientConfig"].get("caBundle") for w in webhooks)


def test_budget_denial_through_the_api_server(cluster: Cluster) -> None:
    """Step 5: admission on; the API server calls the webhook through its Service, with the CA
    cert-manager's injector put in."""
    upgrade(cluster, "admission.enabled=true")
    wait_for("the webhook's CA bundle", lambda: webhook_ca_injected(cluster))
    for namespace in ("tenant-root", "tenant-a"):
        cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    cluster.apply(
        helmrelease("Tenant", "tenant-root", "a", {"resourceQuotas": {TOTAL_KEY: "1"}}),
        helmrelease("VMInstance", "tenant-a", "render", {"gpus": [{"name": GPU}]}),
    )
    denied = cluster.kubectl(
        "create", "-f", "-", input=json.dumps(vm("tenant-a", "two")), check=False
    )
    assert denied.returncode != 0
    assert (
        'admission webhook "gpu-budget.gpuclass.cozystack.io" denied the request: '
        f"{TOTAL_KEY}: this VMInstance needs 1, the pool of tenant a (tenant-a) has 0 left"
    ) in denied.stderr


def test_uninstall_as_documented_removes_every_copy(cluster: Cluster) -> None:
    """Step 7: GPU features off, the copies gone, then `helm uninstall`; the CRD and the classes
    stay."""
    upgrade(cluster, "gpu.enabled=false")
    # The controllers' spec changes with the switch, so Metacontroller syncs at once, but may
    # reach a pod that still serves copies while the new ones roll out: then the copies go at
    # the next license resync (controllers.licenseResyncPeriodSeconds).
    wait_for(
        "no copies left",
        lambda: (
            cluster.get("secrets", "-A", "-l", "gpuclass.cozystack.io/license-copy=true")["items"]
            == []
        ),
        seconds=LICENSE_RESYNC_SECONDS + 60,
    )
    cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=180s")
    assert cluster.get("gpuclass", "l40s") is not None
    assert cluster.get("compositecontroller", "gpuclass-status") is None
    assert cluster.get("deployment", "-n", NAMESPACE, RELEASE) is None


def test_install_with_an_existing_tls_secret_then_helm_test_passes(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=180s")
    block = doc_block("Without it, make the TLS Secret first.")
    run_block(cluster, with_image(block), tmp_path)
    rollout(cluster, "deployment", NAMESPACE, RELEASE)
    output = helm_test(cluster)
    assert "Phase:          Succeeded" in output, output
    copy = wait_for("the license copy again", lambda: cluster.secret_data("tenant-entitled", COPY))
    assert copy[TOKEN_KEY] == b"e2e-license-token"
