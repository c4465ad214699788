"""gpuclass-hooks plan: selection semantics, the example cluster, --explain, and equality with
the hooks' own answers for the same objects."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import msgspec
import pytest
import yaml

from hooks import cli
from hooks.cli import offline
from hooks.controllers import budget_report
from hooks.rules.selectors import RuleError
from hooks.serving.app import create_app
from hooks.settings import Settings
from hooks.wire.metacontroller import (
    RELATED_KINDS,
    CustomizeResponse,
    LabelSelector,
    RelatedRule,
    Requirement,
)
from tests import ROOT, builders

CLUSTER = ROOT / "examples" / "cluster.yaml"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
TOKEN = base64.b64decode("RVhBTVBMRS1OT1QtQS1SRUFMLVRPS0VOCg==")


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_plan(*args: str, env: dict[str, str] | None = None) -> Ran:
    """`gpuclass-hooks plan` run in this process (so that a mutant of the planner is seen by the
    test), in an environment with no GPUCLASS_ setting but those of `env`."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("GPUCLASS_")}
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, {**clean, **(env or {})}, clear=True),
        redirect_stdout(out),
        redirect_stderr(err),
    ):
        try:
            code = cli.main(["plan", *args])
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 2
    return Ran(code, out.getvalue(), err.getvalue())


def test_plan_runs_as_a_command_of_its_own() -> None:
    # The tests below call the planner in this process; this is the installed entry point. (The
    # table, as its JSON holds condition times.)
    result = subprocess.run(
        [sys.executable, "-m", "hooks.cli", "plan", str(CLUSTER)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == run_plan(str(CLUSTER)).stdout
    assert "l40s-24q" in result.stdout


def inventory() -> offline.Inventory:
    return offline.load([CLUSTER], Settings())


def names(group: dict[str, Any]) -> list[str]:
    return sorted(group)


# --- the selection semantics of related rules ----------------------------------------------------


def test_names_with_namespace_select_that_object_only() -> None:
    rule = RelatedRule(
        api_version="v1",
        resource="secrets",
        namespace="cozy-gpu-operator",
        names=["nvidia-license"],
    )
    assert names(offline.select_related([rule], inventory())["Secret.v1"]) == [
        "cozy-gpu-operator/nvidia-license"
    ]


def test_names_without_namespace_select_the_name_in_every_namespace() -> None:
    rule = RelatedRule(
        api_version="v1", resource="secrets", names=["gpuclass-l40s-24q-license", "nvidia-license"]
    )
    assert names(offline.select_related([rule], inventory())["Secret.v1"]) == [
        "cozy-gpu-operator/nvidia-license",
        "tenant-b/gpuclass-l40s-24q-license",
    ]


def test_label_selector_with_set_based_expressions() -> None:
    selector = LabelSelector(
        match_expressions=[
            Requirement(key="namespace.cozystack.io/vgpu", operator="In", values=["true"])
        ]
    )
    rule = RelatedRule(api_version="v1", resource="namespaces", label_selector=selector)
    assert names(offline.select_related([rule], inventory())["Namespace.v1"]) == [
        "tenant-a",
        "tenant-b",
        "tenant-c",
    ]
    exists = RelatedRule(
        api_version="v1",
        resource="namespaces",
        label_selector=LabelSelector(
            match_expressions=[Requirement(key="namespace.cozystack.io/vgpu", operator="Exists")]
        ),
    )
    assert "tenant-d" in offline.select_related([exists], inventory())["Namespace.v1"]


def test_namespace_selector_selects_by_the_namespace_labels() -> None:
    rule = RelatedRule(
        api_version="v1",
        resource="pods",
        namespace_selector=LabelSelector(match_labels={"namespace.cozystack.io/vgpu": "true"}),
    )
    assert names(offline.select_related([rule], inventory())["Pod.v1"]) == [
        "tenant-a/virt-launcher-vm-render-x7k2p",
        "tenant-a/web-5d9f7c",
        "tenant-b/virt-launcher-vm-old-m2v8d",
        "tenant-b/virt-launcher-vm-train-q9w4t",
    ]


def test_no_selector_and_empty_names_select_everything() -> None:
    everything = RelatedRule(api_version="v1", resource="nodes")
    empty_names = RelatedRule(api_version="v1", resource="nodes", names=[])
    assert len(offline.select_related([everything], inventory())["Node.v1"]) == 5
    assert len(offline.select_related([empty_names], inventory())["Node.v1"]) == 5


def test_a_group_is_sent_for_every_rule_even_when_nothing_matches() -> None:
    rule = RelatedRule(api_version="v1", resource="secrets", names=["absent"])
    assert offline.select_related([rule], inventory()) == {"Secret.v1": {}}


def test_a_label_selector_within_one_namespace_selects_there_only() -> None:
    """Metacontroller v4.17.2 serves it (`selectByNamespaceAndLabels`): the budget report's
    claimant rules are of this shape."""
    rule = RelatedRule(
        api_version="v1",
        resource="pods",
        namespace="tenant-a",
        label_selector=LabelSelector(match_labels={"kubevirt.io": "virt-launcher"}),
    )
    selected = offline.select_related([rule], inventory())["Pod.v1"]
    assert selected and {key.split("/")[0] for key in selected} == {"tenant-a"}


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (
            RelatedRule(
                api_version="v1", resource="secrets", names=["a"], label_selector=LabelSelector()
            ),
            "names cannot be combined with labelSelector or namespaceSelector",
        ),
        (
            RelatedRule(
                api_version="v1", resource="pods", names=["a"], namespace_selector=LabelSelector()
            ),
            "names cannot be combined with labelSelector or namespaceSelector",
        ),
        (
            RelatedRule(
                api_version="v1", resource="pods", namespace="x", namespace_selector=LabelSelector()
            ),
            "namespace cannot be combined with namespaceSelector",
        ),
    ],
)
def test_rules_metacontroller_refuses_are_refused_with_a_clear_message(
    rule: RelatedRule, message: str
) -> None:
    with pytest.raises(RuleError, match=message):
        offline.select_related([rule], inventory())


# --- the example cluster ----------------------------------------------------------------------------

EXPECTED_TABLE = """\
CLASS        RESOURCE                    FREE  MAX/NODE  READY  NOT FINE
h100         nvidia.com/GH100_H100_PCIE  2     2         True   -
h100-legacy  nvidia.com/GH100_H100_PCIE  0     0         False  ResourceNameConflict: OlderClassHasResource, Ready: ResourceNameConflict
l40s-24q     nvidia.com/NVIDIA_L40S-24Q  1     1         True   LicenseCopyConflict: ForeignSecret

License copies of l40s-24q: source usable: license Secret cozy-gpu-operator/nvidia-license holds a token
  copy in:  tenant-a
  skipped:  tenant-b (holds a Secret of the copy's name that is not a managed copy); tenant-c (terminating: no new copy)

Ignored 1 object of other kinds.
"""


def test_plan_on_the_example_cluster_prints_the_expected_table() -> None:
    result = run_plan(str(CLUSTER))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == EXPECTED_TABLE


def test_explain_a_cordoned_node() -> None:
    result = run_plan(str(CLUSTER), "--explain", "l40s-24q")
    assert result.returncode == 0
    assert (
        "gpu-l40s-1  yes     -         2            1     1     tenant-a/virt-launcher-vm-render-x7k2p (1)"
        in result.stdout
    )
    assert "gpu-l40s-2  no      cordoned  2            0     -     -" in result.stdout


def test_explain_a_tainted_node_and_finished_pods() -> None:
    result = run_plan(str(CLUSTER), "--explain", "h100")
    lines = result.stdout.splitlines()
    tainted = next(line for line in lines if line.startswith("gpu-h100-2"))
    assert "no" in tainted and "taint maintenance=firmware:NoExecute not tolerated" in tainted
    counted = next(line for line in lines if line.startswith("gpu-h100-1"))
    assert "tenant-b/virt-launcher-vm-train-q9w4t (2)" in counted
    assert "vm-old" not in result.stdout  # Succeeded: its units are free again


def test_explain_of_an_unknown_class_is_refused() -> None:
    result = run_plan(str(CLUSTER), "--explain", "nope")
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "plan: no class named nope in the input",
    )


def test_flags_override_the_environment() -> None:
    disabled = run_plan(str(CLUSTER), "--enabled", "false", "-o", "json")
    assert [c["status"] for c in json.loads(disabled.stdout)["classes"]] == [{}, {}, {}]
    selected = run_plan(
        str(CLUSTER),
        "--pod-selector",
        "app=web",
        "--explain",
        "h100",
        "-o",
        "json",
        env={"GPUCLASS_POD_SELECTOR": "kubevirt.io=virt-launcher"},
    )
    h100 = next(c for c in json.loads(selected.stdout)["classes"] if c["name"] == "h100")
    assert h100["status"]["free"] == 4


def test_json_and_yaml_carry_the_same_content_and_never_the_token() -> None:
    as_json = json.loads(run_plan(str(CLUSTER), "-o", "json").stdout)
    as_yaml = yaml.safe_load(run_plan(str(CLUSTER), "-o", "yaml").stdout)
    for doc in (as_json, as_yaml):
        for entry in doc["classes"]:
            for condition in entry["status"].get("conditions", []):
                condition.pop("lastTransitionTime")
    assert as_json == as_yaml
    [copy] = next(c for c in as_json["classes"] if c["name"] == "l40s-24q")["attachments"]
    assert copy["data"]["client_configuration_token.tok"] == offline.REDACTED
    for output in ("table", "json", "yaml"):
        text = run_plan(str(CLUSTER), "-o", output, "--explain", "l40s-24q").stdout
        assert TOKEN.strip().decode() not in text
        assert base64.b64encode(TOKEN).decode() not in text


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read: No such file or directory"),
        (b"\xff\xfe", "cannot read: 'utf-8' codec can't decode byte 0xff in position 0: invalid"),
        ("a: [unclosed", "not JSON or YAML: while parsing a flow sequence"),
        ('{"kind": ', "not JSON or YAML: Expecting value: line 1 column 10 (char 9)"),
        ('\n {"kind": ', "not JSON or YAML: Expecting value: line 2 column 11 (char 11)"),
        ("- 1\n- 2\n", "expected Kubernetes objects, found int"),
        ("\n  [1]", "expected Kubernetes objects, found int"),
        ("[1,]", "not JSON or YAML: Expecting value: line 1 column 4 (char 3)"),
        ("kind: Node\nmetadata: {}\n", "an object has no kind, apiVersion or metadata.name"),
        ("apiVersion: v1\nkind: Node\nmetadata: {}\n", "an object has no kind, apiVersion or"),
        ("apiVersion: v1\nkind: Node\nmetadata: []\n", "an object has no kind, apiVersion or"),
        ("kind: List\nitems:\n- {}\n", "an object has no kind, apiVersion or metadata.name"),
    ],
    ids=[
        "missing",
        "binary",
        "bad-yaml",
        "bad-json",
        "bad-json-indented",
        "ints",
        "json-ints",
        "json-list",
        "nameless",
        "no-name",
        "metadata-list",
        "list-item",
    ],
)
def test_unreadable_input_exits_2_with_one_line_naming_the_file(
    tmp_path: Path, content: str | bytes | None, problem: str
) -> None:
    path = tmp_path / "dump.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    result = run_plan(str(CLUSTER), str(path))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"plan: {path}: {problem}")


# One object of every kind plan reads (the hooks' related kinds, and KubeVirt), each broken where
# plan or the hooks read it: labels of the wrong shape, and a field of the kind of the wrong shape.
MALFORMED = [
    ("v1", "Node", {"metadata": {"name": "n", "labels": ["gpu"]}}, "metadata.labels"),
    ("v1", "Node", {"metadata": {"name": "n"}, "status": {"allocatable": []}}, "status"),
    ("v1", "Pod", {"metadata": {"name": "p", "namespace": "t", "labels": "x"}}, "metadata.labels"),
    ("v1", "Pod", {"metadata": {"name": "p", "namespace": "t"}, "spec": []}, "spec"),
    ("v1", "Namespace", {"metadata": {"name": "t", "labels": {"a": 1}}}, "metadata.labels[...]"),
    ("v1", "Secret", {"metadata": {"name": "s", "namespace": "t"}, "data": []}, "data"),
    (
        "v1",
        "Secret",
        {"metadata": {"name": "s", "namespace": "t", "labels": []}},
        "metadata.labels",
    ),
    (
        "cozystack.io/v1alpha1",
        "GPUClass",
        {"metadata": {"name": "c", "labels": []}, "spec": {"resourceName": "nvidia.com/X"}},
        "metadata.labels",
    ),
    (
        "helm.toolkit.fluxcd.io/v2",
        "HelmRelease",
        {"metadata": {"name": "tenant-a", "namespace": "tenant-root", "labels": []}},
        "metadata.labels",
    ),
    (
        "kubevirt.io/v1",
        "KubeVirt",
        {
            "metadata": {"name": "kubevirt", "namespace": "cozy-kubevirt"},
            "spec": {"configuration": 1},
        },
        "spec.configuration",
    ),
    (
        "instancetype.kubevirt.io/v1beta1",
        "VirtualMachineClusterInstancetype",
        {"metadata": {"name": "gn1.xlarge"}, "spec": {"gpus": [{"name": "gpu1"}]}},
        "spec.gpus[0]",
    ),
    (
        "resource.k8s.io/v1",
        "ResourceSlice",
        {"metadata": {"name": "s"}, "spec": {"pool": {"generation": "1"}}},
        "spec.pool.generation",
    ),
    (
        "resource.k8s.io/v1",
        "ResourceClaim",
        {"metadata": {"name": "c", "namespace": "t"}, "status": {"allocation": []}},
        "status.allocation",
    ),
    (
        "resource.k8s.io/v1",
        "DeviceClass",
        {"metadata": {"name": "d", "ownerReferences": {}}},
        "metadata.ownerReferences",
    ),
    (
        "resource.k8s.io/v1beta2",
        "DeviceTaintRule",
        {"metadata": {"name": "r"}, "spec": {"deviceSelector": {"pool": 1}}},
        "spec.deviceSelector.pool",
    ),
]


def test_every_kind_plan_reads_is_in_the_malformed_cases() -> None:
    read = {(kind.api_version, kind.kind) for kind in RELATED_KINDS} | {
        ("kubevirt.io/v1", "KubeVirt")
    }
    assert {(api_version, kind) for api_version, kind, _, _ in MALFORMED} == read


@pytest.mark.parametrize(("api_version", "kind", "obj", "field"), MALFORMED)
def test_a_malformed_object_exits_2_with_one_line_naming_it(
    tmp_path: Path, api_version: str, kind: str, obj: dict[str, Any], field: str
) -> None:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"apiVersion": api_version, "kind": kind, **obj}))
    result = run_plan(str(CLUSTER), str(path))
    assert (result.returncode, result.stdout) == (2, "")
    [line] = result.stderr.splitlines()
    metadata = obj["metadata"]
    where = "/".join(filter(None, (metadata.get("namespace"), metadata["name"])))
    assert line.startswith(f"plan: {path}: {kind} {where}: {field}"), line


def test_a_malformed_item_of_a_list_is_named_with_its_file(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    bad_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "t"}}
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        {**bad_pod, "spec": []}
    ]}))  # fmt: skip
    with pytest.raises(offline.PlanInputError, match=f"^{path}: Pod t/p: spec"):
        offline.load([path], Settings())


def node_object(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def loaded(tmp_path: Path, *objects: dict[str, Any]) -> offline.Inventory:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    return offline.load([path], Settings())


def test_objects_of_other_kinds_are_counted_and_what_follows_them_is_read(
    tmp_path: Path,
) -> None:
    inventory = loaded(
        tmp_path,
        node_object("first"),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "t"}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "t"},
        },
        node_object("last"),
    )
    assert inventory.unknown == 2
    assert [n["metadata"]["name"] for n in inventory.objects[("v1", "nodes")]] == ["first", "last"]


def test_only_the_kubevirt_cr_named_in_the_settings_is_read_as_kubevirt(tmp_path: Path) -> None:
    settings = Settings()
    named = {"name": settings.kubevirt_name, "namespace": settings.kubevirt_namespace}
    virtual_machine = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": named}
    elsewhere = {"apiVersion": "example.com/v1", "kind": "KubeVirt", "metadata": named}
    inventory = loaded(tmp_path, virtual_machine, elsewhere)
    assert inventory.kubevirt is None
    assert inventory.unknown == 2


def test_a_list_is_read_by_its_kind_not_by_having_items(tmp_path: Path) -> None:
    node_list = {"apiVersion": "v1", "kind": "NodeList", "items": [node_object("listed")]}
    node_with_items = {**node_object("itself"), "items": [node_object("inside")]}
    inventory = loaded(tmp_path, node_list, node_with_items)
    assert [n["metadata"]["name"] for n in inventory.objects[("v1", "nodes")]] == [
        "listed",
        "itself",
    ]


def test_mixed_files_json_list_and_single_objects(tmp_path: Path) -> None:
    items = yaml.safe_load(CLUSTER.read_text())["items"]
    (tmp_path / "a.json").write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": items[:10]})
    )
    (tmp_path / "b.yaml").write_text(yaml.safe_dump_all(items[10:]))
    split = run_plan(str(tmp_path / "a.json"), str(tmp_path / "b.yaml"))
    assert split.stdout == EXPECTED_TABLE


# --- equality with the hooks' own answers -----------------------------------------------------------


def hand_built_requests(
    cls: dict[str, Any], items: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What Metacontroller sends for the example, written out by hand (default settings)."""

    def keyed(objs: list[dict[str, Any]], namespaced: bool) -> dict[str, Any]:
        return {
            (f"{o['metadata']['namespace']}/" if namespaced else "") + o["metadata"]["name"]: o
            for o in objs
        }

    of = {
        kind: [o for o in items if o["kind"] == kind]
        for kind in ("Node", "Pod", "GPUClass", "Secret", "Namespace")
    }
    related: dict[str, Any] = {
        "Node.v1": keyed(of["Node"], False),
        "Pod.v1": keyed(of["Pod"], True),
        "GPUClass.cozystack.io/v1alpha1": keyed(of["GPUClass"], False),
    }
    license_related: dict[str, Any] = {}
    if "license" in cls["spec"]:
        copy = f"gpuclass-{cls['metadata']['name']}-license"
        secrets = [
            s
            for s in of["Secret"]
            if s["metadata"]["name"] in (copy, "nvidia-license")
            and (s["metadata"]["name"] == copy or s["metadata"]["namespace"] == "cozy-gpu-operator")
        ]
        entitled = [
            n
            for n in of["Namespace"]
            if n["metadata"].get("labels", {}).get("namespace.cozystack.io/vgpu") == "true"
        ]
        license_related = {
            "Secret.v1": keyed(secrets, True),
            "Namespace.v1": keyed(entitled, False),
        }
        related.update(license_related)
    status_request = {"parent": cls, "children": {}, "related": related}
    license_request = {"object": cls, "attachments": {"Secret.v1": {}}, "related": license_related}
    return status_request, license_request


def test_plan_json_equals_the_hooks_answers_for_the_same_objects(tmp_path: Path) -> None:
    settings = Settings(kube_api="http://127.0.0.1:9", kube_timeout_seconds=0.2)
    inv = offline.load([CLUSTER], settings)
    doc = offline.document(offline.run_offline(inv, settings, NOW), inv, settings, None)
    # Worked out by hand from examples/cluster.yaml: h100 has gpu-h100-1's 4 less 2 requested
    # (gpu-h100-2's taint is not tolerated); h100-legacy is the younger class on that resource;
    # l40s-24q has gpu-l40s-1's 2 less 1 requested (gpu-l40s-2 is cordoned); only tenant-a gets a
    # copy (tenant-b holds its own Secret of that name, tenant-c is terminating).
    summary = {
        entry["name"]: (
            entry["status"]["free"],
            entry["status"]["maxFreePerNode"],
            next(c["status"] for c in entry["status"]["conditions"] if c["type"] == "Ready"),
            [a["metadata"]["namespace"] for a in entry["attachments"]],
        )
        for entry in doc["classes"]
    }
    assert summary == {
        "h100": (2, 2, "True", []),
        "h100-legacy": (0, 0, "False", []),
        "l40s-24q": (1, 1, "True", ["tenant-a"]),
    }
    items = yaml.safe_load(CLUSTER.read_text())["items"]
    kubevirt = next(o for o in items if o["kind"] == "KubeVirt")
    from tests.fake_apiserver import KUBEVIRT_PATH, fake_apiserver

    with fake_apiserver() as api:
        api.serve(KUBEVIRT_PATH, 200, kubevirt)
        client = create_app(
            settings.model_copy(update={"kube_api": api.url}), clock=lambda: NOW
        ).test_client()
        for entry in doc["classes"]:
            cls = next(
                o
                for o in items
                if o["kind"] == "GPUClass" and o["metadata"]["name"] == entry["name"]
            )
            status_request, license_request = hand_built_requests(cls, items)
            assert (
                client.post("/status/sync", json=status_request).json["status"] == entry["status"]
            )
            attachments = client.post("/license/sync", json=license_request).json["attachments"]
            assert [offline.redacted(a) for a in attachments] == entry["attachments"]


def test_docs_show_the_current_output() -> None:
    assert EXPECTED_TABLE.strip() in (ROOT / "docs" / "plan.md").read_text()


@pytest.mark.live
def test_plan_json_equals_the_live_servers_answers(tmp_path: Path) -> None:
    """The same comparison against the real `gpuclass-hooks serve`, times aside."""
    import requests

    from tests.fake_apiserver import KUBEVIRT_PATH, fake_apiserver
    from tests.live import live_server

    items = yaml.safe_load(CLUSTER.read_text())["items"]
    plan_doc = json.loads(run_plan(str(CLUSTER), "-o", "json").stdout)

    def without_times(status: dict[str, Any]) -> dict[str, Any]:
        return {
            **status,
            "conditions": [
                {k: v for k, v in c.items() if k != "lastTransitionTime"}
                for c in status.get("conditions", [])
            ],
        }

    with fake_apiserver() as api:
        api.serve(KUBEVIRT_PATH, 200, next(o for o in items if o["kind"] == "KubeVirt"))
        with live_server({"GPUCLASS_KUBE_API": api.url}, tmp_path) as server:
            for entry in plan_doc["classes"]:
                cls = next(
                    o
                    for o in items
                    if o["kind"] == "GPUClass" and o["metadata"]["name"] == entry["name"]
                )
                status_request, license_request = hand_built_requests(cls, items)
                status = requests.post(
                    f"{server.url}/status/sync", json=status_request, timeout=10
                ).json()["status"]
                assert without_times(status) == without_times(entry["status"])
                attachments = requests.post(
                    f"{server.url}/license/sync", json=license_request, timeout=10
                ).json()["attachments"]
                assert [offline.redacted(a) for a in attachments] == entry["attachments"]


EDGES_TABLE = """\
CLASS   RESOURCE                    FREE  MAX/NODE  READY    NOT FINE
broken  -                           0     0         False    Ready: InvalidSpec
l40s    nvidia.com/NVIDIA_L40S-24Q  1     1         Unknown  ResourceNameNotPermitted: KubeVirtUnreadable, Ready: KubeVirtUnreadable
lic     nvidia.com/GH100_H100_PCIE  0     0         False    ResourceNameNotPermitted: KubeVirtUnreadable, ResourceNotAdvertised: NoNodeAdvertises, LicenseSecretMissing: SecretNotFound, Ready: ResourceNotAdvertised

License copies of lic: source NOT usable (SecretNotFound): license Secret cozy-gpu-operator/nvidia-license does not exist
  copy in:  -
  skipped:  -
"""
EDGES_TAIL = """
No KubeVirt CR in the input: ResourceNameNotPermitted is Unknown.

Ignored 2 objects of other kinds.
"""


@pytest.fixture
def edges(tmp_path: Path) -> Path:
    """A cluster at the edges of the text output: a class with no resource, a licensed class
    whose source is missing and whose resource no node has, a node with two pods, no KubeVirt CR,
    two objects of other kinds."""
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "t"}}
    objects = [
        builders.gpuclass("broken", resource=None),
        builders.licensed_class("lic", resource=builders.OTHER_GPU),
        builders.gpuclass("l40s"),
        builders.node("gpu-1", gpus=4),
        builders.pod("a", node_name="gpu-1", gpus=1),
        builders.pod("b", node_name="gpu-1", gpus=2),
        builders.namespace("t", entitled=False),
        {**other, "metadata": {**other["metadata"], "name": "c1"}},
        {**other, "metadata": {**other["metadata"], "name": "c2"}},
    ]
    path = tmp_path / "edges.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    return path


def test_the_text_output_at_its_edges(edges: Path) -> None:
    assert run_plan(str(edges)).stdout == EDGES_TABLE + EDGES_TAIL


def test_explain_of_a_class_no_node_advertises_says_none(edges: Path) -> None:
    assert run_plan(str(edges), "--explain", "lic").stdout == (
        EDGES_TABLE + "\nNodes advertising nvidia.com/GH100_H100_PCIE for lic: none\n" + EDGES_TAIL
    )


def test_explain_lists_every_pod_a_node_counts(edges: Path) -> None:
    assert run_plan(str(edges), "--explain", "l40s").stdout == (
        EDGES_TABLE
        + "\nNodes advertising nvidia.com/NVIDIA_L40S-24Q for l40s:\n"
        + "NODE   COUNTS  WHY NOT  ALLOCATABLE  USED  FREE  PODS\n"
        + "gpu-1  yes     -        4            3     1     tenant-a/a (1), tenant-a/b (2)\n"
        + EDGES_TAIL
    )


def test_disabled_classes_show_nothing_computed(edges: Path) -> None:
    assert run_plan(str(edges), "--enabled", "false").stdout == (
        "CLASS   RESOURCE  FREE  MAX/NODE  READY  NOT FINE\n"
        "broken  -         -     -         -      -\n"
        "l40s    -         -     -         -      -\n"
        "lic     -         -     -         -      -\n" + EDGES_TAIL
    )


def test_the_license_summary_names_every_namespace_skipped_and_why(tmp_path: Path) -> None:
    objects = [
        builders.licensed_class("l40s"),
        builders.source_secret(),
        builders.node("gpu-1"),
        builders.namespace("a"),
        builders.namespace("b"),
        builders.namespace("c", terminating=True),
        builders.namespace("d"),
        builders.namespace("Bad_Name"),
        builders.orphaned_copy("l40s", "b"),
        builders.secret("gpuclass-l40s-license", "d", data={"x": b"y"}),
    ]
    path = tmp_path / "licensed.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    result = run_plan(str(path), "-o", "json")
    [entry] = json.loads(result.stdout)["classes"]
    assert entry["license"]["copies"] == ["a"]
    assert entry["license"]["skipped"] == [
        {"namespace": "Bad_Name", "why": "invalid name"},
        {"namespace": "b", "why": "holds a copy with our labels that no class manages"},
        {"namespace": "c", "why": "terminating: no new copy"},
        {"namespace": "d", "why": "holds a Secret of the copy's name that is not a managed copy"},
    ]
    [copy] = entry["attachments"]
    assert copy["data"] == {
        builders.TOKEN_KEY: offline.REDACTED,
        "gridd.conf": builders.b64(b"FeatureType=1\n"),
    }


def test_copies_are_kept_while_the_license_source_is_missing(tmp_path: Path) -> None:
    """The dump's managed copies are the decorator's attachments: with the source gone, plan
    shows them kept, not deleted."""
    objects = [
        builders.licensed_class("l40s"),
        builders.node("gpu-1"),
        builders.namespace("a"),
        builders.managed_copy("l40s", "a"),
        builders.managed_copy("other", "a"),  # another class's copy is not this one's
    ]
    path = tmp_path / "kept.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    [entry] = json.loads(run_plan(str(path), "-o", "json").stdout)["classes"]
    assert entry["license"]["source"]["usable"] is False
    assert entry["license"]["copies"] == ["a"]
    assert [(c["metadata"]["namespace"], c["metadata"]["name"]) for c in entry["attachments"]] == [
        ("a", "gpuclass-l40s-license")
    ]


def test_without_a_kubevirt_cr_the_condition_says_it_is_not_in_the_input(edges: Path) -> None:
    classes = json.loads(run_plan(str(edges), "-o", "json").stdout)["classes"]
    [condition] = [
        c for c in classes[1]["status"]["conditions"] if c["type"] == "ResourceNameNotPermitted"
    ]
    assert "KubeVirt cozy-kubevirt/kubevirt is not in the input files" in condition["message"]


def test_a_namespace_selector_selects_nothing_in_namespaces_the_input_lacks(tmp_path: Path) -> None:
    """A Pod whose Namespace is not in the dump has no namespace labels: no namespace selector
    matches it; with no Namespace in the dump at all, none matches anything."""
    rule = RelatedRule(
        api_version="v1",
        resource="pods",
        namespace_selector=LabelSelector(match_labels={"namespace.cozystack.io/vgpu": "true"}),
    )
    with_namespace = loaded(
        tmp_path, builders.namespace("tenant-a"), builders.pod("in-a"), builders.pod("elsewhere")
    )
    with_namespace.objects[("v1", "pods")][1]["metadata"]["namespace"] = "tenant-x"
    assert names(offline.select_related([rule], with_namespace)["Pod.v1"]) == ["tenant-a/in-a"]
    without = loaded(tmp_path, builders.pod("in-a"))
    assert offline.select_related([rule], without)["Pod.v1"] == {}


def test_the_text_lists_every_namespace_a_copy_goes_to(tmp_path: Path) -> None:
    objects = [
        builders.licensed_class("l40s"),
        builders.source_secret(),
        builders.namespace("a"),
        builders.namespace("b"),
    ]
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    assert "\n  copy in:  a, b\n" in run_plan(str(path)).stdout


def test_a_class_being_edited_keeps_its_copies(tmp_path: Path) -> None:
    """A class whose spec is invalid keeps the copies Metacontroller attached (the dump's managed
    copies of that class, not another's) until it is valid again."""
    edited = builders.licensed_class("l40s")
    edited["spec"]["resourceName"] = "not a resource"
    objects = [
        edited,
        builders.node("gpu-1"),
        builders.namespace("a"),
        builders.managed_copy("l40s", "a"),
        builders.managed_copy("other", "a"),
    ]
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    [entry] = json.loads(run_plan(str(path), "-o", "json").stdout)["classes"]
    assert [(c["metadata"]["namespace"], c["metadata"]["name"]) for c in entry["attachments"]] == [
        ("a", "gpuclass-l40s-license")
    ]


def test_a_dump_without_classes_plans_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump_all([builders.node("gpu-1")]))
    result = run_plan(str(path))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines()[0] == "CLASS  RESOURCE  FREE  MAX/NODE  READY  NOT FINE"
    assert "\nNo KubeVirt CR in the input" in result.stdout


TENANCY = ROOT / "examples" / "tenancy.yaml"


def report_dump(tmp_path: Path) -> Path:
    """The example tenancy (examples/tenancy.yaml) as `kubectl get -o json` dumps it, with a
    release of another kind the report's selector leaves out."""
    items = [
        *builders.tenancy_items(),
        builders.helmrelease("Tenant", "tenant-root", "ignored", {})
        | {"metadata": {"name": "redis-cache", "namespace": "tenant-acme", "labels": {}}},
    ]
    path = tmp_path / "releases.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def test_the_budgets_plan_shows_are_the_figures_the_live_reports_write(
    tmp_path: Path, settings: Settings
) -> None:
    """Each tenant namespace's report asked of the live hooks, with what its rules select once
    the labeller labelled the namespaces (as plan simulates both controllers); the rules are
    those the live customize gives."""
    client = create_app(settings).test_client()
    requests = offline.pool_requests(offline.load([TENANCY], settings), settings)
    written = []
    for name, body in requests.items():
        answer = client.post("/budget-pools/customize", json={"parent": body["object"]})
        rules = msgspec.json.decode(answer.data, type=CustomizeResponse).related_resources
        assert (
            rules
            == budget_report.customize(name, settings.budget_classes_namespace).related_resources
        )
        answer = client.post("/budget-pools/sync", json=body).get_json()
        written += [json.loads(c["data"]["budget.json"]) for c in answer["attachments"]]
    assert len(written) == 3
    result = run_plan(str(report_dump(tmp_path)), "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["budgets"] == written


def test_plan_prints_every_gpu_budget_pool_a_row_per_key(tmp_path: Path) -> None:
    result = run_plan(str(report_dump(tmp_path)))
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("\nGPU budgets:\n", 1)[1].splitlines()
    assert section[:5] == [
        "TENANT  NAMESPACE        KEY                                     BUDGET  CARVED OUT  RESERVED  LEFT",
        "acme    tenant-acme      gpuclass.cozystack.io/devices           4       1           3         0",
        "acme    tenant-acme      l40s-24q.gpuclass.cozystack.io/devices  2       0           2         0",
        "lab     tenant-acme-lab  gpuclass.cozystack.io/devices           1       0           0         1",
        "lab     tenant-acme-lab  l40s-24q.gpuclass.cozystack.io/devices  0       0           0         0",
    ]
    assert section[5] == "Pools whose figures cannot be known:"
    assert section[6].startswith(
        "  legacy (tenant-legacy): HelmRelease tenant-legacy/vm-instance-old"
    )


def test_a_dump_without_releases_prints_no_budgets(tmp_path: Path) -> None:
    result = run_plan(str(CLUSTER), "-o", "json")
    assert json.loads(result.stdout)["budgets"] is None
    assert "GPU budgets" not in run_plan(str(CLUSTER)).stdout


# --- a DRA class -----------------------------------------------------------------------------------


def test_plan_of_a_dra_class_reads_slices_and_claims_as_its_sync_does(tmp_path: Path) -> None:
    """A dump with a DRA class, its nodes, slices and claims: plan answers what the status hook
    answers for the same objects, and --explain shows each node's units."""
    from tests.controllers.test_status_dra import cluster as dra_cluster

    request = dra_cluster()
    objects = [obj for group in request["related"].values() for obj in group.values()]
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    result = run_plan(str(dump), "-o", "json", "--explain", "a10")
    assert (result.returncode, result.stderr) == (0, "")
    [planned] = json.loads(result.stdout)["classes"]
    assert (planned["status"]["free"], planned["status"]["maxFreePerNode"]) == (3, 2)
    assert planned["status"]["deviceClass"] == "a10.gpuclass.cozystack.io"
    assert [(n["node"], n["units"], n["taken"], n["free"]) for n in planned["nodes"]] == [
        ("n1", 3, 1, 2),
        ("n2", 1, 0, 1),
    ]
    table = run_plan(str(dump), "--explain", "a10").stdout
    assert "Nodes with devices of a10.gpuclass.cozystack.io for a10:" in table
    assert any(line.split()[:6] == ["n1", "yes", "-", "3", "1", "2"] for line in table.splitlines())


def test_plan_of_a_dra_class_reads_device_taint_rules_where_they_are_served(
    tmp_path: Path,
) -> None:
    """With GPUCLASS_DRA_DEVICE_TAINT_RULES on, a DeviceTaintRule in the dump leaves out the
    devices it selects, as in the status hook; off, plan reads none, as the hook does."""
    from tests.builders import DRIVER, taint_rule
    from tests.controllers.test_status_dra import cluster as dra_cluster

    request = dra_cluster()
    objects = [obj for group in request["related"].values() for obj in group.values()]
    objects.append(taint_rule("n1-maintenance", {"driver": DRIVER, "pool": "n1"}))
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    served = run_plan(str(dump), "-o", "json", env={"GPUCLASS_DRA_DEVICE_TAINT_RULES": "true"})
    assert (served.returncode, served.stderr) == (0, "")
    [planned] = json.loads(served.stdout)["classes"]
    assert (planned["status"]["free"], planned["status"]["maxFreePerNode"]) == (1, 1)
    [unread] = json.loads(run_plan(str(dump), "-o", "json").stdout)["classes"]
    assert unread["status"]["free"] == 3
