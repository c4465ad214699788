"""A real Kubernetes control plane for the tests, the way envtest does it: etcd and kube-apiserver
started on loopback, with no kubelet, no controller-manager and no containers.

The binaries come from `make tools` (testenv/build.sh), on PATH; their command lines from
testenv/controlplane.py, which the e2e cluster starts its own with. The API server serves
HTTPS with a certificate made here (trustme), authenticates an admin through a static token file,
authorizes with RBAC, and signs service-account tokens (TokenRequest works; the chart's RBAC is
tested with a real token of its ServiceAccount)."""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import trustme
import yaml

from testenv.controlplane import ApiServer, etcd_command, start, stop, wait_ready
from tests.live import free_port

MANIFESTS = Path(__file__).parent / "manifests"


def manifests(name: str) -> list[dict[str, Any]]:
    """The documents of one of tests/manifests/ (CRDs the suite applies)."""
    documents: list[dict[str, Any]] = yaml.safe_load((MANIFESTS / name).read_text())["documents"]
    return documents


ADMIN_TOKEN = "admin-token-for-tests"
STARTUP_SECONDS = 90


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: `make tools` builds it (make test does this)")
    return path


@dataclass
class ControlPlane:
    url: str
    ca_file: Path
    kubeconfig: Path
    workdir: Path

    def request(
        self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN, **kwargs: Any
    ) -> requests.Response:
        # verify per request: a session's verify loses to REQUESTS_CA_BUNDLE from the environment
        headers = {"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
        return requests.request(
            method,
            self.url + path,
            json=body,
            headers=headers,
            verify=str(self.ca_file),
            timeout=30,
            **kwargs,
        )

    def apply(self, *documents: dict[str, Any]) -> None:
        """Create each object, or replace it when it exists (admin)."""
        for document in documents:
            path = collection_path(document)
            name = document["metadata"]["name"]
            created = self.request("POST", path, document)
            if created.status_code == 409:
                current = self.request("GET", f"{path}/{name}").json()
                document = dict(document)
                document["metadata"] = dict(
                    document["metadata"], resourceVersion=current["metadata"]["resourceVersion"]
                )
                created = self.request("PUT", f"{path}/{name}", document)
            assert created.status_code in (200, 201), created.text
            if document["kind"] == "CustomResourceDefinition":
                self.wait_established(name)

    def wait_established(self, crd: str) -> None:
        """Until the new resource is listed: Established comes before discovery, and a fresh
        resource's storage answers 429 while it initializes."""
        definition = self.request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
        ).json()["spec"]
        version = next(v["name"] for v in definition["versions"] if v.get("storage"))
        collection = f"/apis/{definition['group']}/{version}/{definition['names']['plural']}"
        deadline = time.monotonic() + 30
        while self.request("GET", collection).status_code != 200:
            assert time.monotonic() < deadline, f"CRD {crd} not served"
            time.sleep(0.2)

    def delete(self, path: str, wait: bool = True) -> None:
        response = self.request("DELETE", path)
        assert response.status_code in (200, 202, 404), response.text
        deadline = time.monotonic() + 60
        while wait and self.request("GET", path).status_code != 404:
            assert time.monotonic() < deadline, f"{path} not deleted"
            time.sleep(0.2)

    def service_account_token(self, namespace: str, name: str) -> str:
        """A real token of the ServiceAccount, through the TokenRequest API."""
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        response = self.request("POST", path, {"spec": {"expirationSeconds": 3600}})
        assert response.status_code == 201, response.text
        token: str = response.json()["status"]["token"]
        return token

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}},
            }
        )


# Resources whose plural is not the lower-cased kind plus "s".
_PLURALS = {
    "CustomResourceDefinition": "customresourcedefinitions",
    "GPUClass": "gpuclasses",
    "KubernetesNodes": "kubernetesnodeses",
    "Kubernetes": "kuberneteses",
    "VirtualMachineClusterInstancetype": "virtualmachineclusterinstancetypes",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
}
_CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
    "GPUClass",
    "VirtualMachineClusterInstancetype",
    "CompositeController",
    "DecoratorController",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def collection_path(document: dict[str, Any]) -> str:
    """The REST collection of an object: /api/v1/... for core kinds, /apis/<gv>/... otherwise."""
    api_version, kind = document["apiVersion"], document["kind"]
    plural = _PLURALS.get(kind, kind.lower() + "s")
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if kind in _CLUSTER_SCOPED:
        return f"{base}/{plural}"
    namespace = document["metadata"].get("namespace", "default")
    return f"{base}/namespaces/{namespace}/{plural}"


def object_path(document: dict[str, Any]) -> str:
    return f"{collection_path(document)}/{document['metadata']['name']}"


def answers(url: str, **kwargs: Any) -> Callable[[], bool]:
    """A probe: a GET of `url` answered 200."""

    def probe() -> bool:
        try:
            return requests.get(url, timeout=2, **kwargs).status_code == 200
        except requests.RequestException:
            return False

    return probe


@contextmanager
def control_plane(workdir: Path) -> Iterator[ControlPlane]:
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    ca = trustme.CA()
    serving = ca.issue_cert("127.0.0.1", "localhost")
    signing = ca.issue_cert("service-accounts")
    files = {name: workdir / name for name in ("ca.crt", "tls.crt", "tls.key", "sa.key")}
    ca.cert_pem.write_to_path(str(files["ca.crt"]))
    serving.cert_chain_pems[0].write_to_path(str(files["tls.crt"]))
    serving.private_key_pem.write_to_path(str(files["tls.key"]))
    signing.private_key_pem.write_to_path(str(files["sa.key"]))
    tokens = workdir / "tokens.csv"
    tokens.write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')

    etcd_log = workdir / "etcd.log"
    etcd = start(
        etcd_command(binary("etcd"), workdir / "etcd", etcd_port, peer_port, fsync=False), etcd_log
    )
    apiserver: subprocess.Popen[bytes] | None = None
    try:
        etcd_health = answers(f"http://127.0.0.1:{etcd_port}/health")
        wait_ready("etcd", etcd_health, etcd_log, STARTUP_SECONDS, etcd)
        api_log = workdir / "kube-apiserver.log"
        apiserver = start(
            ApiServer(
                binary("kube-apiserver"),
                etcd_client_port=etcd_port,
                bind_address="127.0.0.1",
                advertise_address="127.0.0.1",
                secure_port=api_port,
                service_cidr="10.96.0.0/24",
                tls_cert=files["tls.crt"],
                tls_key=files["tls.key"],
                token_file=tokens,
                service_account_key=files["sa.key"],
                extra=(
                    f"--cert-dir={workdir / 'certs'}",
                    "--disable-admission-plugins=ServiceAccount",
                    # DeviceTaintRules, beta and off by default: DRA classes read them where served.
                    "--runtime-config=resource.k8s.io/v1beta2=true",
                    "--feature-gates=DRADeviceTaintRules=true",
                ),
            ).command(),
            api_log,
        )
        url = f"https://127.0.0.1:{api_port}"
        api_ready = answers(
            f"{url}/readyz",
            verify=str(files["ca.crt"]),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        wait_ready("kube-apiserver", api_ready, api_log, STARTUP_SECONDS, apiserver)
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {
                                "server": url,
                                "certificate-authority-data": base64.b64encode(
                                    files["ca.crt"].read_bytes()
                                ).decode(),
                            },
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
                    "current-context": "test",
                }
            )
        )
        kubeconfig.chmod(0o600)
        yield ControlPlane(url, files["ca.crt"], kubeconfig, workdir)
    finally:
        if apiserver is not None:
            stop(apiserver)
        stop(etcd)
