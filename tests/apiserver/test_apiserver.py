"""Against a real kube-apiserver (1.36) and etcd, started by the tests (tests/controlplane.py):
the chart installed with helm, the GPUClass CRD's validation and printer columns, the chart's
RBAC with a real ServiceAccount token, the KubeVirt read, the budget webhook called by the API
server itself, and status writes the way Metacontroller makes them.

A fake answers what its author believed; the API server prunes unknown fields, runs CEL, enforces
RBAC and calls webhooks only over verified HTTPS.
"""

from __future__ import annotations

import base64
import copy
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trustme
import yaml

from hooks.kubeapi.budget import HELMRELEASES, TENANCY_SELECTOR, BudgetReader
from hooks.kubeapi.client import ApiClient
from hooks.kubeapi.kubevirt import KubeVirtReader
from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.tenancy import App, Tenancy, Tenant
from hooks.rules.permitted_devices import KubeVirtAbsent, KubeVirtFound, KubeVirtUnreadable
from hooks.serving.app import create_app
from hooks.settings import Settings
from hooks.wire.kube import KubeVirt
from tests import ROOT, cozystack
from tests.builders import GPU, app_object, gpus, helmrelease, node, status_sync_request
from tests.chart import CHART, PLAIN, helm, render
from tests.controlplane import (
    ADMIN_TOKEN,
    ControlPlane,
    binary,
    collection_path,
    control_plane,
    manifests,
    object_path,
)
from tests.live import LiveServer, live_server
from tests.rules.budget import check_app, vm

# Starts etcd and kube-apiserver (`make tools`).

RELEASE, NAMESPACE = "gpu", "cozy-gpu"
FULLNAME = "gpu-gpuclass-hooks"
KUBEVIRT_NAMESPACE = "cozy-kubevirt"
GPUCLASSES = "/apis/cozystack.io/v1alpha1/gpuclasses"
TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1"


def differences(expected: Any, actual: Any, path: str = "", omitempty: bool = False) -> list[str]:
    """Where the stored object lacks or changed what was written (defaults it added are fine).

    With `omitempty` (built-in kinds, whose Go types drop empty optional strings when they store
    them), a missing field that was written as "" is the same field; custom resources keep "".
    """
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: {actual!r} is not a map"]
        found = []
        for key, value in expected.items():
            if key in actual:
                found += differences(value, actual[key], f"{path}.{key}", omitempty)
            elif not (omitempty and value == ""):
                found.append(f"{path}.{key}: pruned")
        return found
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: {actual!r} is not {expected!r}"]
        return [
            difference
            for index, (item, stored) in enumerate(zip(expected, actual, strict=True))
            for difference in differences(item, stored, f"{path}[{index}]", omitempty)
        ]
    return [] if expected == actual else [f"{path}: {actual!r} is not {expected!r}"]


# --- the chart, installed -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def hook_pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The hooks' serving certificate (for 127.0.0.1) and its CA."""
    directory = tmp_path_factory.mktemp("hook-pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", f"{FULLNAME}.{NAMESPACE}.svc")
    paths = {name: directory / name for name in ("ca.crt", "tls.crt", "tls.key")}
    ca.cert_pem.write_to_path(str(paths["ca.crt"]))
    server.cert_chain_pems[0].write_to_path(str(paths["tls.crt"]))
    server.private_key_pem.write_to_path(str(paths["tls.key"]))
    return paths


def tls_secret(namespace: str, name: str, files: dict[str, bytes]) -> dict[str, Any]:
    """A kubernetes.io/tls Secret holding these keys (tls.crt, tls.key, ca.crt)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace},
        "data": {key: base64.b64encode(value).decode() for key, value in files.items()},
    }


def pki_files(paths: dict[str, Path]) -> dict[str, bytes]:
    return {key: path.read_bytes() for key, path in paths.items()}


LOOPBACK_API_SERVER = "networkPolicy.apiServerCIDRs={127.0.0.1/32}"
INSTALL_VALUES = (
    "tls.enabled=true",
    "tls.certManager.enabled=false",
    f"tls.existingSecret={FULLNAME}-tls",
    "auth.enabled=true",
    "admission.enabled=true",
    "gpuOperator.variant=vgpu",
    # what the render's lookup reads on a cluster: this API server, on loopback, has no endpoints
    LOOPBACK_API_SERVER,
)


@pytest.fixture(scope="module")
def installed(kube: ControlPlane, hook_pki: dict[str, Path]) -> list[dict[str, Any]]:
    """`helm install` of the chart (TLS from an existing Secret, bearer auth, the admission
    webhook) after Metacontroller's CRDs; the objects helm created, as it rendered them."""
    kube.apply(*manifests("metacontroller-crds.yaml"))
    kube.namespace(NAMESPACE)
    kube.apply(tls_secret(NAMESPACE, f"{FULLNAME}-tls", pki_files(hook_pki)))
    command = [helm(), "install", RELEASE, str(CHART), "--namespace", NAMESPACE]
    command += ["--kubeconfig", str(kube.kubeconfig)]
    for value in INSTALL_VALUES:
        command += ["--set", value]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    kube.wait_established("gpuclasses.cozystack.io")  # helm does not wait for a CRD to be served
    return helm_get("manifest", kube, RELEASE, NAMESPACE)


def test_on_a_cluster_without_cert_manager_the_defaults_refuse_naming_what_to_set(
    kube: ControlPlane,
) -> None:
    """Read from the cluster (this API server serves no cert-manager.io/v1), the defaults have no
    serving certificate: the render refuses and says what to install or set. Only a render that
    reads no cluster at all assumes cert-manager (tests/chart)."""
    command = [helm(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    command += ["--dry-run=server", "--kubeconfig", str(kube.kubeconfig)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "install cert-manager" in result.stderr and "tls.existingSecret" in result.stderr


def helm_get(what: str, kube: ControlPlane, release: str, namespace: str) -> list[dict[str, Any]]:
    """`helm get manifest|hooks` of a release: the objects as helm rendered them."""
    rendered = subprocess.run(
        [helm(), "get", what, release, "-n", namespace, "--kubeconfig", str(kube.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [document for document in yaml.safe_load_all(rendered) if document]


def test_helm_install_every_object_stored_as_written(
    kube: ControlPlane, installed: list[dict[str, Any]]
) -> None:
    kinds = sorted({document["kind"] for document in installed})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CompositeController",
        "CustomResourceDefinition",
        "DecoratorController",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "ServiceAccount",
        # this API server serves DRA: the policy on Metacontroller's DeviceClasses
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
    ]
    for document in installed:
        located = {**document, "metadata": {"namespace": NAMESPACE, **document["metadata"]}}
        stored = kube.request("GET", object_path(located))
        assert stored.status_code == 200, (document["kind"], stored.text)
        custom = document["apiVersion"].startswith("metacontroller.k8s.io/")
        assert differences(document, stored.json(), omitempty=not custom) == [], document["kind"]
    [policy] = [d for d in installed if d["kind"] == "NetworkPolicy"]
    # the API server's address, as the render's lookup read it from its EndpointSlice
    api_servers = [
        p["ipBlock"]["cidr"]
        for r in policy["spec"]["ingress"]
        for p in r.get("from", [])
        if "ipBlock" in p
    ]
    assert api_servers == ["127.0.0.1/32"]  # as given: loopback has no EndpointSlice to read
    crd = yaml.safe_load((CHART / "files" / "gpuclasses.cozystack.io.yaml").read_text())
    stored_crd = kube.request(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
    ).json()
    assert differences(crd["spec"], stored_crd["spec"]) == []


def test_controllers_keep_their_hooks_credentials_included(
    kube: ControlPlane, installed: list[dict[str, Any]]
) -> None:
    for rendered in [d for d in installed if d["kind"].endswith("Controller")]:
        stored = kube.request("GET", object_path(rendered)).json()
        assert stored["spec"]["hooks"] == rendered["spec"]["hooks"]
        for hook in stored["spec"]["hooks"].values():
            webhook = hook["webhook"]
            assert hook["version"] == "v2"
            assert webhook["authorization"]["secretRef"]["name"] == f"{FULLNAME}-hook-token"
            assert webhook["caBundle"]["secretRef"] == {
                "name": f"{FULLNAME}-tls",
                "namespace": NAMESPACE,
                "key": "ca.crt",
            }
    [webhooks] = [d for d in installed if d["kind"] == "ValidatingWebhookConfiguration"]
    # helm's lookup read the CA bundle from the existing Secret in the cluster
    ca = base64.b64decode(webhooks["webhooks"][0]["clientConfig"]["caBundle"])
    assert b"BEGIN CERTIFICATE" in ca


# --- the GPUClass CRD ---------------------------------------------------------------------------


def documented_classes() -> list[dict[str, Any]]:
    """The GPUClasses of docs/gpuclass.md (the first with and without its license), and the
    example cluster's classes."""
    blocks = [
        yaml.safe_load(block.split("```", 1)[0])
        for block in (ROOT / "docs" / "gpuclass.md").read_text().split("```yaml\n")[1:]
    ]
    example, dra = [b for b in blocks if isinstance(b, dict) and b.get("kind") == "GPUClass"]
    [license_block] = [b for b in blocks if isinstance(b, dict) and set(b) == {"spec"}]
    example.pop("status")
    dra.pop("status")
    licensed = copy.deepcopy(example)
    licensed["metadata"]["name"] = "l40s-24q-licensed"
    licensed["spec"].update(license_block["spec"])
    classes = [example, licensed, dra]
    for item in yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())["items"]:
        if item["kind"] == "GPUClass":
            item["metadata"] = {"name": "cluster-" + item["metadata"]["name"]}
            classes.append(item)
    return classes


def test_crd_accepts_the_documented_examples(
    kube: ControlPlane, installed: list[dict[str, Any]]
) -> None:
    for gpuclass in documented_classes():
        response = kube.request("POST", GPUCLASSES, gpuclass)
        assert response.status_code == 201, response.text
        kube.delete(f"{GPUCLASSES}/{gpuclass['metadata']['name']}", wait=False)


def refused(kube: ControlPlane, gpuclass: dict[str, Any]) -> str:
    response = kube.request("POST", GPUCLASSES, gpuclass)
    assert response.status_code == 422, response.text
    message: str = response.json()["message"]
    return message


def a_class(name: str = "probe", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": name},
        "spec": {"resourceName": GPU, **spec},
    }


def test_crd_cel_rules_refuse_what_they_must(
    kube: ControlPlane, installed: list[dict[str, Any]]
) -> None:
    license = {"secretRef": {"name": "nvidia-license"}}
    assert "DNS-1123 label of at most 63 characters" in refused(kube, a_class("a" * 64))
    assert "kubernetes.io domain" in refused(kube, a_class(resourceName="kubernetes.io/gpu"))
    assert "kubernetes.io domain" in refused(kube, a_class(resourceName="node.kubernetes.io/gpu"))
    assert "must not start with requests." in refused(
        kube, a_class(resourceName="requests.nvidia.com/gpu")
    )
    assert "gridd.conf is generated" in refused(
        kube, a_class(license={"secretRef": {"name": "n", "key": "gridd.conf"}})
    )
    assert "empty key requires operator Exists" in refused(
        kube, a_class(tolerations=[{"operator": "Equal", "value": "x"}])
    )
    for feature_type in (0, 3, 5):
        message = refused(kube, a_class(license={**license, "featureType": feature_type}))
        assert "featureType" in message and "supported values" in message
    # the boundaries are accepted: 63 characters, an empty key with Exists
    for ok in (a_class("a" * 63), a_class("wildcard", tolerations=[{"operator": "Exists"}])):
        assert kube.request("POST", GPUCLASSES, ok).status_code == 201
        kube.delete(f"{GPUCLASSES}/{ok['metadata']['name']}", wait=False)


def test_a_class_resource_name_cannot_change(
    kube: ControlPlane, installed: list[dict[str, Any]]
) -> None:
    """Budgets count devices under the class their resource maps to: a class whose resource
    changed would drop the devices its VMs hold from its key (docs/gpuclass.md). Its other
    fields stay editable."""
    created = kube.request("POST", GPUCLASSES, a_class("fixed"))
    assert created.status_code == 201, created.text
    try:
        stored = created.json()
        moved = {**stored, "spec": {**stored["spec"], "resourceName": "nvidia.com/OTHER"}}
        refused_change = kube.request("PUT", f"{GPUCLASSES}/fixed", moved)
        assert refused_change.status_code == 422, refused_change.text
        assert "resourceName is immutable" in refused_change.text
        renamed = {**stored, "spec": {**stored["spec"], "displayName": "renamed"}}
        assert kube.request("PUT", f"{GPUCLASSES}/fixed", renamed).status_code == 200
    finally:
        kube.delete(f"{GPUCLASSES}/fixed", wait=False)


def a_dra_class(name: str = "dra", **dra: Any) -> dict[str, Any]:
    spec = {"driver": "gpu.nvidia.com", "attributes": {"type": "vfio"}, **dra}
    return {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": name},
        "spec": {"dra": spec},
    }


def test_crd_a_class_is_backed_by_exactly_one_of_resource_name_and_dra(
    kube: ControlPlane, installed: list[dict[str, Any]]
) -> None:
    both = a_dra_class()
    both["spec"]["resourceName"] = GPU
    neither = {**a_class(), "spec": {"displayName": "x"}}
    for wrong in (both, neither):
        assert "exactly one of resourceName and dra" in refused(kube, wrong)
    licensed = a_dra_class()
    licensed["spec"]["license"] = {"secretRef": {"name": "nvidia-license"}}
    assert "takes no license" in refused(kube, licensed)


def test_crd_dra_attributes_are_driver_attribute_equalities(
    kube: ControlPlane, installed: list[dict[str, Any]]
) -> None:
    refusals = [
        ({"driver": "Not_A_Subdomain"}, "driver"),
        ({"attributes": {}}, "attributes"),
        ({"attributes": {f"a{i}": "x" for i in range(9)}}, "attributes"),
        ({"attributes": {"9lives": "x"}}, "C identifier"),
        ({"attributes": {"Bad_Domain/type": "x"}}, "C identifier"),
        ({"attributes": {"a" * 33: "x"}}, "C identifier"),
        ({"attributes": {"type": "x" * 65}}, "at most 64 characters"),
        ({"attributes": {"type": {"nested": 1}}}, "attributes.type"),
        ({"attributes": {"type": True}}, "attributes.type"),
    ]
    for dra, message in refusals:
        assert message in refused(kube, a_dra_class(**dra)), dra
    accepted = a_dra_class(
        "dra-ok",
        attributes={"type": "x" * 64, "index": 0, "resource.kubernetes.io/n": "a"},
    )
    created = kube.request("POST", GPUCLASSES, accepted)
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["dra"] == accepted["spec"]["dra"]
    kube.delete(f"{GPUCLASSES}/dra-ok", wait=False)


def test_a_class_dra_cannot_change_nor_its_backing(
    kube: ControlPlane, installed: list[dict[str, Any]]
) -> None:
    """Budgets count a DRA class's devices under its key as they count a resource's: its devices
    cannot change under held VMs, nor can it become a device-plugin class."""
    created = kube.request("POST", GPUCLASSES, a_dra_class("fixed-dra"))
    assert created.status_code == 201, created.text
    try:
        stored = created.json()
        other = {
            **stored,
            "spec": {"dra": {**stored["spec"]["dra"], "attributes": {"type": "gpu"}}},
        }
        moved = {**stored, "spec": {"resourceName": GPU}}
        for change, message in ((other, "dra is immutable"), (moved, "cannot change between")):
            response = kube.request("PUT", f"{GPUCLASSES}/fixed-dra", change)
            assert response.status_code == 422, response.text
            assert message in response.text
        renamed = {**stored, "spec": {**stored["spec"], "displayName": "renamed"}}
        assert kube.request("PUT", f"{GPUCLASSES}/fixed-dra", renamed).status_code == 200
    finally:
        kube.delete(f"{GPUCLASSES}/fixed-dra", wait=False)


# --- status, the way Metacontroller writes it ----------------------------------------------------


@pytest.fixture
def stored_class(kube: ControlPlane, installed: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    created = kube.request("POST", GPUCLASSES, a_class("stored", displayName="L40S"))
    assert created.status_code == 201, created.text
    yield created.json()
    kube.delete(f"{GPUCLASSES}/stored")


class Permitted:
    """The KubeVirt read has its own test; here the status only needs the class permitted."""

    def view(self) -> KubeVirtFound:
        devices = {"mediatedDevices": [{"resourceName": GPU}]}
        cr = {"spec": {"configuration": {"permittedHostDevices": devices}}}
        return KubeVirtFound(msgspec.convert(cr, KubeVirt), f"{KUBEVIRT_NAMESPACE}/kubevirt")


def test_status_written_to_the_subresource_reads_back_identical(
    kube: ControlPlane, stored_class: dict[str, Any]
) -> None:
    app = create_app(
        Settings(),
        kubevirt=Permitted(),  # type: ignore[arg-type]
        clock=lambda: datetime(2026, 12, 1, tzinfo=UTC),
    )
    request = status_sync_request(stored_class, nodes=[node("gpu-1", gpus=4)])
    status = app.test_client().post("/status/sync", json=request).json["status"]
    assert status["free"] == 4 and status["maxFreePerNode"] == 4
    assert [c["type"] for c in status["conditions"]][-1] == "Ready"
    # Metacontroller injects observedGeneration, then PUTs the status subresource.
    written = {**stored_class, "status": {**status, "observedGeneration": 1}}
    response = kube.request("PUT", f"{GPUCLASSES}/stored/status", written)
    assert response.status_code == 200, response.text
    assert kube.request("GET", f"{GPUCLASSES}/stored").json()["status"] == written["status"]


def test_printer_columns_render(kube: ControlPlane, stored_class: dict[str, Any]) -> None:
    status = {"free": 6, "maxFreePerNode": 2, "conditions": [
        {"type": "Ready", "status": "True", "reason": "Ready", "message": "",
         "lastTransitionTime": "2026-12-01T00:00:00Z", "observedGeneration": 1}]}  # fmt: skip
    written = {**stored_class, "status": status}
    assert kube.request("PUT", f"{GPUCLASSES}/stored/status", written).status_code == 200
    table = kube.request("GET", f"{GPUCLASSES}/stored", headers={"Accept": TABLE}).json()
    columns = [(c["name"], c["priority"]) for c in table["columnDefinitions"]]
    assert columns == [
        ("Name", 0),
        ("Resource", 0),
        ("DeviceClass", 0),
        ("Free", 0),
        ("MaxPerNode", 0),
        ("Ready", 0),
        ("Age", 0),
        ("License", 1),
    ]
    [row] = table["rows"]
    assert row["cells"][:6] == ["stored", GPU, None, 6, 2, "True"]


# --- RBAC, with a real token of the chart's ServiceAccount -------------------------------------


def ensure_kubevirt(kube: ControlPlane) -> None:
    kube.apply(*manifests("kubevirt-crd.yaml"))
    kube.namespace(KUBEVIRT_NAMESPACE)
    for name in ("kubevirt", "other"):
        kube.apply(
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "KubeVirt",
                "metadata": {"name": name, "namespace": KUBEVIRT_NAMESPACE},
                "spec": {
                    "configuration": {
                        "permittedHostDevices": {"mediatedDevices": [{"resourceName": GPU}]}
                    }
                },
            }
        )


@pytest.fixture(scope="module")
def chart_token(kube: ControlPlane, installed: list[dict[str, Any]]) -> str:
    return kube.service_account_token(NAMESPACE, FULLNAME)


def test_chart_rbac_kubevirt_read_is_the_configured_object_only(
    kube: ControlPlane, chart_token: str
) -> None:
    ensure_kubevirt(kube)
    kubevirts = f"/apis/kubevirt.io/v1/namespaces/{KUBEVIRT_NAMESPACE}/kubevirts"
    assert kube.request("GET", f"{kubevirts}/kubevirt", token=chart_token).status_code == 200
    assert kube.request("GET", f"{kubevirts}/other", token=chart_token).status_code == 403
    assert kube.request("GET", kubevirts, token=chart_token).status_code == 403


def test_chart_rbac_admission_lists_what_it_reads_and_nothing_else(
    kube: ControlPlane, chart_token: str
) -> None:
    kube.apply(*cozystack.app_crds(), *manifests("kubevirt-crd.yaml"))
    helmreleases = "/apis/helm.toolkit.fluxcd.io/v2/helmreleases"
    instance_types = "/apis/instancetype.kubevirt.io/v1beta1/virtualmachineclusterinstancetypes"
    for readable in (GPUCLASSES, helmreleases, instance_types):
        assert kube.request("GET", readable, token=chart_token).status_code == 200, readable
    # a class, by name, as every authenticated user may read it (classReaders)
    assert kube.request("GET", f"{GPUCLASSES}/any", token=chart_token).status_code == 404
    forbidden = [
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/{FULLNAME}-tls"),
        ("GET", "/api/v1/secrets"),
        ("GET", "/api/v1/pods"),
        ("GET", "/api/v1/nodes"),
        ("GET", "/api/v1/namespaces"),
        ("GET", f"{helmreleases}?watch=true"),
        ("GET", f"{instance_types}/gn1.xlarge"),
        ("DELETE", f"{GPUCLASSES}/any"),
        ("POST", "/apis/helm.toolkit.fluxcd.io/v2/namespaces/default/helmreleases"),
        ("GET", "/apis/apps.cozystack.io/v1alpha1/tenants"),
    ]
    for method, path in forbidden:
        response = kube.request(method, path, {} if method == "POST" else None, token=chart_token)
        assert response.status_code == 403, (method, path, response.status_code)


# --- the KubeVirt reader against the real server -------------------------------------------------


def test_kubevirt_reader_outcomes(kube: ControlPlane, chart_token: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(chart_token)

    def read(name: str = "kubevirt", token: Path = token_file) -> Any:
        settings = Settings(
            kube_api=kube.url,
            kube_token_file=token,
            kube_ca_file=kube.ca_file,
            kubevirt_name=name,
            kubevirt_cache_seconds=0,
        )
        return KubeVirtReader(settings).view()

    kube.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/kubevirts.kubevirt.io")
    assert read() == KubeVirtAbsent(f"{KUBEVIRT_NAMESPACE}/kubevirt")  # the API is not served
    kube.apply(*manifests("kubevirt-crd.yaml"))
    kube.namespace(KUBEVIRT_NAMESPACE)
    assert read() == KubeVirtAbsent(f"{KUBEVIRT_NAMESPACE}/kubevirt")  # served, no object
    ensure_kubevirt(kube)
    found = read()
    assert isinstance(found, KubeVirtFound)
    devices = found.kubevirt.spec.configuration.permitted_host_devices
    assert [d.resource_name for d in devices.mediated_devices] == [GPU]
    forbidden = read("other")  # RBAC grants the configured name only
    assert forbidden == KubeVirtUnreadable("HTTP 403")
    stranger = tmp_path / "stranger"
    stranger.write_text("not-a-token")
    unauthenticated = read(token=stranger)
    assert unauthenticated == KubeVirtUnreadable("HTTP 401")


# --- the budget webhook, called by the API server ------------------------------------------------


@pytest.fixture(scope="module")
def webhook_server(
    kube: ControlPlane,
    installed: list[dict[str, Any]],
    chart_token: str,
    hook_pki: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveServer]:
    """The real server (gunicorn, HTTPS) reading the cluster with the chart's ServiceAccount, and
    the chart's ValidatingWebhookConfiguration pointed at it with its CA bundle."""
    directory = tmp_path_factory.mktemp("webhook")
    token_file = directory / "token"
    token_file.write_text(chart_token)
    env = {
        "GPUCLASS_TLS_CERT_FILE": str(hook_pki["tls.crt"]),
        "GPUCLASS_TLS_KEY_FILE": str(hook_pki["tls.key"]),
        "GPUCLASS_KUBE_API": kube.url,
        "GPUCLASS_KUBE_TOKEN_FILE": str(token_file),
        "GPUCLASS_KUBE_CA_FILE": str(kube.ca_file),
    }
    kube.apply(*cozystack.app_crds())
    with live_server(env, directory, scheme="https") as server:
        [configuration] = [d for d in installed if d["kind"] == "ValidatingWebhookConfiguration"]
        configuration = copy.deepcopy(configuration)
        ca_bundle = base64.b64encode(hook_pki["ca.crt"].read_bytes()).decode()
        for webhook in configuration["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"{server.admission}{path}", "caBundle": ca_bundle}
        kube.apply(configuration)
        yield server


def store(kube: ControlPlane, kind: str, namespace: str, name: str, values: dict[str, Any]) -> None:
    """What Cozystack stores for an app: a HelmRelease labelled with its kind and name."""
    kube.apply(helmrelease(kind, namespace, name, values))


@pytest.fixture(scope="module")
def tenants(kube: ControlPlane, webhook_server: LiveServer) -> None:
    """Tenant a (2 devices in all) with the VM render (1 device), and an unbounded tenant u in a."""
    for namespace in ("tenant-root", "tenant-a", "tenant-a-u"):
        kube.namespace(namespace)
    kube.apply(
        {
            "apiVersion": "cozystack.io/v1alpha1",
            "kind": "GPUClass",
            "metadata": {"name": "l40s"},
            "spec": {"resourceName": GPU},
        }
    )
    store(kube, "Tenant", "tenant-root", "a", {"resourceQuotas": {TOTAL_KEY: "2"}})
    store(kube, "Tenant", "tenant-a", "u", {})
    store(kube, "VMInstance", "tenant-a", "render", {"gpus": gpus(GPU)})


def create(kube: ControlPlane, document: dict[str, Any]) -> tuple[int, str]:
    response = kube.request("POST", collection_path(document), document)
    return response.status_code, response.json().get("message", "")


def test_api_server_calls_the_webhook_and_relays_its_verdicts(
    kube: ControlPlane, tenants: None
) -> None:
    assert create(kube, app_object("VMInstance", "tenant-a", "one", {"gpus": gpus(GPU)}))[0] == 201
    store(kube, "VMInstance", "tenant-a", "one", {"gpus": gpus(GPU)})
    code, message = create(kube, app_object("VMInstance", "tenant-a", "two", {"gpus": gpus(GPU)}))
    assert code == 403
    assert message == (
        'admission webhook "gpu-budget.gpuclass.cozystack.io" denied the request: '
        f"{TOTAL_KEY}: this VMInstance needs 1, the pool of tenant a (tenant-a) has 0 left "
        "(budget 2, 0 carved out for sub-tenants, 2 reserved by other apps)"
    )
    code, message = create(
        kube, app_object("KubernetesNodes", "tenant-a-u", "workers", {"gpus": gpus(GPU)})
    )
    assert code == 403 and "this KubernetesNodes needs 10, the pool of tenant a" in message
    empty_pool = app_object(
        "KubernetesNodes", "tenant-a-u", "standby", {"gpus": gpus(GPU), "maxReplicas": 0}
    )
    assert create(kube, empty_pool)[0] == 201
    # a GPU-less VM reads nothing and passes
    assert create(kube, app_object("VMInstance", "tenant-a", "plain", {"gpus": []}))[0] == 201


def test_api_server_relays_the_declaration_gate(kube: ControlPlane, tenants: None) -> None:
    # through an unbounded intermediate tenant, the limit is still a's pool (issue 12, point 2)
    code, message = create(
        kube, app_object("Tenant", "tenant-a-u", "w", {"resourceQuotas": {TOTAL_KEY: "1000"}})
    )
    assert code == 403
    assert message.endswith(
        f"{TOTAL_KEY}: tenant w declares 1000, the pool of tenant a (tenant-a) can give 0 "
        "(budget 2, 0 carved out for other sub-tenants, 2 reserved by apps)"
    )
    code, message = create(
        kube,
        app_object(
            "Tenant",
            "tenant-a",
            "t",
            {"resourceQuotas": {"l40sgpuclass.cozystack.io/devices": "1"}},
        ),
    )
    assert code == 403 and "l40sgpuclass.cozystack.io/devices: not a GPU budget key" in message
    assert create(kube, app_object("Tenant", "tenant-a", "quiet", {"resourceQuotas": {}}))[0] == 201


def test_scoped_reads_give_the_verdicts_of_a_full_list(
    kube: ControlPlane, tenants: None, tmp_path: Path
) -> None:
    """The label selectors and namespaced LISTs of the scoped reads, on the real server: for a
    review in each namespace of a nested tree, the verdict equals the one over every release."""
    for namespace in ("tenant-s", "tenant-s-dev", "tenant-s-lab", "tenant-s-dev-deep"):
        kube.namespace(namespace)
    kube.namespace("tenant-s-lab-e")
    store(kube, "Tenant", "tenant-root", "s", {"resourceQuotas": {TOTAL_KEY: "4"}})
    store(kube, "Tenant", "tenant-s", "dev", {})
    store(kube, "Tenant", "tenant-s", "lab", {"resourceQuotas": {TOTAL_KEY: "3"}})
    store(kube, "Tenant", "tenant-s-dev", "deep", {"resourceQuotas": {TOTAL_KEY: "1"}})
    for namespace in ("tenant-s", "tenant-s-dev", "tenant-s-lab"):
        store(kube, "VMInstance", namespace, "vm", {"gpus": gpus(GPU)})
    nameless = helmrelease("Tenant", "tenant-s-dev", "nameless", {})
    del nameless["metadata"]["labels"]["apps.cozystack.io/application.name"]
    nameless["metadata"]["name"] = "legacy"  # names no tenant: fails closed where it could matter
    kube.apply(nameless)
    # an empty name label, named by its release name: tenant e of tenant-s-lab, bounded
    emptied = helmrelease("Tenant", "tenant-s-lab", "e", {"resourceQuotas": {TOTAL_KEY: "1"}})
    emptied["metadata"]["labels"]["apps.cozystack.io/application.name"] = ""
    kube.apply(emptied)
    token = tmp_path / "token"
    token.write_text(ADMIN_TOKEN)
    settings = Settings(kube_api=kube.url, kube_token_file=token, kube_ca_file=kube.ca_file)
    reader = BudgetReader(settings)
    everything = [
        release_object(raw, settings.platform_values_secret)
        for raw in ApiClient(settings).list(HELMRELEASES, TENANCY_SELECTOR)
    ]
    full = Tenancy(
        tuple(o for o in everything if isinstance(o, Tenant)),
        tuple(o for o in everything if isinstance(o, App)),
    )
    verdicts = []
    messages: list[str] = []
    for namespace in (
        "tenant-s",
        "tenant-s-dev",
        "tenant-s-lab",
        "tenant-s-dev-deep",
        "tenant-s-lab-e",
        "tenant-a",
    ):
        for count in (1, 3):
            new = vm(namespace, "new", *(GPU,) * count)
            scoped = reader.tenancy([namespace])
            verdict = check_app(
                new=new,
                old=None,
                apps=scoped.apps,
                tenants=scoped.tenants,
                catalog=reader.catalog(),
            )
            expected = check_app(
                new=new, old=None, apps=full.apps, tenants=full.tenants, catalog=reader.catalog()
            )
            # the same verdict; what it skipped differs (a full list reads what it does not need)
            assert (verdict.allowed, verdict.message) == (expected.allowed, expected.message)
            verdicts.append(verdict.allowed)
            messages.append(verdict.message)
    assert True in verdicts and False in verdicts, messages  # the tree admits and denies
    # the server's label selection finds the release with an empty name label, placed by its name
    placed = {(t.owned_namespace, t.release) for t in reader.tenancy(["tenant-s-lab-e"]).tenants}
    assert ("tenant-s-lab-e", "tenant-e") in placed


def test_the_helm_test_pod_is_accepted_as_written(
    kube: ControlPlane, installed: list[dict[str, Any]]
) -> None:
    """helm keeps test hooks out of the install; `helm test` creates the Pod (no kubelet runs it
    here: tests/chart/test_helm_test.py runs its command against the live service)."""
    [pod] = [d for d in helm_get("hooks", kube, RELEASE, NAMESPACE) if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    located = {**pod, "metadata": {"namespace": NAMESPACE, **pod["metadata"]}}
    created = kube.request("POST", collection_path(located) + "?dryRun=All", located)
    assert created.status_code == 201, created.text
    assert differences(pod, created.json(), omitempty=True) == []


@pytest.mark.tools
def test_upgrade_from_the_plain_defaults_in_the_documented_order(
    hook_pki: dict[str, Path], tmp_path: Path
) -> None:
    """docs/install.md, "From an install with the old plain defaults": an install with TLS and
    auth off, then TLS, then the token, then admission, each a `helm upgrade --reuse-values` the
    API server accepts; the token generated at the third step is the one the fourth keeps. On a
    control plane of its own: the chart's controllers are cluster-wide, one release at a time."""
    with control_plane(tmp_path) as kube:
        walk_the_upgrade(kube, hook_pki)


def walk_the_upgrade(kube: ControlPlane, hook_pki: dict[str, Path]) -> None:
    release, namespace = "walk", "cozy-gpu-walk"
    fullname = f"{release}-gpuclass-hooks"
    kube.apply(*manifests("metacontroller-crds.yaml"))
    kube.namespace(namespace)
    kube.apply(tls_secret(namespace, f"{fullname}-tls", pki_files(hook_pki)))
    steps = [
        ("install", (*PLAIN, LOOPBACK_API_SERVER)),
        ("upgrade", ("tls.enabled=true", f"tls.existingSecret={fullname}-tls")),
        ("upgrade", ("auth.enabled=true",)),
        ("upgrade", ("admission.enabled=true",)),
    ]
    base = ["--namespace", namespace, "--kubeconfig", str(kube.kubeconfig)]

    def webhooks() -> list[dict[str, Any]]:
        documents = helm_get("manifest", kube, release, namespace)
        return [
            hook["webhook"]
            for d in documents
            if d["kind"].endswith("Controller")
            for hook in d["spec"]["hooks"].values()
        ]

    tokens = []
    try:
        for action, values in steps:
            command = [helm(), action, release, str(CHART), *base]
            command += ["--reuse-values"] if action == "upgrade" else []
            for value in values:
                command += ["--set", value]
            result = subprocess.run(command, capture_output=True, text=True, timeout=180)
            assert result.returncode == 0, (values, result.stderr)
            hooks = webhooks()
            secret = kube.request(
                "GET", f"/api/v1/namespaces/{namespace}/secrets/{fullname}-hook-token"
            )
            tokens.append(secret.json()["data"]["token"] if secret.status_code == 200 else None)
            schemes = {h["url"].split(":")[0] for h in hooks}
            assert schemes == {"http" if action == "install" else "https"}
            assert all(("authorization" in h) == (tokens[-1] is not None) for h in hooks)
        webhook = kube.request(
            "GET",
            f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{fullname}",
        )
        assert webhook.status_code == 200
    finally:
        subprocess.run([helm(), "uninstall", release, *base], capture_output=True, timeout=120)
    assert tokens[0] is None and tokens[1] is None
    assert tokens[2] is not None and tokens[3] == tokens[2]


@pytest.mark.tools
def test_an_upgrade_that_sets_neither_the_gpu_switch_nor_admission_keeps_both(
    hook_pki: dict[str, Path], tmp_path: Path
) -> None:
    """Turning GPU features off deletes every license copy, and budgets are a security control:
    an upgrade without `--reuse-values` that repeats neither `gpu.enabled` nor the variant nor
    `admission.enabled` (only the Secret it must name) keeps GPU features and the webhook, and
    only an explicit word turns either off. On a control plane of its own."""
    release, namespace = "keep", "cozy-gpu-keep"
    fullname = f"{release}-gpuclass-hooks"
    with control_plane(tmp_path) as kube:
        kube.apply(*manifests("metacontroller-crds.yaml"))
        kube.namespace(namespace)
        kube.apply(tls_secret(namespace, f"{fullname}-tls", pki_files(hook_pki)))
        base = ["--namespace", namespace, "--kubeconfig", str(kube.kubeconfig)]
        secret = f"tls.existingSecret={fullname}-tls"
        base += ["--set", LOOPBACK_API_SERVER]

        def webhook() -> int:
            path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
            return kube.request("GET", f"{path}/{fullname}").status_code

        def helm_upgrade(*values: str) -> str:
            command = [helm(), "upgrade", "--install", release, str(CHART), *base]
            for value in values:
                command += ["--set", value]
            result = subprocess.run(command, capture_output=True, text=True, timeout=180)
            assert result.returncode == 0, (values, result.stderr)
            deployment = kube.request(
                "GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{fullname}"
            ).json()
            [env] = [c["env"] for c in deployment["spec"]["template"]["spec"]["containers"]]
            controllers = [
                kube.request("GET", f"/apis/metacontroller.k8s.io/v1alpha1/{kind}/{name}")
                for kind, name in (
                    ("compositecontrollers", "gpuclass-status"),
                    ("decoratorcontrollers", "gpuclass-license"),
                )
            ]
            assert [c.status_code for c in controllers] == [200, 200]
            return next(e["value"] for e in env if e["name"] == "GPUCLASS_ENABLED")

        assert helm_upgrade(secret, "gpuOperator.variant=vgpu") == "true"
        assert helm_upgrade(secret) == "true" and webhook() == 200
        assert helm_upgrade(secret, "gpuOperator.variant=container") == "false"
        assert helm_upgrade(secret, "gpu.enabled=false", "admission.enabled=false") == "false"
        assert webhook() == 404
        assert helm_upgrade(secret) == "true" and webhook() == 200


def documented_crd_adoption() -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations docs/install.md (step 7) sets on a CRD an earlier release
    installed from crds/, read from its shell block."""
    install = (CHART.parent / "docs" / "install.md").read_text()
    block = (
        install.split("hand it to the\n  release:", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    )
    words = block.replace("\\\n", " ").split()
    labels, annotations = {}, {}
    for verb, into in (("label", labels), ("annotate", annotations)):
        start = words.index(verb) + 3  # kubectl <verb> crd <name>
        for word in words[start:]:
            if "=" not in word:
                break
            key, _, value = word.partition("=")
            into[key] = value
    return labels, annotations


def hand_over_crd(kube: ControlPlane) -> dict[str, str]:
    """docs/install.md's one-time commands, as API calls: the CRD an earlier release left from
    crds/ labelled and annotated for the release; the annotations set."""
    labels, annotations = documented_crd_adoption()
    kube.request(
        "PATCH",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpuclasses.cozystack.io",
        {"metadata": {"labels": labels, "annotations": annotations}},
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()
    return annotations


@pytest.mark.tools
def test_the_crd_upgrades_with_the_chart_and_outlives_it(
    hook_pki: dict[str, Path], tmp_path: Path
) -> None:
    """The CRD is a template: an install adopts one an earlier release left from crds/ once the
    documented labels and annotations are set, brings it to the chart's version, and leaves it
    (and every GPUClass) on uninstall."""
    release, namespace = "gpuclass-hooks", "cozy-gpu"
    crd = yaml.safe_load((CHART / "files" / "gpuclasses.cozystack.io.yaml").read_text())
    older = copy.deepcopy(crd)
    del older["spec"]["versions"][0]["additionalPrinterColumns"]
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
    with control_plane(tmp_path) as kube:
        kube.apply(*manifests("metacontroller-crds.yaml"), older)
        kube.namespace(namespace)
        kube.apply(tls_secret(namespace, f"{release}-tls", pki_files(hook_pki)))
        base = ["--namespace", namespace, "--kubeconfig", str(kube.kubeconfig)]
        values = ["--set", f"tls.existingSecret={release}-tls", "--set", LOOPBACK_API_SERVER]
        install = [helm(), "upgrade", "--install", release, str(CHART), *base, *values]
        refused = subprocess.run(install, capture_output=True, text=True, timeout=180)
        assert refused.returncode != 0 and "invalid ownership metadata" in refused.stderr
        annotations = hand_over_crd(kube)
        assert annotations["meta.helm.sh/release-name"] == release
        assert annotations["meta.helm.sh/release-namespace"] == namespace
        adopted = subprocess.run(install, capture_output=True, text=True, timeout=180)
        assert adopted.returncode == 0, adopted.stderr
        stored = kube.request("GET", path).json()
        assert differences(crd["spec"], stored["spec"]) == []
        kube.apply(
            {
                "apiVersion": "cozystack.io/v1alpha1",
                "kind": "GPUClass",
                "metadata": {"name": "l40s"},
                "spec": {"resourceName": GPU},
            }
        )
        uninstall = [helm(), "uninstall", release, *base]
        assert subprocess.run(uninstall, capture_output=True, timeout=120).returncode == 0
        assert kube.request("GET", path).status_code == 200
        assert kube.request("GET", "/apis/cozystack.io/v1alpha1/gpuclasses/l40s").status_code == 200


# The last release of the chart before the day-two defaults (NetworkPolicy, admission on, the
# Service on 443, the CRD as a template), as landed.
EARLIER_RELEASE = "1fd160a"


@pytest.mark.tools
def test_an_upgrade_from_the_earlier_release_as_documented_keeps_every_setting(
    hook_pki: dict[str, Path], tmp_path: Path
) -> None:
    """docs/install.md, step 7: from the earlier release, the CRD handed over once, then `helm
    upgrade --reset-then-reuse-values`. `--reuse-values` is refused naming that flag; the
    documented one keeps what was set, takes the new defaults, and keeps the old Service port."""
    release, namespace = "gpuclass-hooks", "cozy-gpu"
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(CHART.parent), "archive", EARLIER_RELEASE, "metacontroller"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(earlier)], input=archive, check=True, timeout=60)
    plane = tmp_path / "plane"
    plane.mkdir()
    with control_plane(plane) as kube:
        kube.apply(*manifests("metacontroller-crds.yaml"))
        kube.namespace(namespace)
        kube.apply(tls_secret(namespace, f"{release}-tls", pki_files(hook_pki)))
        base = ["--namespace", namespace, "--kubeconfig", str(kube.kubeconfig)]
        values = ["--set", f"tls.existingSecret={release}-tls", "--set", "admission.enabled=true"]
        values += ["--set", "gpuOperator.variant=vgpu"]
        installed = subprocess.run(
            [helm(), "install", release, str(earlier / "metacontroller"), *base, *values],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        hand_over_crd(kube)
        upgrade = [helm(), "upgrade", release, str(CHART), *base, "--set", LOOPBACK_API_SERVER]
        reused = subprocess.run([*upgrade, "--reuse-values"], capture_output=True, text=True)
        assert reused.returncode != 0 and "--reset-then-reuse-values" in reused.stderr
        upgraded = subprocess.run(
            [*upgrade, "--reset-then-reuse-values"], capture_output=True, text=True, timeout=180
        )
        assert upgraded.returncode == 0, upgraded.stderr
        rendered = helm_get("manifest", kube, release, namespace)
        env = {
            e["name"]: e.get("value")
            for d in rendered
            if d["kind"] == "Deployment"
            for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["GPUCLASS_ENABLED"] == "true"
        kinds = {d["kind"] for d in rendered}
        assert {"ValidatingWebhookConfiguration", "NetworkPolicy"} <= kinds
        [service] = [d for d in rendered if d["kind"] == "Service"]
        assert {p["port"] for p in service["spec"]["ports"]} >= {443, 80}


@pytest.mark.tools
def test_a_credential_rotated_in_its_secret_changes_the_hook_urls_on_the_next_upgrade(
    tmp_path: Path,
) -> None:
    """Metacontroller reads the token, the CA bundle and the client certificate only when it
    builds a controller, and rebuilds one only when its spec changes: `helm upgrade
    --reuse-values` after a rotation must change the hook URLs, and one with nothing rotated must
    not (docs/operating.md). No credential appears in a URL. On a control plane of its own."""
    release, namespace = "rot", "cozy-gpu-rot"
    fullname = f"{release}-gpuclass-hooks"
    ca = trustme.CA()
    pem = {
        "tls": ca.issue_cert(f"{fullname}.{namespace}.svc"),
        "client": ca.issue_cert("metacontroller"),
    }

    def issued(which: str) -> dict[str, bytes]:
        return {
            "tls.crt": pem[which].cert_chain_pems[0].bytes(),
            "tls.key": pem[which].private_key_pem.bytes(),
            "ca.crt": ca.cert_pem.bytes(),
        }

    values = (
        f"tls.existingSecret={fullname}-tls",
        "tls.clientAuth.enabled=true",
        f"tls.clientAuth.existingSecret={fullname}-client",
        "admission.enabled=false",
        "gpuOperator.variant=vgpu",
    )
    with control_plane(tmp_path) as kube:
        kube.apply(*manifests("metacontroller-crds.yaml"))
        kube.namespace(namespace)
        kube.apply(
            tls_secret(namespace, f"{fullname}-tls", issued("tls")),
            tls_secret(namespace, f"{fullname}-client", issued("client")),
        )
        base = ["--namespace", namespace, "--kubeconfig", str(kube.kubeconfig)]

        def helm_upgrade(*flags: str) -> dict[str, str]:
            command = [helm(), "upgrade", release, str(CHART), *base, *flags]
            result = subprocess.run(command, capture_output=True, text=True, timeout=180)
            assert result.returncode == 0, result.stderr
            urls = {}
            for kind, name in (
                ("compositecontrollers", "gpuclass-status"),
                ("decoratorcontrollers", "gpuclass-license"),
            ):
                stored = kube.request(
                    "GET", f"/apis/metacontroller.k8s.io/v1alpha1/{kind}/{name}"
                ).json()
                for hook, spec in stored["spec"]["hooks"].items():
                    urls[f"{name}/{hook}"] = spec["webhook"]["url"]
            return urls

        def patch(secret: str, key: str, value: bytes) -> None:
            kube.request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/secrets/{secret}",
                {"data": {key: base64.b64encode(value).decode()}},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()

        helm_upgrade("--install", *(flag for value in values for flag in ("--set", value)))
        settled = helm_upgrade("--reuse-values")  # the token exists from here on
        assert helm_upgrade("--reuse-values") == settled
        token = kube.request(
            "GET", f"/api/v1/namespaces/{namespace}/secrets/{fullname}-hook-token"
        ).json()["data"]["token"]
        rotations = (
            (f"{fullname}-hook-token", "token", b"a-new-token-for-metacontroller"),
            (f"{fullname}-tls", "ca.crt", trustme.CA().cert_pem.bytes() + ca.cert_pem.bytes()),
            (
                f"{fullname}-client",
                "tls.crt",
                ca.issue_cert("metacontroller").cert_chain_pems[0].bytes(),
            ),
        )
        for secret, key, value in rotations:
            patch(secret, key, value)
            rotated = helm_upgrade("--reuse-values")
            changed = {hook for hook in rotated if rotated[hook] != settled[hook]}
            assert changed == set(settled), f"{secret}/{key} rotated, URLs unchanged"
            assert {u.split("&cred=")[0] for u in rotated.values()} == {
                u.split("&cred=")[0] for u in settled.values()
            }
            settled = rotated
        for url in settled.values():
            assert token not in url and base64.b64decode(token).decode() not in url


def test_monitoring_objects_are_stored_as_written(kube: ControlPlane) -> None:
    """The ServiceMonitor and PrometheusRule against prometheus-operator's own CRDs (from its Go
    module, `make tools`), the VMServiceScrape and VMRule against CRDs written for the suite from
    the VictoriaMetrics operator's published API for the fields the chart uses
    (tests/manifests/victoriametrics-crds.yaml): a field the API does not know would be pruned,
    a wrong type refused."""
    crds = Path(binary("helm")).parent / "prometheus-operator-crds"
    operator_crds = [yaml.safe_load(path.read_text()) for path in sorted(crds.glob("*.yaml"))]
    kube.apply(*operator_crds, *manifests("victoriametrics-crds.yaml"))
    for crd in [*operator_crds, *manifests("victoriametrics-crds.yaml")]:
        kube.wait_established(crd["metadata"]["name"])
    kube.namespace("cozy-gpu-monitoring")
    rendered = render(
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.vmServiceScrape.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.vmRule.enabled=true",
        "metrics.requireAuth=true",
        namespace="cozy-gpu-monitoring",
    )
    kinds = ("ServiceMonitor", "VMServiceScrape", "PrometheusRule", "VMRule")
    documents = [d for d in rendered if d["kind"] in kinds]
    assert sorted(d["kind"] for d in documents) == sorted(kinds)
    for document in documents:
        located = {
            **document,
            "metadata": {**document["metadata"], "namespace": "cozy-gpu-monitoring"},
        }
        created = kube.request("POST", collection_path(located), located)
        assert created.status_code == 201, (document["kind"], created.text)
        assert differences(document, created.json()) == [], document["kind"]


# --- a tenant as Cozystack makes one: its roles and the tenant chart with GPU budget keys -------

TENANT_KINDS = ("Namespace", "ServiceAccount", "Role", "RoleBinding", "ResourceQuota", "LimitRange")
QUOTAS = {TOTAL_KEY: 4, class_key("l40s"): 2, "cpu": 4}


@pytest.fixture(scope="module")
def tenant_a(kube: ControlPlane, installed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tenant a, declared in tenant-root, as Cozystack's tenant chart installs it."""
    kube.apply(*cozystack.tenant_roles())
    rendered = cozystack.render_tenant("a", "tenant-root", {"resourceQuotas": QUOTAS})
    made = [d for d in rendered if d["kind"] in TENANT_KINDS]
    kube.apply(*(d for d in made if d["kind"] == "Namespace"))
    for namespace in {d["metadata"].get("namespace") for d in made} - {None, "tenant-a"}:
        kube.namespace(namespace)  # where the chart binds the tenant's roles outside its own
    kube.apply(*(d for d in made if d["kind"] != "Namespace"))
    return made


def test_the_tenant_charts_quota_with_gpu_budget_keys_is_accepted(
    kube: ControlPlane, tenant_a: list[dict[str, Any]]
) -> None:
    """The tenant chart puts every declared key in its ResourceQuota (as requests and limits):
    the API server stores GPU budget keys there. They are not pod resources, so nothing is ever
    counted against them; the webhook is what enforces them (docs/gpu-budgets.md)."""
    [quota] = [d for d in tenant_a if d["kind"] == "ResourceQuota"]
    stored = kube.request(
        "GET", f"/api/v1/namespaces/tenant-a/resourcequotas/{quota['metadata']['name']}"
    ).json()
    hard = stored["spec"]["hard"]
    assert hard[f"requests.{TOTAL_KEY}"] == "4" and hard[f"limits.{class_key('l40s')}"] == "2"


def test_a_tenants_service_account_lists_gpuclasses_and_changes_none(
    kube: ControlPlane, tenant_a: list[dict[str, Any]]
) -> None:
    token = kube.service_account_token("tenant-a", "tenant-a")
    assert kube.request("GET", GPUCLASSES, token=token).status_code == 200
    assert kube.request("GET", f"{GPUCLASSES}/absent", token=token).status_code == 404
    assert kube.request("POST", GPUCLASSES, {}, token=token).status_code == 403
    assert kube.request("DELETE", f"{GPUCLASSES}/l40s", token=token).status_code == 403
    status = f"{GPUCLASSES}/l40s/status"
    assert kube.request("PUT", status, {}, token=token).status_code == 403
