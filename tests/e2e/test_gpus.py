"""The class status on the real cluster (docs/gpuclass.md, "Status" and "Conditions"): the GPU
node's kubelet advertises devices its device plugin registered, the real scheduler places pods
that request them, and every step is read twice, as `kubectl get gpuclasses` shows it and as the
metrics endpoint of the serving pods exports it (scraped as the chart's ServiceMonitor does). Then
`plan` on a dump of the cluster, and the license copy as a pod consumes it: a Secret volume."""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hooks.rules.resource_labels import is_resource_label, resource_label
from tests.builders import SOURCE_NAME, SOURCE_NS, TOKEN_KEY
from tests.e2e.cluster import (
    GPU,
    GPU_DEVICES,
    GPU_NODE,
    GPU_NODE_TAINT,
    NAMESPACE,
    RELEASE,
    ROOT,
    VGPU,
    VGPU_DEVICES,
    Cluster,
    wait_for,
)
from tests.e2e.steps import COPY, licensed_setup

CLASS = "l40s"  # the licensed class of tests.e2e.steps.licensed_setup, tolerating GPU_NODE_TAINT
TENANT = "tenant-gpus"  # where the VMs' pods run
ENTITLED = "tenant-entitled"  # entitled by licensed_setup
LAUNCHER = {"kubevirt.io": "virt-launcher"}  # the chart's pod selector
NODE_GONE_SECONDS = 180  # kube-controller-manager's grace for a silent kubelet, and the sync
HOLD_SECONDS = 45  # how long a deleted pod's preStop keeps it terminating


# --- the class as each reader shows it --------------------------------------------------------


@dataclass(frozen=True)
class Shown:
    free: int
    max_free_per_node: int
    ready: str  # Ready's status
    reason: str = ""  # Ready's reason, where the reader has it


def row(cluster: Cluster, name: str) -> dict[str, str] | None:
    """The row of `kubectl get gpuclasses`, by the header's columns: NAME RESOURCE DEVICECLASS
    FREE MAXPERNODE READY AGE. kubectl aligns each column under its header and leaves a column
    with no value blank (a device-plugin class's DEVICECLASS, a DRA class's RESOURCE)."""
    done = cluster.kubectl("get", "gpuclasses", name, check=False)
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        return None
    header, values = lines
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {
        header[start:end].strip(): values[start:end].strip()
        for start, end in zip(starts, ends, strict=True)
    }


def listed(cluster: Cluster, name: str) -> Shown | None:
    shown = row(cluster, name)
    if shown is None or not shown["FREE"].isdigit():
        return None
    return Shown(int(shown["FREE"]), int(shown["MAXPERNODE"]), shown["READY"])


def scrape(context: ssl.SSLContext, token: str, address: str, port: int) -> str | None:
    """GET /metrics of one pod as the ServiceMonitor sends it: TLS verified against the release's
    CA for the Service's name, with the hooks' bearer token."""
    request = (
        f"GET /metrics HTTP/1.1\r\nHost: {address}:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Connection: close\r\n\r\n"
    )
    server_name = f"{RELEASE}.{NAMESPACE}.svc"
    with (
        socket.create_connection((address, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls_socket,
    ):
        tls_socket.sendall(request.encode())
        received = b"".join(iter(lambda: tls_socket.recv(65536), b""))
    head, _, body = received.partition(b"\r\n\r\n")
    return body.decode() if head.startswith(b"HTTP/1.1 200") else None  # None: a pod stopping


@dataclass(frozen=True)
class Exported:
    synced_at: float
    shown: Shown | None  # None where the class exports no inventory (a conflicting class)
    ready: tuple[str, str]  # Ready's status and reason


def exported(cluster: Cluster, name: str) -> Exported | None:
    """The class as the freshest replica computed it (the chart's dashboards take the replica
    with the latest cozystack_gpu_class_last_sync_timestamp_seconds)."""
    slices = cluster.get(
        "endpointslices", "-n", NAMESPACE, "-l", f"kubernetes.io/service-name={RELEASE}"
    )
    tls = cluster.secret_data(NAMESPACE, f"{RELEASE}-tls") or {}
    token = (cluster.secret_data(NAMESPACE, f"{RELEASE}-hook-token") or {})["token"].decode()
    context = ssl.create_default_context(cadata=tls["ca.crt"].decode())
    freshest: Exported | None = None
    for item in (slices or {"items": []})["items"]:
        [port] = [p["port"] for p in item["ports"] if p["name"] == "metrics"]
        for endpoint in item["endpoints"]:
            if not endpoint["conditions"].get("ready"):
                continue
            try:
                text = scrape(context, token, endpoint["addresses"][0], port)
            except OSError:
                text = None
            if text is None:
                return None  # a pod ending between the listing and the scrape: ask again
            sample = one_class(text, name)
            if sample is not None and (freshest is None or sample.synced_at > freshest.synced_at):
                freshest = sample
    return freshest


def one_class(text: str, name: str) -> Exported | None:
    values: dict[str, float] = {}
    ready = reason = ""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("class") != name:
                continue
            if sample.name == "cozystack_gpu_class_condition" and sample.labels["type"] == "Ready":
                ready, reason = sample.labels["status"], sample.labels["reason"]
            else:
                values[sample.name] = sample.value
    if "cozystack_gpu_class_last_sync_timestamp_seconds" not in values:
        return None
    shown = None
    if "cozystack_gpu_class_free_units" in values:
        free = int(values["cozystack_gpu_class_free_units"])
        most = int(values["cozystack_gpu_class_max_free_per_node_units"])
        shown = Shown(free, most, ready, reason)
    return Exported(
        values["cozystack_gpu_class_last_sync_timestamp_seconds"], shown, (ready, reason)
    )


def status_condition(cluster: Cluster, name: str, kind: str) -> tuple[str, str] | None:
    found = cluster.get("gpuclass", name) or {}
    for condition in found.get("status", {}).get("conditions", []):
        if condition["type"] == kind:
            return condition["status"], condition["reason"]
    return None


def shows(
    cluster: Cluster,
    name: str,
    expected: Shown,
    *,
    synced_after: float = 0.0,
    exports_inventory: bool = True,
) -> None:
    """Both readers show the class as expected, the metrics from a sync later than synced_after
    (a change that changes nothing is seen by a sync that followed it, not by waiting a while).
    A class that exports no inventory (docs/operating.md: a conflicting one) exports its
    conditions only."""
    seen: list[object] = []

    def agree() -> bool:
        row, metrics = listed(cluster, name), exported(cluster, name)
        ready = status_condition(cluster, name, "Ready")
        seen[:] = [row, ready, metrics]
        return (
            row == Shown(expected.free, expected.max_free_per_node, expected.ready)
            and ready == (expected.ready, expected.reason)
            and metrics is not None
            and metrics.ready == ready
            and metrics.shown == (expected if exports_inventory else None)
            and metrics.synced_at > synced_after
        )

    try:
        wait_for(f"{name} shown as {expected}", agree)
    except AssertionError as failure:
        raise AssertionError(f"{failure}; last seen (row, Ready, metrics): {seen}") from None


# --- the cluster's GPU pods ---------------------------------------------------------------------


def gpu_pod(name: str, units: int, *, hold_seconds: int = 0) -> dict[str, Any]:
    """A VM's virt-launcher pod as far as the scheduler and the hooks see it: the label, the
    GPU node's toleration, the devices as limits (requests default to them)."""
    container: dict[str, Any] = {
        "name": "compute",
        "image": "e2e.local/pause:1",
        "imagePullPolicy": "Never",
        "resources": {"limits": {GPU: str(units)}},
    }
    if hold_seconds:
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": hold_seconds}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TENANT, "labels": LAUNCHER},
        "spec": {
            "tolerations": [{"key": GPU_NODE_TAINT, "operator": "Exists"}],
            "terminationGracePeriodSeconds": hold_seconds + 30,
            "containers": [container],
        },
    }


def running(cluster: Cluster, *names: str, namespace: str = TENANT) -> None:
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "--timeout=120s",
        *(f"pod/{name}" for name in names),
    )  # fmt: skip


@pytest.fixture(scope="module")
def gpus(cluster: Cluster, serving: None) -> Iterator[None]:
    """The install of tests.e2e.conftest.serving and a namespace for VMs' pods; afterwards, the
    GPU node, the classes and the license source as they were."""
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}})
    yield
    cluster.kubectl("delete", "namespace", TENANT, "--wait=true", "--timeout=180s")
    cluster.kubectl("delete", "gpuclass", "l40s-younger", "l40s-24q", "--ignore-not-found")
    cluster.kubectl("delete", "pods", "-n", ENTITLED, "guest-1", "guest-2", "--ignore-not-found")
    cluster.kubectl("uncordon", GPU_NODE)
    licensed_setup(cluster)


AT_REST = Shown(GPU_DEVICES, GPU_DEVICES, "True", "Ready")


# --- the scenarios ----------------------------------------------------------------------------


def test_the_class_counts_the_devices_the_gpu_node_advertises(cluster: Cluster, gpus: None) -> None:
    """Scenario 1: what the kubelet reports of the device plugin's devices, the class shows; the
    node is labelled with the resources it lists, which is how the class reads it."""
    node = cluster.get("node", GPU_NODE)
    assert node["status"]["allocatable"][GPU] == str(GPU_DEVICES)
    assert node["status"]["capacity"][VGPU] == str(VGPU_DEVICES)
    devices = {resource_label(GPU): "true", resource_label(VGPU): "true"}.items()
    wait_for(
        "the GPU node labelled with its devices",
        lambda: devices <= node_resource_labels(cluster).items(),
    )
    shows(cluster, CLASS, AT_REST)
    assert status_condition(cluster, CLASS, "ResourceNotAdvertised") == ("False", "Advertised")


def test_scheduled_pods_take_devices_pending_ones_none_terminating_ones_until_gone(
    cluster: Cluster, gpus: None
) -> None:
    """Scenario 2: the scheduler's placements, as the rules count them. The class reads the pods
    the resource labeller marked as naming its resource (docs/gpuclass.md, "Which pods and nodes a
    class reads"): Metacontroller labels them, and removes a tenant's label naming another
    resource."""
    claimed = gpu_pod("vm-b", 1)
    claimed["metadata"]["labels"] = {**LAUNCHER, resource_label(VGPU) or "": "true"}
    cluster.apply(gpu_pod("vm-a", 2, hold_seconds=HOLD_SECONDS), claimed)
    running(cluster, "vm-a", "vm-b")
    shows(cluster, CLASS, Shown(1, 1, "True", "Ready"))
    for name in ("vm-a", "vm-b"):
        wait_for(
            f"{name} labelled with its resource alone",
            lambda name=name: resource_labels_of(cluster, name) == {resource_label(GPU): "true"},
        )

    created = time.time()
    cluster.apply(gpu_pod("vm-c", 2))  # more than the node has left
    wait_for("vm-c unschedulable", lambda: unschedulable(cluster, "vm-c"))
    shows(cluster, CLASS, Shown(1, 1, "True", "Ready"), synced_after=created)
    cluster.kubectl("delete", "pod", "-n", TENANT, "vm-c", "--wait=true")

    deleted = time.time()
    cluster.kubectl("delete", "pod", "-n", TENANT, "vm-a", "--wait=false")
    # still running its preStop: terminating, and its devices still held
    shows(cluster, CLASS, Shown(1, 1, "True", "Ready"), synced_after=deleted)
    pod = cluster.get("pod", "-n", TENANT, "vm-a")
    assert pod is not None and "deletionTimestamp" in pod["metadata"], "vm-a ended too soon"
    wait_for("vm-a gone", lambda: cluster.get("pod", "-n", TENANT, "vm-a") is None, seconds=120)
    shows(cluster, CLASS, Shown(3, 3, "True", "Ready"))
    cluster.kubectl("delete", "pod", "-n", TENANT, "vm-b", "--wait=true")
    shows(cluster, CLASS, AT_REST)


def node_resource_labels(cluster: Cluster) -> dict[str, str]:
    """The GPU node's resource labels (its device plugin's resources among them)."""
    labels = (cluster.get("node", GPU_NODE) or {}).get("metadata", {}).get("labels", {})
    return {k: v for k, v in labels.items() if is_resource_label(k)}


def resource_labels_of(cluster: Cluster, name: str) -> dict[str, str]:
    pod = cluster.get("pod", "-n", TENANT, name) or {}
    labels = pod.get("metadata", {}).get("labels", {})
    return {k: v for k, v in labels.items() if is_resource_label(k)}


def unschedulable(cluster: Cluster, name: str) -> bool:
    pod = cluster.get("pod", "-n", TENANT, name) or {}
    return "nodeName" not in pod.get("spec", {}) and any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in pod.get("status", {}).get("conditions", [])
    )


def test_a_cordon_and_taints_take_the_node_out_and_back(cluster: Cluster, gpus: None) -> None:
    """Scenario 3: a cordoned node and a taint the class does not tolerate count nothing; a
    taint it tolerates changes nothing; each step undone brings the devices back."""
    out = Shown(0, 0, "True", "Ready")
    cluster.kubectl("cordon", GPU_NODE)
    shows(cluster, CLASS, out)
    cluster.kubectl("uncordon", GPU_NODE)
    shows(cluster, CLASS, AT_REST)
    cluster.kubectl("taint", "node", GPU_NODE, "e2e.local/drain=true:NoExecute")
    shows(cluster, CLASS, out)
    cluster.kubectl("taint", "node", GPU_NODE, "e2e.local/drain-")
    shows(cluster, CLASS, AT_REST)
    tainted = time.time()
    cluster.kubectl("taint", "node", GPU_NODE, f"{GPU_NODE_TAINT}=maintenance:NoExecute")
    shows(cluster, CLASS, AT_REST, synced_after=tainted)
    cluster.kubectl("taint", "node", GPU_NODE, f"{GPU_NODE_TAINT}:NoExecute-")


def kubelet(cluster: Cluster, action: str) -> None:
    subprocess.run(
        [
            sys.executable, str(ROOT / "testenv" / "cluster.py"), f"{action}-kubelet",
            "--dir", str(cluster.directory), "--tools", str(cluster.tools), "--node", GPU_NODE,
        ],
        check=True, timeout=60,
    )  # fmt: skip


def node_ready(cluster: Cluster) -> str:
    node = cluster.get("node", GPU_NODE) or {}
    conditions = node.get("status", {}).get("conditions", [])
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "")


def test_a_node_whose_kubelet_stopped_counts_nothing_until_it_is_back(
    cluster: Cluster, gpus: None
) -> None:
    """Scenario 4: the kubelet stops, kube-controller-manager marks the node's Ready Unknown, and
    the class counts none of its devices: `free` 0, the class itself still Ready (docs/gpuclass.md:
    Ready says whether the class can serve VMs, `free` whether there is room)."""
    kubelet(cluster, "stop")
    try:
        wait_for("the node not Ready", lambda: node_ready(cluster) == "Unknown", NODE_GONE_SECONDS)
        shows(cluster, CLASS, Shown(0, 0, "True", "Ready"))
    finally:
        kubelet(cluster, "start")
    wait_for("the node Ready again", lambda: node_ready(cluster) == "True", NODE_GONE_SECONDS)
    shows(cluster, CLASS, AT_REST)


def gpu_class(name: str, **backing: Any) -> dict[str, Any]:
    """A class tolerating the GPU node's taint, backed by `resourceName` or `dra`."""
    return {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": name},
        "spec": {**backing, "tolerations": [{"key": GPU_NODE_TAINT, "operator": "Exists"}]},
    }


def test_a_younger_class_of_the_same_resource_and_a_resource_kubevirt_does_not_permit(
    cluster: Cluster, gpus: None, tmp_path: Path
) -> None:
    """Scenario 5, and `plan` on a dump of the cluster agreeing with the live status of every
    class, with a pod holding a device."""
    cluster.apply(
        gpu_class("l40s-younger", resourceName=GPU),
        gpu_class("l40s-24q", resourceName=VGPU),
        gpu_pod("vm-d", 1),
    )
    running(cluster, "vm-d")
    conflict = Shown(0, 0, "False", "ResourceNameConflict")
    shows(cluster, "l40s-younger", conflict, exports_inventory=False)
    assert status_condition(cluster, "l40s-younger", "ResourceNameConflict") == (
        "True",
        "OlderClassHasResource",
    )
    # Only a conflict zeroes a class: the devices are advertised, just not passed to VMs.
    shows(
        cluster, "l40s-24q", Shown(VGPU_DEVICES, VGPU_DEVICES, "False", "ResourceNameNotPermitted")
    )
    assert status_condition(cluster, "l40s-24q", "ResourceNameNotPermitted") == (
        "True",
        "NotInPermittedHostDevices",
    )
    shows(cluster, CLASS, Shown(GPU_DEVICES - 1, GPU_DEVICES - 1, "True", "Ready"))

    planned = plan_on_a_dump(cluster, tmp_path)
    live = {item["metadata"]["name"]: item["status"] for item in cluster.get("gpuclasses")["items"]}
    assert set(planned) == set(live) == {CLASS, "l40s-younger", "l40s-24q"}
    for name, status in live.items():
        assert comparable(planned[name]) == comparable(status), name
    cluster.kubectl("delete", "gpuclass", "l40s-younger", "l40s-24q")
    cluster.kubectl("delete", "pod", "-n", TENANT, "vm-d", "--wait=true")
    shows(cluster, CLASS, AT_REST)


def comparable(status: dict[str, Any]) -> dict[str, Any]:
    """A status as the hooks compute it, without the transition times (plan computes at its own
    now) and the `observedGeneration` Metacontroller adds to every status it writes."""
    conditions = [
        {key: value for key, value in c.items() if key != "lastTransitionTime"}
        for c in status["conditions"]
    ]
    kept = {key: value for key, value in status.items() if key != "observedGeneration"}
    return {**kept, "conditions": conditions}


def plan_on_a_dump(cluster: Cluster, workdir: Path) -> dict[str, Any]:
    """docs/plan.md's dump, then `gpuclass-hooks plan` with the install's selectors."""
    dumps = {
        "cluster.json": ("nodes,pods,namespaces", "-A"),
        "kubevirt.json": ("kubevirt", "-n", "cozy-kubevirt", "kubevirt"),
        "sources.json": ("secret", "-n", SOURCE_NS, SOURCE_NAME),
        "copies.json": ("secrets", "-A", f"--field-selector=metadata.name={COPY}"),
        "classes.json": ("gpuclasses",),
        "dra.json": ("resourceslices,resourceclaims,deviceclasses", "-A"),
    }
    for file, arguments in dumps.items():
        (workdir / file).write_text(cluster.kubectl("get", *arguments, "-o", "json").stdout)
    done = cluster.run(
        str(Path(sys.executable).parent / "gpuclass-hooks"), "plan",
        *(str(workdir / file) for file in dumps),
        "--pod-selector", ",".join(f"{k}={v}" for k, v in LAUNCHER.items()),
        "--license-namespaces", SOURCE_NS, "-o", "json",
    )  # fmt: skip
    return {item["name"]: item["status"] for item in json.loads(done.stdout)["classes"]}


# --- the license copy as a pod consumes it -------------------------------------------------------


def license_reader(name: str, image: str) -> dict[str, Any]:
    """A pod mounting the copy as docs/cozystack.md says a VM does (a `secret` volume); it only
    keeps running, and is read with `kubectl exec`."""
    wait_forever = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
        "time.sleep(1e9)"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ENTITLED},
        "spec": {
            "containers": [
                {
                    "name": "guest",
                    "image": f"docker.io/library/{image}",
                    "imagePullPolicy": "Never",
                    "command": ["/opt/hooks/bin/python", "-c", wait_forever],
                    "volumeMounts": [
                        {"name": "license", "mountPath": "/license", "readOnly": True}
                    ],
                }
            ],
            "volumes": [{"name": "license", "secret": {"secretName": COPY}}],
        },
    }


def read_license(cluster: Cluster, pod: str) -> tuple[str, str]:
    script = (
        f"print(open('/license/{TOKEN_KEY}').read()); print('---'); "
        "print(open('/license/gridd.conf').read())"
    )
    output = cluster.kubectl(
        "exec", "-n", ENTITLED, pod, "--", "/opt/hooks/bin/python", "-c", script
    ).stdout
    token, _, gridd = output.partition("\n---\n")
    return token.strip(), gridd


def test_a_pod_reads_the_license_copy_from_a_secret_volume_across_a_rotation(
    cluster: Cluster, gpus: None, pytestconfig: pytest.Config
) -> None:
    """Scenario 6: a pod in an entitled namespace reads the token and gridd.conf; after the token
    is rotated at the source, a new pod reads the new one, and the running one keeps working."""
    image: str = pytestconfig.getoption("--e2e-image")
    cluster.apply(license_reader("guest-1", image))
    running(cluster, "guest-1", namespace=ENTITLED)
    token, gridd = read_license(cluster, "guest-1")
    assert token == "e2e-license-token"
    assert "FeatureType=1" in gridd

    rotated = "e2e-license-token-rotated"
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SOURCE_NAME, "namespace": SOURCE_NS},
            "stringData": {TOKEN_KEY: rotated},
        }
    )
    wait_for(
        "the rotated token in the copy",
        lambda: (cluster.secret_data(ENTITLED, COPY) or {}).get(TOKEN_KEY) == rotated.encode(),
    )
    cluster.apply(license_reader("guest-2", image))
    running(cluster, "guest-2", namespace=ENTITLED)
    assert read_license(cluster, "guest-2")[0] == rotated
    still, gridd = read_license(cluster, "guest-1")
    assert still in ("e2e-license-token", rotated) and "FeatureType=1" in gridd
    first = cluster.get("pod", "-n", ENTITLED, "guest-1")
    assert first["status"]["containerStatuses"][0]["restartCount"] == 0
    cluster.kubectl("delete", "pod", "-n", ENTITLED, "guest-1", "guest-2", "--wait=true")
