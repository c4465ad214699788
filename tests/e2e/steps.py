"""The steps of docs/install.md and docs/operating.md as the cluster tests run them: the
document's own shell blocks, and the objects a Cozystack cluster holds that the hooks read."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from release.release import oci_archive
from tests.builders import SOURCE_NAME, SOURCE_NS, TOKEN_KEY
from tests.e2e.cluster import CHART, GPU, GPU_NODE_TAINT, NAMESPACE, RELEASE, Cluster

INSTALL = Path(__file__).parent.parent.parent / "docs" / "install.md"
OPERATING = INSTALL.parent / "operating.md"
COZYSTACK = INSTALL.parent / "cozystack.md"
IMAGE = "docker.io/library/gpuclass-hooks"
IMAGE_TAG = "dev"  # --e2e-image's tag, under which image_on_node imports it
LICENSE_RESYNC_SECONDS = 300  # the chart's controllers.licenseResyncPeriodSeconds


def doc_block(after: str, document: Path = INSTALL, language: str = "sh") -> str:
    """The first block of this language (a shell block by default) of the document
    (docs/install.md) after the line that holds `after`."""
    text = document.read_text()
    start = text.index(after)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, start)
    assert match is not None, f"no {language} block after {after!r} in {document.name}"
    return match.group(1)


def import_image(cluster: Cluster, tag: str, workdir: Path) -> str:
    """The Docker image `tag` imported on the node as `make release` writes it (an OCI archive),
    under its tag and under its digest, which this returns."""
    archive = workdir / "image.oci.tar"
    digest = oci_archive(tag, archive)
    repository = f"docker.io/library/{tag.rpartition(':')[0]}"
    cluster.ctr(
        "images", "import", f"--base-name={repository}", "--digests", str(archive), timeout=600
    )
    listed = cluster.ctr("images", "ls", "-q").stdout.split()
    assert f"docker.io/library/{tag}" in listed and f"{repository}@{digest}" in listed
    return digest


def image_digest(cluster: Cluster) -> str:
    """The digest of the hooks' image on the node (its manifest's, as `make release` prints it)."""
    listed = cluster.ctr("images", "ls", f"name=={IMAGE}:{IMAGE_TAG}").stdout.splitlines()
    assert len(listed) == 2, listed
    return listed[1].split()[2]


def with_image(block: str, digest: str) -> str:
    """Each `helm install` and `helm upgrade` of the chart, with the image loaded into the node
    pinned by its digest as docs/install.md recommends, waiting until the release's pods are
    Ready."""
    flags = (
        f"--set image.repository={IMAGE} --set image.digest={digest} "
        "--set image.pullPolicy=Never --wait --timeout=180s"
    )
    return re.sub(
        r"(helm (?:install|upgrade) gpuclass-hooks \./metacontroller[^\n]*?)(\s*)$",
        lambda m: f"{m.group(1)} {flags}{m.group(2)}",
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


def install_with_cert_manager(cluster: Cluster, workdir: Path) -> None:
    """Step 3's install with cert-manager, as written, from the image on the node."""
    block = doc_block("With cert-manager:").replace(
        '--set image.repository=registry.example.com/gpuclass-hooks --set image.digest="$DIGEST"',
        "",
    )
    run_block(cluster, with_image(block, image_digest(cluster)), workdir)
    cluster.rollout("deployment", NAMESPACE, RELEASE)


def remove_release(cluster: Cluster) -> None:
    """No release, no namespace of it and no copy left, whatever an earlier test left."""
    if cluster.helm("status", RELEASE, "--namespace", NAMESPACE, check=False).returncode == 0:
        cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=180s")
    cluster.kubectl("delete", "secrets", "--all-namespaces", "-l", COPY_LABEL)
    cluster.kubectl(
        "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=180s"
    )


def helm_test(cluster: Cluster) -> str:
    """`helm test`'s output; when it fails, with the check's own lines, so that the failure says
    what the pod saw (a passed test's pod is deleted, so `helm test --logs` cannot be used)."""
    done = cluster.helm("test", RELEASE, "--namespace", NAMESPACE, "--timeout=180s", check=False)
    if done.returncode != 0:
        pod = cluster.kubectl("logs", f"{RELEASE}-test", "--namespace", NAMESPACE, check=False)
        raise AssertionError(f"helm test failed:\n{done.stdout}{done.stderr}\n{pod.stdout}")
    return done.stdout


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
                # every taint Cozystack's GPU nodes carry under this key, whatever its effect
                "tolerations": [{"key": GPU_NODE_TAINT, "operator": "Exists"}],
                "license": {"secretRef": {"name": SOURCE_NAME}, "featureType": 1},
            },
        },
    )


COPY = "gpuclass-l40s-license"
COPY_LABEL = "gpuclass.cozystack.io/license-copy=true"


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
