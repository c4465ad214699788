"""Tiny builders of the objects Metacontroller sends, as plain JSON-shaped dicts.

Tests build dicts (what is on the wire) and decode them with `as_wire` when a rule needs the
typed form, so that the decoding is exercised by the same tests.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import yaml

from hooks.cli import offline
from hooks.rules.budget.scope import Read, ReleasesIn, TenantsNamed, UnnamedTenants, read_scope
from hooks.rules.budget.tenancy import App, Tenancy, Tenant
from hooks.rules.dra import PCI_BUS_ID
from hooks.wire.admission import AdmissionRequest, decode_review
from tests import cozystack

if TYPE_CHECKING:
    from flask.testing import FlaskClient

GPU = "nvidia.com/NVIDIA_L40S-24Q"
OTHER_GPU = "nvidia.com/GH100_H100_PCIE"
API_VERSION = "cozystack.io/v1alpha1"
TOKEN = b"secret-token-\x00\xff-value\n"


def node(
    name: str,
    *,
    gpus: int | str | None = 4,
    resource: str = GPU,
    ready: str | None = "True",
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
    labels: dict[str, str] | None = None,
    capacity: int | str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"capacity": {"cpu": "64"}, "allocatable": {"cpu": "63500m"}}
    if gpus is not None:
        status["allocatable"][resource] = str(gpus)
        status["capacity"][resource] = str(capacity if capacity is not None else gpus)
    if ready is not None:
        status["conditions"] = [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": ready},
        ]
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "uid": f"uid-{name}"},
        "spec": spec,
        "status": status,
    }


def container(
    name: str = "compute",
    *,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {"name": name, "image": "registry/virt-launcher:v1"}
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    result["resources"] = resources
    if restart_policy is not None:
        result["restartPolicy"] = restart_policy
    return result


def pod(
    name: str,
    *,
    node_name: str | None = "gpu-1",
    gpus: int | str | None = 1,
    resource: str = GPU,
    namespace: str = "tenant-a",
    phase: str = "Running",
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    overhead: dict[str, str] | None = None,
    terminating: bool = False,
) -> dict[str, Any]:
    if containers is None:
        requests = {"cpu": "1"} | ({resource: str(gpus)} if gpus is not None else {})
        containers = [container(requests=requests, limits=dict(requests))]
    spec: dict[str, Any] = {"containers": containers}
    if node_name is not None:
        spec["nodeName"] = node_name
    if init_containers is not None:
        spec["initContainers"] = init_containers
    if overhead is not None:
        spec["overhead"] = overhead
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if terminating:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase},
    }


def gpuclass(
    name: str,
    *,
    resource: str | None = GPU,
    created: str | None = "2026-01-01T00:00:00Z",
    generation: int = 1,
    tolerations: list[dict[str, Any]] | None = None,
    license: dict[str, Any] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    deleting: bool = False,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if spec is None:
        spec = {}
        if resource is not None:
            spec["resourceName"] = resource
        if tolerations is not None:
            spec["tolerations"] = tolerations
        if license is not None:
            spec["license"] = license
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "generation": generation}
    if created is not None:
        metadata["creationTimestamp"] = created
    if deleting:
        metadata["deletionTimestamp"] = "2026-06-01T00:00:00Z"
    result: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "GPUClass",
        "metadata": metadata,
        "spec": spec,
    }
    if conditions is not None:
        result["status"] = {"observedGeneration": generation, "conditions": conditions}
    return result


def namespace(
    name: str, *, entitled: bool = True, phase: str = "Active", terminating: bool = False
) -> dict[str, Any]:
    labels = {"kubernetes.io/metadata.name": name}
    if entitled:
        labels["namespace.cozystack.io/vgpu"] = "true"
    metadata: dict[str, Any] = {"name": name, "labels": labels, "uid": f"uid-ns-{name}"}
    if terminating:
        metadata["deletionTimestamp"] = "2026-06-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": metadata,
        "status": {"phase": phase},
    }


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def secret(
    name: str,
    namespace: str,
    *,
    data: dict[str, bytes] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner_uid: str | None = None,
    resource_version: str = "100",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-secret-{namespace}-{name}",
        "resourceVersion": resource_version,
        "creationTimestamp": "2026-02-01T00:00:00Z",
    }
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    if owner_uid is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": "GPUClass",
                "name": "owner",
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata,
        "data": {k: b64(v) for k, v in (data or {}).items()},
    }


def keyed(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A Metacontroller object map: `namespace/name` for namespaced objects, else `name`."""
    result = {}
    for obj in objects:
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
        result[key] = obj
    return result


# --- Dynamic Resource Allocation ----------------------------------------------------------------

DRIVER = "gpu.nvidia.com"


def device(
    name: str,
    kind: str = "vfio",
    bus: str | None = None,
    taints: list[dict[str, str]] | None = None,
    draws: dict[str, str] | None = None,
) -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": kind}, "index": {"int": 0}}
    if bus is not None:
        attributes[PCI_BUS_ID] = {"string": bus}
    made: dict[str, Any] = {"name": name, "attributes": attributes}
    if taints:
        made["taints"] = taints
    if draws:
        made["consumesCounters"] = [
            {"counterSet": "card", "counters": {k: {"value": v} for k, v in draws.items()}}
        ]
    return made


def resource_slice(
    pool: str,
    devices: list[dict[str, Any]],
    *,
    node_name: str | None = None,
    generation: int = 1,
    count: int = 1,
    counters: dict[str, str] | None = None,
    driver: str = DRIVER,
    name: str | None = None,
) -> dict[str, Any]:
    """A slice as a driver publishes it: on one node, or (no node) on every node."""
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
        "devices": devices,
    }
    if node_name is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node_name
    if counters:
        spec["sharedCounters"] = [
            {"name": "card", "counters": {k: {"value": v} for k, v in counters.items()}}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{pool}-{generation}"},
        "spec": spec,
    }


def claim(
    *held: tuple[str, str], admin: bool = False, name: str = "c", namespace: str = "tenant-a"
) -> dict[str, Any]:
    """A claim as the scheduler leaves it: the (pool, device) it was allocated."""
    results = [
        {"driver": DRIVER, "pool": pool, "device": device, "request": "gpu", "adminAccess": admin}
        for pool, device in held
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def taint_rule(
    name: str,
    selector: dict[str, str] | None,
    *,
    effect: str = "NoSchedule",
    key: str = "maintenance",
) -> dict[str, Any]:
    """A DeviceTaintRule as an administrator writes it: `selector` holds the set fields of its
    deviceSelector (driver, pool, device); None leaves the selector out."""
    spec: dict[str, Any] = {"taint": {"key": key, "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": spec,
    }


def dra_class(name: str, attributes: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """A DRA class of the driver's vfio devices (or these attributes)."""
    dra = {"driver": DRIVER, "attributes": attributes or {"type": "vfio"}}
    return gpuclass(name, resource=None, spec={"dra": dra, **kwargs.pop("spec", {})}, **kwargs)


def dra_sync_request(
    parent: dict[str, Any],
    *,
    nodes: list[dict[str, Any]] = (),  # type: ignore[assignment]
    slices: list[dict[str, Any]] = (),  # type: ignore[assignment]
    claims: list[dict[str, Any]] = (),  # type: ignore[assignment]
    device_classes: list[dict[str, Any]] = (),  # type: ignore[assignment]
    classes: list[dict[str, Any]] | None = None,
    taint_rules: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A DRA class's sync request, with the groups its customize asks for (DeviceTaintRules only
    when given: the customize asks for them only where they are served)."""
    request = status_sync_request(parent, nodes=nodes, classes=classes)
    del request["related"]["Pod.v1"]
    request["related"] |= {
        "ResourceSlice.resource.k8s.io/v1": keyed(list(slices)),
        "ResourceClaim.resource.k8s.io/v1": keyed(list(claims)),
        "DeviceClass.resource.k8s.io/v1": keyed(list(device_classes)),
    }
    if taint_rules is not None:
        request["related"]["DeviceTaintRule.resource.k8s.io/v1beta2"] = keyed(taint_rules)
    return request


def status_sync_request(
    parent: dict[str, Any],
    *,
    nodes: list[dict[str, Any]] = (),  # type: ignore[assignment]
    pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
    classes: list[dict[str, Any]] | None = None,
    secrets: list[dict[str, Any]] | None = None,
    namespaces: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    related: dict[str, Any] = {
        "Node.v1": keyed(list(nodes)),
        "Pod.v1": keyed(list(pods)),
        "GPUClass.cozystack.io/v1alpha1": keyed(classes if classes is not None else [parent]),
    }
    if secrets is not None:
        related["Secret.v1"] = keyed(secrets)
    if namespaces is not None:
        related["Namespace.v1"] = keyed(namespaces)
    return {
        "controller": {"kind": "CompositeController", "metadata": {"name": "gpuclass-status"}},
        "parent": parent,
        "children": {},
        "related": related,
        "finalizing": False,
    }


def as_wire(obj: dict[str, Any], kind: type) -> Any:
    return msgspec.json.decode(json.dumps(obj).encode(), type=kind)


SOURCE_NS = "cozy-gpu-operator"
SOURCE_NAME = "nvidia-license"
TOKEN_KEY = "client_configuration_token.tok"
LICENSE = {"secretRef": {"name": SOURCE_NAME}, "featureType": 1}


def licensed_class(name: str = "l40s", **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("license", LICENSE)
    return gpuclass(name, **kwargs)


def source_secret(token: bytes = TOKEN, **extra: bytes) -> dict[str, Any]:
    return secret(
        SOURCE_NAME, SOURCE_NS, data={TOKEN_KEY: token, "other-key": b"not copied", **extra}
    )


def managed_copy(
    class_name: str, namespace: str, token: bytes = TOKEN, *, resource_version: str = "7"
) -> dict[str, Any]:
    """A copy as Metacontroller shows it after applying it: server fields and its annotations."""
    copy = secret(
        f"gpuclass-{class_name}-license",
        namespace,
        data={TOKEN_KEY: token, "gridd.conf": b"FeatureType=1\n"},
        labels={
            "gpuclass.cozystack.io/class": class_name,
            "gpuclass.cozystack.io/license-copy": "true",
        },
        annotations={
            "gpuclass.cozystack.io/source": f"{SOURCE_NS}/{SOURCE_NAME}",
            "gpuclass.cozystack.io/token-sha256": "0" * 64,
            "metacontroller.k8s.io/decorator-controller": "gpuclass-license",
            "metacontroller.k8s.io/last-applied-configuration": "{}",
        },
        owner_uid=f"uid-{class_name}",
        resource_version=resource_version,
    )
    copy["metadata"]["managedFields"] = [{"manager": "metacontroller", "operation": "Update"}]
    return copy


def orphaned_copy(class_name: str, namespace: str) -> dict[str, Any]:
    """A Secret of the copy's name with our labels that no class manages (no owner)."""
    return secret(
        f"gpuclass-{class_name}-license",
        namespace,
        labels={
            "gpuclass.cozystack.io/class": class_name,
            "gpuclass.cozystack.io/license-copy": "true",
        },
    )


def license_sync_request(
    target: dict[str, Any],
    *,
    secrets: list[dict[str, Any]] | None = None,
    namespaces: list[dict[str, Any]] | None = None,
    attachments: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    related: dict[str, Any] = {}
    if secrets is not None:
        related["Secret.v1"] = keyed(secrets)
    if namespaces is not None:
        related["Namespace.v1"] = keyed(namespaces)
    return {
        "controller": {"kind": "DecoratorController", "metadata": {"name": "gpuclass-license"}},
        "object": target,
        "attachments": {"Secret.v1": keyed(attachments or [])},
        "related": related,
        "finalizing": False,
    }


# --- GPU budgets: HelmReleases as Cozystack stores apps, and AdmissionReviews ------------------


def helmrelease(kind: str, namespace: str, name: str, values: dict[str, Any]) -> dict[str, Any]:
    """An app's HelmRelease as Cozystack's API writes it (`tests.cozystack`)."""
    return cozystack.helmrelease(kind, namespace, name, values)


def gpus(*resources: str) -> list[dict[str, str]]:
    return [{"name": r} for r in resources]


def app_object(kind: str, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A Cozystack app (VMInstance, KubernetesNodes, Tenant) as its API serves it."""
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def review_request(
    kind: str, namespace: str, name: str, spec: Any, **review: Any
) -> AdmissionRequest:
    """`admission_review`'s request, decoded as the webhook's route decodes it."""
    body = admission_review(kind, namespace, name, spec, **review)
    return decode_review(msgspec.json.encode(body))


def tenant_request(
    namespace: str, name: str, quotas: Any, old: Any = None, **review: Any
) -> AdmissionRequest:
    """A review of the Tenant release `name` in `namespace` declaring `quotas`, decoded as the
    webhook's route decodes it: a create, or an update from `old` when given."""
    if old is not None:
        review.update(operation="UPDATE", old_spec={"resourceQuotas": old})
    return review_request("Tenant", namespace, name, {"resourceQuotas": quotas}, **review)


def admission_review(
    kind: str,
    namespace: str,
    name: str,
    spec: dict[str, Any],
    *,
    operation: str = "CREATE",
    old_spec: dict[str, Any] | None = None,
    uid: str = "8c1f5e2a-0c4d-4b5e-9a51-3d2f1b0e7a11",
) -> dict[str, Any]:
    resource = cozystack.plural(kind)

    def app(app_spec: dict[str, Any]) -> dict[str, Any]:
        return app_object(kind, namespace, name, app_spec)

    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "apps.cozystack.io", "version": "v1alpha1", "resource": resource},
            "requestKind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": kind},
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "tenant-admin", "groups": ["system:authenticated"]},
            "object": app(spec),
            "oldObject": app(old_spec) if old_spec is not None else None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"},
        },
    }


def tenant(
    parent_ns: str,
    name: str,
    declaration: Mapping[str, int | None] | None = None,
    *,
    release: str = "",
) -> Tenant:
    """A Tenant as the budget rules read it: declared in `parent_ns`, bounded when it declares
    anything; `release` names its HelmRelease ("" for the object under review)."""
    return Tenant(parent_ns, name, dict(declaration or {}), release=release)


from tests import EXAMPLES  # noqa: E402 (re-exported for the test modules)


def conditions_in_order(*, licensed: bool = False, dra: bool = False) -> list[str]:
    """The condition types a class's status holds, in the registry's order: a test that sees a
    whole status compares with this, so that a new condition breaks only its own test. A class
    that names no license has no license conditions; a DRA class has its own in place of a
    device-plugin class's."""
    from hooks.rules import conditions as c
    from hooks.rules.class_status import ORDER

    of_the_license = {c.LICENSE_SECRET_MISSING, c.LICENSE_COPY_CONFLICT}
    of_dra = {
        c.DEVICE_CLASS_CONFLICT,
        c.DRA_NOT_ENABLED,
        c.DRIVER_NOT_PUBLISHING,
        c.POOLS_INCOMPLETE,
    }
    of_devices_plugins = {
        c.RESOURCE_NAME_CONFLICT,
        c.RESOURCE_NAME_NOT_PERMITTED,
        c.RESOURCE_NOT_ADVERTISED,
    }
    left_out = (set() if licensed else of_the_license) | (of_devices_plugins if dra else of_dra)
    return [kind for kind in ORDER if kind not in left_out]


def labels_answered(client: FlaskClient, route: str, body: dict[str, Any]) -> dict[str, Any]:
    """The labels a labelling decorator's sync answers: exactly its envelope, which attaches
    nothing and leaves the status alone (null removes a label)."""
    response = client.post(route, json=body)
    assert response.status_code == 200, response.get_data()
    answer = response.get_json()
    assert set(answer) == {"labels", "attachments", "status"}
    assert (answer["attachments"], answer["status"]) == ([], None)
    labels: dict[str, Any] = answer["labels"]
    return labels


def example_of(route: str) -> bytes:
    """The example request of a hook: `examples/<route with dashes>.json`, e.g. status-sync.json."""
    return (EXAMPLES / f"{route.strip('/').replace('/', '-')}.json").read_bytes()


class ReleaseLists(Protocol):
    """A test's cluster, listing releases as the API server's label selections would."""

    def tenants(self, release_namespace: str, names: Sequence[str]) -> list[Tenant | App]: ...
    def unnamed(self, release_namespace: str) -> list[Tenant | App]: ...
    def namespace(self, namespace: str) -> list[Tenant | App]: ...


def answering(lists: ReleaseLists) -> Callable[[Read], list[Tenant | App]]:
    """Each read of `scoped_reads` answered from a test's cluster."""

    def read(request: Read) -> list[Tenant | App]:
        match request:
            case TenantsNamed(release_namespace, names):
                return lists.tenants(release_namespace, names)
            case UnnamedTenants(release_namespace):
                return lists.unnamed(release_namespace)
            case ReleasesIn(namespace):
                return lists.namespace(namespace)

    return read


def scoped_tenancy(
    lists: ReleaseLists, namespaces: Iterable[str], subtrees: Iterable[str] = ()
) -> Tenancy:
    """The tenancy a review of these namespaces reads from a test's cluster."""
    return read_scope(namespaces, answering(lists), subtrees)


def inventory_of(items: Sequence[dict[str, Any]]) -> offline.Inventory:
    """A cluster of these objects as plan holds a dump of it (each of a kind the hooks read)."""
    inventory = offline.Inventory()
    for obj in items:
        related = offline.KINDS[(obj["apiVersion"], obj["kind"])]
        inventory.objects.setdefault((obj["apiVersion"], related.resource), []).append(obj)
    return inventory


def tenancy_items() -> list[dict[str, Any]]:
    """The example tenancy (examples/tenancy.yaml): namespaces, classes and releases."""
    items: list[dict[str, Any]] = yaml.safe_load((EXAMPLES / "tenancy.yaml").read_text())["items"]
    return items
