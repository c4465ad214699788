"""The install as a cluster runs it (`make e2e`): these tests run inside the network namespace of a
real one-node cluster that testenv/cluster.py boots around them, and drive it only with the
commands docs/install.md and docs/operating.md give (kubectl, helm, openssl, ctr).

They are collected only there (tests/conftest.py): `make test` has no cluster to give them.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.apiserver import kubevirt_cr

ROOT = Path(__file__).parent.parent.parent
CHART = ROOT / "metacontroller"
MANIFESTS = ROOT / "tests" / "manifests"
RELEASE, NAMESPACE = "gpuclass-hooks", "cozy-gpu"
GPU = "nvidia.com/L40S"


class CommandFailed(AssertionError):
    pass


@dataclass(frozen=True)
class Cluster:
    directory: Path
    tools: Path

    def run(
        self, *command: str, input: str | None = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise CommandFailed(
                f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}"
                f"\n{done.stderr[-3000:]}"
            )
        return done

    def kubectl(self, *arguments: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.tools / "kubectl"), *arguments, **kwargs)

    def helm(self, *arguments: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.tools / "helm"), *arguments, **kwargs)

    def apply(self, *documents: dict[str, Any]) -> None:
        listed = {"apiVersion": "v1", "kind": "List", "items": list(documents)}
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(listed)
        )

    def get(self, *arguments: str) -> Any:
        done = self.kubectl("get", *arguments, "-o", "json", check=False)
        if done.returncode != 0:
            return None
        return json.loads(done.stdout)

    def secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        found = self.get("secret", "-n", namespace, name)
        if found is None:
            return None
        return {key: base64.b64decode(value) for key, value in found.get("data", {}).items()}

    def ctr(self, *arguments: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        socket = self.directory / "containerd" / "containerd.sock"
        return self.run("ctr", f"--address={socket}", "--namespace=k8s.io", *arguments, **kwargs)

    def rollout(self, kind: str, namespace: str, name: str) -> None:
        self.kubectl("-n", namespace, "rollout", "status", f"{kind}/{name}", "--timeout=180s")

    def logs(self, name: str) -> str:
        return (self.directory / "logs" / f"{name}.log").read_text(errors="replace")


def wait_for(what: str, condition: Callable[[], Any], seconds: float = 120) -> Any:
    """condition's first true value, or a failure naming what never came."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:.0f} s (last: {value!r})")
        time.sleep(1)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    directory = Path(os.environ["GPUCLASS_E2E_DIR"])
    tools = Path(os.environ["GPUCLASS_TESTENV_CACHE"])
    return Cluster(directory, tools)


# --- what the cluster needs (step 1) and the image (step 2) ---------------------------------


@pytest.fixture(scope="session")
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
def image_on_node(cluster: Cluster, pytestconfig: pytest.Config) -> None:
    """Step 2, "as a file": docker save, then ctr import on the node."""
    tag: str = pytestconfig.getoption("--e2e-image")
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


@pytest.fixture(scope="session")
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
