"""Cozystack's own objects for the tests, read at test time from its sources: the archive in
`../shared/tools` beside the repository (CI has it there), or `GPUCLASS_COZYSTACK_ARCHIVE`. No file
of Cozystack is copied into the repository; what the tests build from it is built here, once:

- HelmReleases as Cozystack's API writes them (`pkg/registry/apps/application/rest.go`): named
  with the ApplicationDefinition's release prefix, labelled with its release labels and the
  application kind, group and name, `valuesFrom` the platform's values Secret, and `values` the
  app's spec exactly as sent (defaults are never stored);
- the schema defaults of each app (its ApplicationDefinition's `openAPISchema`);
- the cluster instance types (`packages/system/kubevirt-instancetypes`), the tenant roles
  (`packages/system/cozystack-basics/templates/clusterroles.yaml`) and the tenant chart rendered
  with helm (`packages/apps/tenant`).

KubernetesNodes has no ApplicationDefinition in these sources: its release is built by the same
rules as every other kind, with the prefix the budgets name (`kubernetes-nodes-`).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests import ROOT

COMMIT = "3c780acd"
TOP = f"cozystack-{COMMIT}/"
KIND_LABEL = "apps.cozystack.io/application.kind"
GROUP_LABEL = "apps.cozystack.io/application.group"
NAME_LABEL = "apps.cozystack.io/application.name"
APPS_GROUP = "apps.cozystack.io"
DEFINITIONS = {
    "Tenant": "packages/system/tenant-rd/cozyrds/tenant.yaml",
    "VMInstance": "packages/system/vm-instance-rd/cozyrds/vm-instance.yaml",
    "Kubernetes": "packages/system/kubernetes-rd/cozyrds/kubernetes.yaml",
}
KUBERNETES_NODES_PREFIX = "kubernetes-nodes-"
REST = "pkg/registry/apps/application/rest.go"
ARCHIVE_VARIABLE = "GPUCLASS_COZYSTACK_ARCHIVE"


def archive() -> Path:
    configured = os.environ.get(ARCHIVE_VARIABLE)
    path = (
        Path(configured)
        if configured
        else ROOT.parent / "shared" / "tools" / f"cozystack-{COMMIT}.tar.gz"
    )
    if not path.is_file():
        raise FileNotFoundError(
            f"Cozystack's sources are not at {path}: the tests build Cozystack's objects from "
            f"them (set {ARCHIVE_VARIABLE} to the archive)"
        )
    return path


@functools.cache
def _files() -> dict[str, bytes]:
    with tarfile.open(archive()) as tar:
        return {
            member.name.removeprefix(TOP): tar.extractfile(member).read()  # type: ignore[union-attr]
            for member in tar.getmembers()
            if member.isfile()
        }


def text(path: str) -> str:
    """A file of the sources, by its path in Cozystack's repository."""
    return _files()[path].decode()


@functools.cache
def source_tree() -> Path:
    """The sources unpacked once per test run (helm renders charts from a directory)."""
    where = Path(tempfile.mkdtemp(prefix="cozystack-"))
    with tarfile.open(archive()) as tar:
        tar.extractall(where, filter="tar")
    return where / TOP.rstrip("/")


@functools.cache
def application_definition(kind: str) -> dict[str, Any]:
    definition: dict[str, Any] = yaml.safe_load(text(DEFINITIONS[kind]))
    return definition


def schema(kind: str) -> dict[str, Any]:
    """The app's values schema, as Cozystack's API validates and defaults a spec."""
    spec = application_definition(kind)["spec"]["application"]
    parsed: dict[str, Any] = json.loads(spec["openAPISchema"])
    return parsed


def node_group_schema() -> dict[str, Any]:
    """The schema of each of the Kubernetes app's node groups."""
    node_groups: dict[str, Any] = schema("Kubernetes")["properties"]["nodeGroups"]
    return dict(node_groups["additionalProperties"])


def release_prefix(kind: str) -> str:
    if kind == "KubernetesNodes":
        return KUBERNETES_NODES_PREFIX
    prefix: str = application_definition(kind)["spec"]["release"]["prefix"]
    return prefix


def plural(kind: str) -> str:
    if kind == "KubernetesNodes":
        return "kubernetesnodeses"
    name: str = application_definition(kind)["spec"]["application"]["plural"]
    return name


@functools.cache
def platform_values() -> dict[str, str]:
    """The `valuesFrom` entry `rest.go` writes on every release, read from its source."""
    source = text(REST)
    block = re.search(r"ValuesFrom: \[\]helmv2\.ValuesReference\{(.*?)\n\t\t\t\},", source, re.S)
    if block is None:
        raise LookupError(f"{REST} no longer writes valuesFrom as the tests read it")
    fields = dict(re.findall(r'(\w+): +"([^"]*)"', block.group(1)))
    return {"kind": fields["Kind"], "name": fields["Name"]}


def helmrelease(
    kind: str,
    namespace: str,
    name: str,
    values: Any,
    *,
    name_label: bool = True,
    release_name: str | None = None,
) -> dict[str, Any]:
    """A HelmRelease as Cozystack's API writes it for the app `name` of this kind created with
    this spec (`values`, stored as sent). `name_label=False` leaves out the application-name
    label, as migrated releases may; `release_name` names a release written by hand."""
    labels: dict[str, str] = {}
    if kind != "KubernetesNodes":
        labels.update(application_definition(kind)["spec"]["release"].get("labels") or {})
    labels[KIND_LABEL] = kind
    labels[GROUP_LABEL] = APPS_GROUP
    if name_label:
        labels[NAME_LABEL] = name
    spec: dict[str, Any] = {"valuesFrom": [dict(platform_values())], "values": values}
    if kind != "KubernetesNodes":
        chart = application_definition(kind)["spec"]["release"]["chartRef"]
        spec = {"chartRef": copy.deepcopy(chart), **spec}
    return {
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {
            "name": release_name or release_prefix(kind) + name,
            "namespace": namespace,
            "labels": labels,
        },
        "spec": spec,
    }


def _documents(path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text(path)) if d]


@functools.cache
def instance_types() -> tuple[dict[str, Any], ...]:
    """Every cluster instance type Cozystack installs, the `gn1.*` series (GPUs) among them."""
    base = "packages/system/kubevirt-instancetypes/templates/"
    return tuple(
        d
        for name in ("instancetypes.yaml", "extra-instancetypes.yaml")
        for d in _documents(base + name)
        if d["kind"] == "VirtualMachineClusterInstancetype"
    )


def gpu_instance_types() -> dict[str, list[str]]:
    """The instance types that attach GPUs, and the resources they attach."""
    return {
        t["metadata"]["name"]: [gpu["deviceName"] for gpu in t["spec"]["gpus"]]
        for t in instance_types()
        if t["spec"].get("gpus")
    }


def tenant_roles() -> list[dict[str, Any]]:
    """The tenant ClusterRoles (`cozy:tenant` and its view, use, admin and super-admin roles)."""
    return _documents("packages/system/cozystack-basics/templates/clusterroles.yaml")


def render_tenant(
    name: str, release_namespace: str, values: dict[str, Any]
) -> list[dict[str, Any]]:
    """The tenant chart as Cozystack's HelmRelease `tenant-<name>` installs it."""
    chart = source_tree() / "packages" / "apps" / "tenant"
    values_file = chart.parent / f"values-{name}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    rendered = subprocess.run(
        [
            "helm",
            "template",
            f"tenant-{name}",
            str(chart),
            "-n",
            release_namespace,
            "-f",
            str(values_file),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def _crd(group: str, version: str, kind: str, plural: str, singular: str, scope: str) -> Any:
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": singular},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "properties": {"spec": schema}}
                    },
                }
            ],
        },
    }


def app_crds() -> list[dict[str, Any]]:
    """CRDs standing for what Cozystack's aggregated API serves, named as its
    ApplicationDefinitions name its apps (KubernetesNodes as the budgets name it), and Flux's
    HelmRelease, which stores every app. Specs are kept whole and never defaulted, as Cozystack
    stores them; so the API server calls the webhook for the apps as it would for Cozystack's."""
    crds = []
    for kind in DEFINITIONS:
        names = application_definition(kind)["spec"]["application"]
        crds.append(
            _crd(APPS_GROUP, "v1alpha1", kind, names["plural"], names["singular"], "Namespaced")
        )
    crds.append(
        _crd(
            APPS_GROUP,
            "v1alpha1",
            "KubernetesNodes",
            plural("KubernetesNodes"),
            "kubernetesnodes",
            "Namespaced",
        )
    )
    crds.append(
        _crd(
            "helm.toolkit.fluxcd.io",
            "v2",
            "HelmRelease",
            "helmreleases",
            "helmrelease",
            "Namespaced",
        )
    )
    return crds
