"""docs/install.md, step by step, on a real cluster: Metacontroller from its own chart,
cert-manager, the image loaded into the node, the chart installed with cert-manager and then with
an existing TLS Secret, `helm test`, license copies converging, a budget denial through the API
server, and the documented uninstall. The shell blocks are the document's own, run as written
(the image flags of step 2's "as a file" variant and `--wait` added to each `helm install`)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from hooks.controllers.budget_report import CLASS_INDEX_NAME, REPORT_LABEL
from hooks.rules.budget.keys import TOTAL_KEY
from tests.builders import TOKEN_KEY, helmrelease
from tests.chart import CHART
from tests.e2e.cluster import GPU, NAMESPACE, RELEASE, Cluster, wait_for
from tests.e2e.load import images_running
from tests.e2e.steps import (
    COPY,
    COPY_LABEL,
    IMAGE,
    LICENSE_RESYNC_SECONDS,
    doc_block,
    helm_test,
    image_digest,
    install_with_cert_manager,
    licensed_setup,
    run_block,
    upgrade,
    vm,
    webhook_ca_injected,
    with_image,
)

# Every kind the chart makes, wherever it makes it.
RELEASE_KINDS = (
    "deployments,services,serviceaccounts,secrets,configmaps,roles,rolebindings,"
    "poddisruptionbudgets,networkpolicies,certificates,issuers,clusterroles,clusterrolebindings,"
    "validatingwebhookconfigurations,compositecontrollers,decoratorcontrollers"
)

# --- the install (steps 3 and 4) ----------------------------------------------------------------


def test_install_with_cert_manager_then_helm_test_passes(
    cluster: Cluster,
    metacontroller: None,
    cert_manager: None,
    image_on_node: None,
    cozystack: None,
    tmp_path: Path,
) -> None:
    install_with_cert_manager(cluster, tmp_path)
    # pinned by digest, as docs/install.md recommends: the image `make release` would print
    assert images_running(cluster) == {f"{IMAGE}@{image_digest(cluster)}"}
    ready = cluster.get("certificate", "-n", NAMESPACE)
    assert ready is not None and all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in item["status"]["conditions"])
        for item in ready["items"]
    )
    output = helm_test(cluster)
    assert "Phase:          Succeeded" in output, output
    # the render read the API server's addresses from the cluster, for the NetworkPolicy
    slice_ = cluster.get("endpointslice", "-n", "default", "kubernetes")
    advertised = {f"{a}/32" for e in slice_["endpoints"] for a in e["addresses"]}
    policy = cluster.get("networkpolicy", "-n", NAMESPACE, RELEASE)
    admitted = {
        peer["ipBlock"]["cidr"]
        for rule in policy["spec"]["ingress"]
        for peer in rule.get("from", [])
        if "ipBlock" in peer
    }
    assert advertised and admitted == advertised


def test_the_defaults_rendered_without_a_cluster_are_accepted_by_it(cluster: Cluster) -> None:
    """What a GitOps pipeline applies: `helm template` of the defaults, which reads nothing of the
    cluster (cert-manager's Certificates, the admission port open to every address), accepted
    object by object by this cluster's API server (its schemas, cert-manager's webhook)."""
    rendered = cluster.helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE).stdout
    policy = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "NetworkPolicy"]
    [admission] = [
        rule for rule in policy[0]["spec"]["ingress"] if rule["ports"][0]["port"] == "admission"
    ]
    assert "from" not in admission  # the API servers' addresses were not read
    applied = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert applied.returncode == 0, applied.stderr


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
    # The same figures, for the tenant to read: the budget report Metacontroller writes.
    report = wait_for(
        "the pool's budget report",
        lambda: (cluster.get("configmap", "-n", "tenant-a", "gpu-budget") or {}).get("data"),
    )
    assert json.loads(report["budget.json"])["keys"] == [
        {"key": TOTAL_KEY, "budget": 1, "carvedOut": 0, "reserved": 1, "left": 0}
    ]


def test_a_vm_through_an_instance_type_that_attaches_a_gpu_is_denied_past_its_budget(
    cluster: Cluster,
) -> None:
    """Cozystack's `gn1.xlarge` attaches an A400 to a VM that lists no gpus: the chart's match
    conditions name it, so the API server sends the VM to the webhook, which reads what the
    instance type attaches from the cluster and denies it in a pool with nothing left."""
    cluster.apply(
        {
            "apiVersion": "cozystack.io/v1alpha1",
            "kind": "GPUClass",
            "metadata": {"name": "a400"},
            "spec": {"resourceName": "nvidia.com/A400"},
        }
    )
    typed = {**vm("tenant-a", "typed"), "spec": {"instanceType": "gn1.xlarge"}}
    expected = (
        'admission webhook "gpu-budget.gpuclass.cozystack.io" denied the request: '
        f"{TOTAL_KEY}: this VMInstance needs 1, the pool of tenant a (tenant-a) has 0 left"
    )

    def denied() -> str | None:
        created = cluster.kubectl("create", "-f", "-", input=json.dumps(typed), check=False)
        assert created.returncode != 0, "admitted past its budget"
        return created.stderr if expected in created.stderr else None

    # until the webhook's class cache (admission.cacheSeconds) holds the new class; before, the
    # device maps to no class and is refused for that
    wait_for("the denial naming the budget", denied)
    # an instance type that attaches nothing passes unjudged
    plain = {**vm("tenant-a", "plain"), "spec": {"instanceType": "u1.medium"}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(plain))


def test_a_tenant_reads_its_own_budget_report_through_cozystacks_view_role(
    cluster: Cluster,
) -> None:
    """Cozystack binds `cozy:tenant:view` (which aggregates every ClusterRole labelled
    `rbac.cozystack.io/aggregate-to-tenant-view`) in a tenant's namespaces; Cozystack's own role,
    aggregated by this cluster's controller manager, bound to a tenant's ServiceAccount in its
    namespace: the tenant reads its own report, and neither another namespace's nor a Secret; and
    it lists the GPUClasses, as every authenticated user may, and changes none."""
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "tenant-a-viewer", "namespace": "tenant-a"},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-a-view", "namespace": "tenant-a"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cozy:tenant:view",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "tenant-a-viewer", "namespace": "tenant-a"}
            ],
        },
    )
    viewer = "--as=system:serviceaccount:tenant-a:tenant-a-viewer"

    def allowed(verb: str, what: str, namespace: str) -> bool:
        done = cluster.kubectl("auth", "can-i", verb, what, "-n", namespace, viewer, check=False)
        return done.returncode == 0

    wait_for(
        "the tenant reading its report (the role aggregated)",
        lambda: (
            cluster.kubectl(
                "get", "configmap", "gpu-budget", "-n", "tenant-a", viewer, check=False
            ).returncode
            == 0
        ),
    )
    assert not allowed("get", "configmap/gpu-budget", "tenant-root")  # another namespace's
    assert not allowed("get", "configmap/other", "tenant-a")  # another ConfigMap
    assert not allowed("list", "configmaps", "tenant-a")
    assert not allowed("get", "secrets", "tenant-a")
    listed = cluster.kubectl("get", "gpuclasses", "-o", "name", viewer)
    assert "gpuclass.cozystack.io/l40s" in listed.stdout.split()
    assert not allowed("patch", "gpuclasses", "tenant-a")
    assert not allowed("update", "gpuclasses/status", "tenant-a")


def test_the_reports_of_the_earlier_version_give_way_to_the_pool_reports(cluster: Cluster) -> None:
    """docs/install.md, step 7: an upgrade from the report attached to the release's ClusterRole
    needs nothing. Its ConfigMap, made here as that version's Metacontroller made it (owned by
    the ClusterRole, marked with the controller's name), is deleted by the retired controller,
    and the namespace's own pool report takes its place."""
    selector = f"app.kubernetes.io/instance={RELEASE},{REPORT_LABEL}=true"
    [role] = cluster.get("clusterroles", "-l", selector)["items"]
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-b"}})
    earlier = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "gpu-budget",
            "namespace": "tenant-b",
            "labels": {REPORT_LABEL: "true"},
            "annotations": {"metacontroller.k8s.io/decorator-controller": "gpuclass-budget-report"},
            "ownerReferences": [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "name": role["metadata"]["name"],
                    "uid": role["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {"budget.txt": "the figures of the earlier version\n"},
    }
    cluster.apply(earlier)
    cluster.apply(helmrelease("Tenant", "tenant-root", "b", {"resourceQuotas": {TOTAL_KEY: "2"}}))

    def owner_kind() -> str | None:
        found = cluster.get("configmap", "-n", "tenant-b", "gpu-budget") or {}
        owners = found.get("metadata", {}).get("ownerReferences", [])
        return owners[0]["kind"] if owners else None

    wait_for("the pool report in place of the earlier one", lambda: owner_kind() == "Namespace")
    report = cluster.get("configmap", "-n", "tenant-b", "gpu-budget")
    assert json.loads(report["data"]["budget.json"])["keys"][0]["budget"] == 2
    labels = cluster.get("namespace", "tenant-b")["metadata"]["labels"]
    assert labels["gpuclass.cozystack.io/tenant-namespace"] == "true"
    assert labels["gpuclass.cozystack.io/top-level-namespace"] == "tenant-b"


def test_a_sub_tenants_own_report_of_the_earlier_version_gives_way_to_its_top_level_ones(
    cluster: Cluster,
) -> None:
    """An upgrade from the version where each tenant namespace reported its own pool needs
    nothing: a sub-tenant's report, made here as that version made it (owned by its own
    Namespace), is deleted by that namespace's target, which now reports nothing, and its
    top-level namespace's target writes it again; the per-depth label goes."""
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-b"}})
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": "tenant-b-c",
                "labels": {"gpuclass.cozystack.io/pool-level-2": "tenant-b-c"},
            },
        }
    )
    namespace = cluster.get("namespace", "tenant-b-c")
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "gpu-budget",
                "namespace": "tenant-b-c",
                "labels": {REPORT_LABEL: "true"},
                "annotations": {
                    "metacontroller.k8s.io/decorator-controller": "gpuclass-budget-pools"
                },
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "name": "tenant-b-c",
                        "uid": namespace["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "data": {"budget.txt": "the figures of the earlier version\n"},
        }
    )
    cluster.apply(helmrelease("Tenant", "tenant-b", "c", {"resourceQuotas": {TOTAL_KEY: "1"}}))

    def owner() -> str | None:
        found = cluster.get("configmap", "-n", "tenant-b-c", "gpu-budget") or {}
        owners = found.get("metadata", {}).get("ownerReferences", [])
        return owners[0]["name"] if owners else None

    wait_for(
        "the sub-tenant's report owned by its top-level namespace", lambda: owner() == "tenant-b"
    )
    report = cluster.get("configmap", "-n", "tenant-b-c", "gpu-budget")
    assert json.loads(report["data"]["budget.json"])["keys"][0]["budget"] == 1
    labels = cluster.get("namespace", "tenant-b-c")["metadata"]["labels"]
    assert labels["gpuclass.cozystack.io/top-level-namespace"] == "tenant-b"
    assert "gpuclass.cozystack.io/pool-level-2" not in labels


def test_uninstall_as_documented_removes_every_copy_and_leaves_the_certificates(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Step 7 as written: GPU features off, the classes synced again until no copy is left (well
    before the license resync would take them), then `helm uninstall`; the CRD and the classes
    stay."""
    block = doc_block("- **Uninstall:**")
    before_uninstall, uninstall = block.split("helm uninstall", 1)
    output = run_block(cluster, with_image(before_uninstall, image_digest(cluster)), tmp_path)
    assert cluster.get("secrets", "-A", "-l", COPY_LABEL)["items"] == []
    # The loop annotates every ten seconds: gone by the annotations, not by the resync.
    annotations = output.count("gpuclass.cozystack.io/l40s annotated")
    assert annotations <= LICENSE_RESYNC_SECONDS / 10 / 3, output
    assert cluster.get("configmaps", "-A", "-l", f"{REPORT_LABEL}=true")["items"]
    assert cluster.get("configmap", "-n", NAMESPACE, CLASS_INDEX_NAME) is not None
    assert uninstall.startswith(" gpuclass-hooks --namespace cozy-gpu --wait\n")
    run_block(cluster, "helm uninstall" + uninstall, tmp_path)
    assert cluster.get("gpuclass", "l40s") is not None
    labelled = cluster.get(RELEASE_KINDS, "-A", "-l", f"app.kubernetes.io/instance={RELEASE}")
    assert labelled["items"] == []
    # The class index goes with the release's ClusterRole, its owner (the garbage collector's).
    wait_for(
        "the class index collected",
        lambda: cluster.get("configmap", "-n", NAMESPACE, CLASS_INDEX_NAME) is None,
    )
    # The reports and the labels belong to the namespaces: the block's last two commands.
    assert cluster.get("configmaps", "-A", "-l", f"{REPORT_LABEL}=true")["items"] == []
    for namespace in cluster.get("namespaces")["items"]:
        ours = [k for k in namespace["metadata"].get("labels", {}) if k.startswith("gpuclass.")]
        assert ours == [], namespace["metadata"]["name"]
    # What step 7 says stays: cert-manager keeps a Certificate's Secret when the Certificate goes.
    left = {
        s["metadata"]["name"]: s["type"] for s in cluster.get("secrets", "-n", NAMESPACE)["items"]
    }
    assert left == {f"{RELEASE}-{part}": "kubernetes.io/tls" for part in ("ca", "tls")}


def test_install_with_an_existing_tls_secret_then_helm_test_passes(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=180s")
    block = doc_block("Without it, make the TLS Secret first.")
    run_block(cluster, with_image(block, image_digest(cluster)), tmp_path)
    cluster.rollout("deployment", NAMESPACE, RELEASE)
    output = helm_test(cluster)
    assert "Phase:          Succeeded" in output, output
    copy = wait_for("the license copy again", lambda: cluster.secret_data("tenant-entitled", COPY))
    assert copy[TOKEN_KEY] == b"e2e-license-token"
