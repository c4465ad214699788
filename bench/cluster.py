"""Seeded, realistic clusters as `kubectl get -o json` shows them, and the exact hook requests
Metacontroller would send for them.

Objects carry what real ones carry (images, conditions, addresses, managedFields on nodes; several
containers with env, volumes and statuses on pods; docs/scale.md gives their sizes), so that
request sizes and decode costs are those of a real cluster. JSON is produced object by object and
joined as bytes, so generating the L cluster never builds its dict tree.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

GPU_RESOURCES = ("nvidia.com/NVIDIA_L40S-24Q", "nvidia.com/GH100_H100_PCIE")
SIZES = {"S": (50, 1_500), "M": (500, 15_000), "L": (2_000, 60_000)}
CREATED = "2026-01-01T00:00:00Z"
TOKEN = b"BENCH-NOT-A-REAL-TOKEN\n"


@dataclass(frozen=True)
class Cluster:
    """A generated cluster: each object as compact JSON bytes, keyed like Metacontroller does."""

    nodes: dict[str, bytes]
    pods: dict[str, bytes]
    classes: dict[str, bytes]
    namespaces: dict[str, bytes]
    secrets: dict[str, bytes]
    gpu_node_names: frozenset[str]
    launcher_pod_keys: frozenset[str]


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _managed_fields(rng: random.Random, count: int) -> list[dict[str, object]]:
    return [
        {
            "manager": rng.choice(["kubelet", "kube-controller-manager", "nvidia-device-plugin"]),
            "operation": "Update",
            "apiVersion": "v1",
            "time": CREATED,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {f"f:field{i}": {} for i in range(12)}},
        }
        for _ in range(count)
    ]


def node(rng: random.Random, index: int, gpu: str | None) -> dict[str, object]:
    name = f"node-{index:05d}"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": rng.choice(["gpu.large", "cpu.xlarge", "cpu.large"]),
        "topology.kubernetes.io/zone": f"zone-{index % 3}",
    }
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "250", "ephemeral-storage": "1Ti"}
    allocatable = {"cpu": "63500m", "memory": "500Gi", "pods": "250", "ephemeral-storage": "900Gi"}
    taints = []
    if gpu:
        labels["nvidia.com/gpu.present"] = "true"
        units = rng.choice([2, 4, 8])
        capacity[gpu] = str(units)
        allocatable[gpu] = str(units)
        if rng.random() < 0.5:
            taints.append({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
    if rng.random() < 0.03:
        taints.append({"key": "maintenance", "effect": "NoExecute"})
    ready = "False" if rng.random() < 0.03 else "True"
    spec: dict[str, object] = {"podCIDR": f"10.{index // 250}.{index % 250}.0/24", "taints": taints}
    if rng.random() < 0.04:
        spec["unschedulable"] = True
    conditions = [
        {
            "type": t,
            "status": "False",
            "reason": f"Kubelet{t}",
            "message": f"kubelet has no {t}",
            "lastHeartbeatTime": CREATED,
            "lastTransitionTime": CREATED,
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
    ] + [
        {
            "type": "Ready",
            "status": ready,
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": CREATED,
            "lastTransitionTime": CREATED,
        }
    ]
    images = [
        {
            "names": [
                f"registry.example.com/library/image-{rng.randrange(10**6)}@sha256:{rng.getrandbits(256):064x}",
                f"registry.example.com/library/image-{i}:v{rng.randrange(100)}",
            ],
            "sizeBytes": rng.randrange(10**7, 10**9),
        }
        for i in range(30)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"{rng.getrandbits(128):032x}",
            "resourceVersion": str(rng.randrange(10**8)),
            "creationTimestamp": CREATED,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": _managed_fields(rng, 4),
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{index // 250}.{index % 250}"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{rng.getrandbits(128):032x}",
                "systemUUID": f"{rng.getrandbits(128):032x}",
                "bootID": f"{rng.getrandbits(128):032x}",
                "kernelVersion": "6.8.0-45-generic",
                "osImage": "Talos (v1.9.0)",
                "containerRuntimeVersion": "containerd://2.0.0",
                "kubeletVersion": "v1.31.2",
                "kubeProxyVersion": "v1.31.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images,
        },
    }


def _container(rng: random.Random, name: str, requests: dict[str, str]) -> dict[str, object]:
    return {
        "name": name,
        "image": f"registry.example.com/apps/{name}:v{rng.randrange(1, 30)}.{rng.randrange(10)}",
        "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/bin/entrypoint", "--config", f"/etc/{name}/config.yaml"],
        "env": [
            {"name": f"ENV_{i}", "value": f"value-{rng.getrandbits(64):016x}"} for i in range(18)
        ]
        + [
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            }
        ],
        "resources": {"requests": requests, "limits": dict(requests)},
        "volumeMounts": [
            {"name": f"vol-{i}", "mountPath": f"/var/lib/{name}/{i}"} for i in range(4)
        ]
        + [
            {
                "name": "kube-api-access",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            }
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }


def pod(
    rng: random.Random, index: int, node_names: list[str], gpu_nodes: dict[str, str]
) -> tuple[str, dict[str, object], bool]:
    launcher = rng.random() < 0.1
    namespace = f"tenant-{index % 40:02d}"
    phase = rng.choices(["Running", "Pending", "Succeeded", "Failed"], weights=[90, 4, 4, 2])[0]
    node_name = None if phase == "Pending" and rng.random() < 0.5 else rng.choice(node_names)
    containers = [
        _container(rng, "app", {"cpu": "500m", "memory": "512Mi"}),
        _container(rng, "proxy", {"cpu": "100m", "memory": "64Mi"}),
    ]
    init_containers = [_container(rng, "init-config", {"cpu": "100m", "memory": "32Mi"})]
    labels = {
        "app.kubernetes.io/name": f"app-{index % 200}",
        "pod-template-hash": f"{rng.getrandbits(40):010x}",
    }
    if launcher:
        labels = {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": f"vm-{index}"}
        if node_name in gpu_nodes and rng.random() < 0.8:
            resource = gpu_nodes[node_name]
            containers[0]["resources"] = {
                "requests": {"cpu": "4", resource: "1"},
                "limits": {"cpu": "4", resource: "1"},
            }
            if rng.random() < 0.2:
                sidecar = _container(rng, "gpu-sidecar", {resource: "1"})
                sidecar["restartPolicy"] = "Always"
                init_containers.append(sidecar)
    name = f"pod-{index:06d}"
    spec: dict[str, object] = {
        "containers": containers,
        "initContainers": init_containers,
        "volumes": [{"name": f"vol-{i}", "emptyDir": {}} for i in range(4)]
        + [
            {
                "name": "kube-api-access",
                "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
            }
        ],
        "restartPolicy": "Always",
        "serviceAccountName": "default",
        "schedulerName": "default-scheduler",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
    }
    if node_name:
        spec["nodeName"] = node_name
    statuses = [
        {
            "name": c["name"],
            "ready": phase == "Running",
            "restartCount": rng.randrange(3),
            "image": c["image"],
            "imageID": f"sha256:{rng.getrandbits(256):064x}",
            "containerID": f"containerd://{rng.getrandbits(256):064x}",
            "started": True,
            "state": {"running": {"startedAt": CREATED}},
        }
        for c in containers
    ]
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"{rng.getrandbits(128):032x}",
            "resourceVersion": str(rng.randrange(10**8)),
            "creationTimestamp": CREATED,
            "labels": labels,
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": CREATED,
                "checksum/config": f"{rng.getrandbits(256):064x}",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"rs-{index % 200}",
                    "uid": f"{rng.getrandbits(128):032x}",
                    "controller": True,
                }
            ],
        },
        "spec": spec,
        "status": {
            "phase": phase,
            "podIP": f"10.244.{index // 250 % 250}.{index % 250}",
            "hostIP": "10.0.0.1",
            "startTime": CREATED,
            "qosClass": "Burstable",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": CREATED}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": statuses,
        },
    }
    return f"{namespace}/{name}", obj, launcher


def gpuclass(
    name: str, resource: str, created: str = CREATED, licensed: bool = False
) -> dict[str, object]:
    spec: dict[str, object] = {
        "resourceName": resource,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if licensed:
        spec["license"] = {"secretRef": {"name": "nvidia-license"}, "featureType": 1}
    return {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": created,
        },
        "spec": spec,
    }


def generate(size: str, seed: int = 7) -> Cluster:
    node_count, pod_count = SIZES[size]
    rng = random.Random(f"{seed}-{size}")
    gpu_nodes: dict[str, str] = {}
    nodes: dict[str, bytes] = {}
    for index in range(node_count):
        gpu = GPU_RESOURCES[index % 2] if rng.random() < 0.2 else None
        obj = node(rng, index, gpu)
        name = str(obj["metadata"]["name"])  # type: ignore[index]
        if gpu:
            gpu_nodes[name] = gpu
        nodes[name] = _dumps(obj)
    node_names = sorted(nodes)
    pods: dict[str, bytes] = {}
    launchers = set()
    for index in range(pod_count):
        key, obj, launcher = pod(rng, index, node_names, gpu_nodes)
        pods[key] = _dumps(obj)
        if launcher:
            launchers.add(key)
    classes = {
        "l40s-24q": _dumps(gpuclass("l40s-24q", GPU_RESOURCES[0], licensed=True)),
        "h100": _dumps(gpuclass("h100", GPU_RESOURCES[1])),
    }
    namespaces = {}
    for index in range(40):
        name = f"tenant-{index:02d}"
        labels = {"kubernetes.io/metadata.name": name}
        if index % 2 == 0:
            labels["namespace.cozystack.io/vgpu"] = "true"
        namespaces[name] = _dumps(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "uid": f"uid-ns-{name}", "labels": labels},
                "status": {"phase": "Active"},
            }
        )
    token = base64.b64encode(TOKEN).decode()
    secrets = {
        "cozy-gpu-operator/nvidia-license": _dumps(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {
                    "name": "nvidia-license",
                    "namespace": "cozy-gpu-operator",
                    "uid": "uid-license",
                },
                "data": {"client_configuration_token.tok": token},
            }
        )
    }
    return Cluster(
        nodes, pods, classes, namespaces, secrets, frozenset(gpu_nodes), frozenset(launchers)
    )


def _object_map(objects: dict[str, bytes], keys: Iterator[str] | None = None) -> Iterator[bytes]:
    yield b"{"
    first = True
    for key in keys if keys is not None else iter(objects):
        if not first:
            yield b","
        first = False
        yield json.dumps(key).encode() + b":" + objects[key]
    yield b"}"


def status_sync_body(
    cluster: Cluster,
    class_name: str = "l40s-24q",
    *,
    selected: bool = False,
    parent_status: dict[str, object] | None = None,
) -> bytes:
    """The /status/sync request for one class; `selected` applies the documented selectors
    (GPU nodes, virt-launcher pods) the way Metacontroller would."""
    parent = json.loads(cluster.classes[class_name])
    if parent_status is not None:
        parent["status"] = parent_status
    node_keys = sorted(cluster.gpu_node_names) if selected else None
    pod_keys = sorted(cluster.launcher_pod_keys) if selected else None
    related_secrets = dict(cluster.secrets) if "license" in parent["spec"] else None
    parts = [
        b'{"controller":{"apiVersion":"metacontroller.k8s.io/v1alpha1","kind":"CompositeController",'
        b'"metadata":{"name":"gpuclass-status"}},"parent":',
        _dumps(parent),
        b',"children":{},"related":{"Node.v1":',
        *_object_map(cluster.nodes, iter(node_keys) if node_keys else None),
        b',"Pod.v1":',
        *_object_map(cluster.pods, iter(pod_keys) if pod_keys else None),
        b',"GPUClass.cozystack.io/v1alpha1":',
        *_object_map(cluster.classes),
    ]
    if related_secrets is not None:
        entitled = {
            k: v
            for k, v in cluster.namespaces.items()
            if b'"namespace.cozystack.io/vgpu":"true"' in v
        }
        parts += [
            b',"Secret.v1":',
            *_object_map(related_secrets),
            b',"Namespace.v1":',
            *_object_map(entitled),
        ]
    parts.append(b'},"finalizing":false}')
    return b"".join(parts)


def license_sync_body(cluster: Cluster, class_name: str = "l40s-24q") -> bytes:
    target = cluster.classes[class_name]
    entitled = {
        k: v for k, v in cluster.namespaces.items() if b'"namespace.cozystack.io/vgpu":"true"' in v
    }
    return b"".join(
        [
            b'{"controller":{"apiVersion":"metacontroller.k8s.io/v1alpha1","kind":"DecoratorController",'
            b'"metadata":{"name":"gpuclass-license"}},"object":',
            target,
            b',"attachments":{"Secret.v1":{}},"related":{"Secret.v1":',
            *_object_map(cluster.secrets),
            b',"Namespace.v1":',
            *_object_map(entitled),
            b'},"finalizing":false}',
        ]
    )


# --- Dynamic Resource Allocation ------------------------------------------------------------------

DRA_DRIVER = "gpu.nvidia.com"
DRA_CLASS = "a10-vfio"
DRA_CLAIMS = {"S": 200, "M": 2_000, "L": 8_000}
DRA_CARDS = 8  # per node, each a `gpu-N` and a `gpu-vfio-N` device, as NVIDIA's driver publishes


@dataclass(frozen=True)
class DraCluster:
    """Every node's ResourceSlice, and the allocated claims, beside the cluster's nodes."""

    slices: dict[str, bytes]
    claims: dict[str, bytes]
    classes: dict[str, bytes]


def _card_attributes(node_name: str, card: int, kind: str) -> dict[str, object]:
    return {
        "type": {"string": kind},
        "uuid": {"string": f"GPU-{node_name}-{card:02d}-5b2f7c1e-0d4a-4e0b-9f6a"},
        "productName": {"string": "NVIDIA A10"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Ampere"},
        "driverVersion": {"version": "580.82.7"},
        "cudaComputeCapability": {"version": "8.6.0"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "index": {"int": card},
        "minor": {"int": card},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{card + 0x17:02x}:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{card // 4:02x}"},
    }


def resource_slice(node_name: str) -> dict[str, object]:
    devices = []
    for card in range(DRA_CARDS):
        for name, kind in ((f"gpu-{card}", "gpu"), (f"gpu-vfio-{card}", "vfio")):
            devices.append(
                {
                    "name": name,
                    "attributes": _card_attributes(node_name, card, kind),
                    "capacity": {"memory": {"value": "24Gi"}},
                }
            )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node_name}-{DRA_DRIVER}-x7k2p",
            "uid": f"uid-slice-{node_name}",
            "generateName": f"{node_name}-{DRA_DRIVER}-",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": f"uid-{node_name}"}
            ],
        },
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def allocated_claim(index: int, node_name: str, card: int) -> tuple[str, dict[str, object]]:
    """A VM's claim as the scheduler and the kubelet leave it: spec, allocation, reservation."""
    namespace, name = f"tenant-{index % 40:02d}", f"virt-launcher-vm-{index:05d}-gpu-k8v2q"
    device_class = f"{DRA_CLASS}.gpuclass.cozystack.io"
    return f"{namespace}/{name}", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-claim-{index}",
            "finalizers": ["resource.kubernetes.io/delete-protection"],
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": f"virt-launcher-vm-{index:05d}",
                    "uid": f"uid-pod-{index}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRA_DRIVER,
                            "pool": node_name,
                            "device": f"gpu-vfio-{card}",
                        }
                    ],
                    "config": [],
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node_name]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [
                {
                    "resource": "pods",
                    "name": f"virt-launcher-vm-{index:05d}",
                    "uid": f"uid-pod-{index}",
                }
            ],
        },
    }


def dra_class(created: str = CREATED) -> dict[str, object]:
    return {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {
            "name": DRA_CLASS,
            "uid": f"uid-{DRA_CLASS}",
            "generation": 1,
            "creationTimestamp": created,
        },
        "spec": {
            "dra": {"driver": DRA_DRIVER, "attributes": {"type": "vfio"}},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
    }


def generate_dra(cluster: Cluster, size: str, seed: int = 7) -> DraCluster:
    """A slice for every node of the cluster, and the size's allocated claims on random cards."""
    rng = random.Random(f"{seed}-{size}-dra")
    node_names = sorted(cluster.nodes)
    slices = {}
    for node_name in node_names:
        made = resource_slice(node_name)
        slices[str(made["metadata"]["name"])] = _dumps(made)  # type: ignore[index]
    cards = rng.sample([(n, c) for n in node_names for c in range(DRA_CARDS)], DRA_CLAIMS[size])
    claims = dict(
        (key, _dumps(obj))
        for key, obj in (allocated_claim(i, n, c) for i, (n, c) in enumerate(cards))
    )
    classes = {**cluster.classes, DRA_CLASS: _dumps(dra_class())}
    return DraCluster(slices, claims, classes)


def dra_sync_body(
    cluster: Cluster, dra: DraCluster, *, parent_status: dict[str, object] | None = None
) -> bytes:
    """The /status/sync request of the DRA class: every node (the default node selector), slice
    and claim, and its DeviceClass as Metacontroller created it."""
    parent = json.loads(dra.classes[DRA_CLASS])
    if parent_status is not None:
        parent["status"] = parent_status
    device_class = f"{DRA_CLASS}.gpuclass.cozystack.io"
    owned = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {
            "name": device_class,
            "ownerReferences": [
                {
                    "apiVersion": "cozystack.io/v1alpha1",
                    "kind": "GPUClass",
                    "name": DRA_CLASS,
                    "uid": f"uid-{DRA_CLASS}",
                    "controller": True,
                }
            ],
        },
    }
    return b"".join(
        [
            b'{"controller":{"apiVersion":"metacontroller.k8s.io/v1alpha1",'
            b'"kind":"CompositeController","metadata":{"name":"gpuclass-status"}},"parent":',
            _dumps(parent),
            b',"children":{},"related":{"Node.v1":',
            *_object_map(cluster.nodes),
            b',"ResourceSlice.resource.k8s.io/v1":',
            *_object_map(dra.slices),
            b',"ResourceClaim.resource.k8s.io/v1":',
            *_object_map(dra.claims),
            b',"DeviceClass.resource.k8s.io/v1":',
            *_object_map({device_class: _dumps(owned)}),
            b',"GPUClass.cozystack.io/v1alpha1":',
            *_object_map(dra.classes),
            b'},"finalizing":false}',
        ]
    )
