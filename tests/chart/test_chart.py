"""The chart, rendered by helm and checked against the app it deploys."""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import msgspec
import pytest
import trustme
import yaml

from hooks.controllers.budget_report import REPORT_NAME
from hooks.controllers.tenant_namespaces import TENANT_NAMESPACE_LABEL
from hooks.serving import listeners
from hooks.serving.app import create_app
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from tests import cozystack
from tests.builders import (
    gpuclass,
    licensed_class,
    namespace,
    node,
    secret,
    source_secret,
    status_sync_request,
)
from tests.chart import (
    API_SERVERS_SET,
    CERT_MANAGER,
    CHART,
    KUBE_VERSION,
    ON_A_CLUSTER,
    PLAIN,
    by_kind,
    container_of,
    crd,
    env_of,
    helm_run,
    named,
    one,
    render,
    template,
)

# Renders the chart with helm (`make tools`).


@pytest.fixture(scope="module")
def default_render() -> list[dict[str, Any]]:
    return render()


def hooks_of(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for controller in [
        *by_kind(documents, "CompositeController"),
        *by_kind(documents, "DecoratorController"),
    ]:
        for name, hook in controller["spec"]["hooks"].items():
            found[f"{controller['metadata']['name']}/{name}"] = hook
    return found


def test_helm_lint_of_the_defaults_passes_and_fails_where_the_render_fails() -> None:
    """helm lint reads no cluster: the defaults render there as in any GitOps pipeline; values
    the chart refuses fail lint as they fail `helm template`, with the reason."""
    result = helm_run("lint", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    result = helm_run("lint", str(CHART), "--set", "tls.enabled=false")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "[ERROR] templates/" in output and "the-chart-refuses-these-values" in output, output
    assert "Fail: admission.enabled (on by default) needs tls.enabled" in output, output


def test_helm_lint_passes() -> None:
    # helm lint cannot be told which APIs the cluster serves: it lints the defaults with a named
    # Secret and the CA that signed it (admission, on by default, needs a CA it can read) and the
    # API servers' addresses, so that every template renders.
    ca = trustme.CA().cert_pem.bytes().decode()
    args = ["--kube-version", KUBE_VERSION, "--set", "tls.existingSecret=lint-tls"]
    args += ["--set", f"tls.trustBundle={ca}", "--set", API_SERVERS_SET]
    result = helm_run("lint", str(CHART), "--strict", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Fail:" not in result.stdout + result.stderr


def test_the_built_helm_renders_the_chart_without_a_kube_version() -> None:
    """`make tools` stamps helm as its own release build does: `helm template` on a machine with
    no cluster assumes a current Kubernetes, not v1.20, which the chart's minimum refuses."""
    result = helm_run("template", "gpu", str(CHART), *ON_A_CLUSTER)
    assert result.returncode == 0, result.stderr
    version = helm_run("version", "--template", "{{ .Version }}")
    assert version.stdout.startswith("v3."), version.stdout


@pytest.mark.parametrize(
    "added",
    [
        "networkPolicy",
        "logLevel",
        "topologySpreadConstraints",
        "serve.admissionPort",
        "networkPolicy.admissionNamespaces",
    ],
)
def test_values_of_an_earlier_chart_version_are_refused_naming_the_upgrade_flag(added: str) -> None:
    """`helm upgrade --reuse-values` from an earlier version renders with that version's values,
    which lack what this one added: refused, not rendered empty (an empty log level stops the
    service; a missing policy section fails deep in a template)."""
    result = template(f"{added}=null")
    assert result.returncode != 0
    assert f"no {added}" in result.stderr and "--reset-then-reuse-values" in result.stderr


@pytest.mark.parametrize(
    ("enabled", "variant", "expected"),
    [
        (None, "", "true"),
        (None, "default", "true"),
        (None, "vgpu", "true"),
        (None, "container", "false"),
        ("true", "", "true"),
        ("true", "container", "true"),
        ("false", "vgpu", "false"),
        ("false", "default", "false"),
    ],
)
def test_gpu_switch_follows_the_operator_variant_unless_set(
    enabled: str | None, variant: str, expected: str
) -> None:
    sets = [f"gpuOperator.variant={variant}"] + ([f"gpu.enabled={enabled}"] if enabled else [])
    documents = render(*sets)
    env = one(documents, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "GPUCLASS_ENABLED", "value": expected} in env
    # Off keeps every controller, so that copies are deleted and status cleared.
    assert len(by_kind(documents, "CompositeController")) == 1
    assert [d["metadata"]["name"] for d in by_kind(documents, "DecoratorController")] == [
        "gpuclass-license",
        "gpuclass-tenant-namespaces",
        "gpuclass-resource-labels",
        "gpuclass-budget-pools",
        "gpuclass-budget-report",
    ]


def test_hook_urls_point_at_routes_the_app_serves(default_render: list[dict[str, Any]]) -> None:
    app = create_app(Settings())
    served = {rule.rule for rule in app.url_map.iter_rules() if "POST" in (rule.methods or set())}
    hooks = hooks_of(default_render)
    assert set(hooks) == {
        "gpuclass-status/customize",
        "gpuclass-status/sync",
        "gpuclass-license/customize",
        "gpuclass-license/sync",
        "gpuclass-tenant-namespaces/customize",
        "gpuclass-tenant-namespaces/sync",
        "gpuclass-resource-labels/sync",
        "gpuclass-budget-pools/customize",
        "gpuclass-budget-pools/sync",
        "gpuclass-budget-report/customize",
        "gpuclass-budget-report/sync",
    }
    service = one(default_render, "Service")
    for hook in hooks.values():
        url = urlparse(hook["webhook"]["url"])
        assert url.path in served
        assert url.hostname == f"{service['metadata']['name']}.cozy-gpu.svc"
        assert url.port == service["spec"]["ports"][0]["port"]
        assert re.fullmatch(r"cfg=[0-9a-f]{8}&cred=[0-9a-f]{8}", url.query)


def test_every_hook_is_v2_with_the_timeout(default_render: list[dict[str, Any]]) -> None:
    for hook in hooks_of(default_render).values():
        assert hook["version"] == "v2"
        assert hook["webhook"]["timeout"] == "30s"
    assert {
        h["webhook"]["timeout"] for h in hooks_of(render("controllers.hookTimeout=45s")).values()
    } == {"45s"}


def test_settings_checksum_changes_hook_urls_when_customize_settings_change(
    default_render: list[dict[str, Any]],
) -> None:
    before = {h["webhook"]["url"] for h in hooks_of(default_render).values()}
    # every value a customize answer is built from (hooks/controllers: selectors, the GPU
    # switch, the entitlement label, the namespaces a license source may live in)
    for change in (
        "selectors.nodes=nvidia.com/gpu.present=true",
        "selectors.pods=app=vm",
        "gpu.enabled=false",
        "dra.api=true",
        "license.namespaceLabel=x/y",
        "license.namespaces={cozy-gpu-operator,gpu-licenses}",
    ):
        after = {h["webhook"]["url"] for h in hooks_of(render(change)).values()}
        assert before.isdisjoint(after), change
    assert before == {h["webhook"]["url"] for h in hooks_of(render("replicas=3")).values()}
    dra = {h["webhook"]["url"] for h in hooks_of(render("dra.api=true")).values()}
    rules = render("dra.api=true", "dra.deviceTaintRules=true")
    assert dra.isdisjoint(h["webhook"]["url"] for h in hooks_of(rules).values())


def test_status_controller_shape(default_render: list[dict[str, Any]]) -> None:
    spec = one(default_render, "CompositeController")["spec"]
    assert spec["generateSelector"] is True
    assert spec["childResources"] == []
    assert spec["resyncPeriodSeconds"] == 60
    assert spec["parentResource"] == {
        "apiVersion": "cozystack.io/v1alpha1",
        "resource": "gpuclasses",
        "ignoreStatusChanges": True,
    }


DEVICE_CLASS_CHILD = {
    "apiVersion": "resource.k8s.io/v1",
    "resource": "deviceclasses",
    "updateStrategy": {"method": "InPlace"},
}


def test_dra_classes_device_class_child_only_where_the_api_server_serves_dra() -> None:
    """Metacontroller stops a controller whose kinds it cannot find: DeviceClasses are named
    only where the API server serves resource.k8s.io/v1, or where `dra.api` says so."""
    served = (CERT_MANAGER, "resource.k8s.io/v1/DeviceClass")
    cases = {
        (): [],
        ("dra.api=true",): [DEVICE_CLASS_CHILD],
    }
    for sets, children in cases.items():
        documents = render(*sets)
        assert one(documents, "CompositeController")["spec"]["childResources"] == children
        assert env_of(documents)["GPUCLASS_DRA_API"] == str(bool(children)).lower()
    asked = render(api_versions=served)
    assert one(asked, "CompositeController")["spec"]["childResources"] == [DEVICE_CLASS_CHILD]
    told_off = render("dra.api=false", api_versions=served)
    assert one(told_off, "CompositeController")["spec"]["childResources"] == []
    assert env_of(told_off)["GPUCLASS_DRA_API"] == "false"


def test_dra_classes_read_device_taint_rules_only_where_the_api_server_serves_them() -> None:
    """A related kind the API server does not serve stops a DRA class's syncs: DeviceTaintRules
    are read only where resource.k8s.io/v1beta2 serves them (or `dra.deviceTaintRules` says so),
    and never without DRA itself."""
    dra = (CERT_MANAGER, "resource.k8s.io/v1/DeviceClass")
    rules = (*dra, "resource.k8s.io/v1beta2/DeviceTaintRule")
    cases = [
        ((), (CERT_MANAGER,), "false"),
        ((), dra, "false"),
        ((), rules, "true"),
        (("dra.deviceTaintRules=false",), rules, "false"),
        (("dra.api=true", "dra.deviceTaintRules=true"), (CERT_MANAGER,), "true"),
        (("dra.api=false", "dra.deviceTaintRules=true"), rules, "false"),
    ]
    for sets, served, expected in cases:
        documents = render(*sets, api_versions=served)
        assert env_of(documents)["GPUCLASS_DRA_DEVICE_TAINT_RULES"] == expected, (sets, served)


def test_a_device_class_policy_binds_metacontroller_only_where_dra_is_served() -> None:
    """The policy that keeps Metacontroller to GPU classes' DeviceClasses (its refusals are
    tested on the real API server) is rendered where DRA is served, for the ServiceAccount
    named, and not at all when none is."""
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")

    def policy(*sets: str) -> list[dict[str, Any]]:
        return [d for d in render(*sets) if d["kind"] in kinds]

    assert policy() == []
    [made, binding] = policy("dra.api=true", "dra.metacontrollerServiceAccount=cozy-mc/mc")
    [condition] = made["spec"]["matchConditions"]
    assert condition["expression"] == (
        'request.userInfo.username == "system:serviceaccount:cozy-mc:mc"'
    )
    assert binding["spec"] == {
        "policyName": made["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert policy("dra.api=true", "dra.metacontrollerServiceAccount=") == []
    assert template("dra.api=true", "dra.metacontrollerServiceAccount=mc").returncode != 0


def decorator(documents: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [controller] = [
        d for d in by_kind(documents, "DecoratorController") if d["metadata"]["name"] == name
    ]
    return controller


def test_license_controller_shape(default_render: list[dict[str, Any]]) -> None:
    controller = decorator(default_render, "gpuclass-license")
    # The decorator's name marks managed copies (hooks.rules.license.DECORATOR_NAME).
    from hooks.rules.license import DECORATOR_NAME

    assert controller["metadata"]["name"] == DECORATOR_NAME
    spec = controller["spec"]
    assert spec["resyncPeriodSeconds"] == 300
    assert spec["resources"] == [
        {
            "apiVersion": "cozystack.io/v1alpha1",
            "resource": "gpuclasses",
            "ignoreStatusChanges": True,
        }
    ]
    assert spec["attachments"] == [
        {"apiVersion": "v1", "resource": "secrets", "updateStrategy": {"method": "InPlace"}}
    ]


def test_the_tenant_namespace_labeller_decorates_every_namespace(
    default_render: list[dict[str, Any]],
) -> None:
    """Every Namespace, so that a namespace made later is labelled; its sync leaves any that no
    tenant could own alone. No resync: only a release or a namespace changes its labels."""
    spec = decorator(default_render, "gpuclass-tenant-namespaces")["spec"]
    assert spec["resources"] == [{"apiVersion": "v1", "resource": "namespaces"}]
    assert "attachments" not in spec and "resyncPeriodSeconds" not in spec


@pytest.mark.parametrize(
    "selector",
    [
        "kubevirt.io=virt-launcher",
        "a=b,c!=d,e in (y, x,x),f,!g",
        " a == b , k notin (z) ",
        "example.com/gpu-vm,!example.com/excluded",
        "",
    ],
)
def test_the_resource_labeller_decorates_the_pods_and_nodes_the_status_reads(
    selector: str,
) -> None:
    """The labeller's targets are exactly the pods and nodes the selectors pick, which the
    status's rules start from (the chart renders the kubectl syntax the service parses): one the
    status reads but the labeller never labels would never be counted. It relates nothing and has
    no resync: only an object's own change changes its labels."""
    escaped = selector.replace(",", "\\,")
    documents = render(f"selectors.pods={escaped}", f"selectors.nodes={escaped}")
    spec = decorator(documents, "gpuclass-resource-labels")["spec"]
    parsed = Settings(pod_selector=selector).pod_label_selector
    selected = {} if parsed is None else {"labelSelector": msgspec.to_builtins(parsed)}
    assert spec["resources"] == [
        {"apiVersion": "v1", "resource": "pods", **selected},
        {"apiVersion": "v1", "resource": "nodes", **selected},
    ]
    assert set(spec["hooks"]) == {"sync"}
    assert "attachments" not in spec and "resyncPeriodSeconds" not in spec


def test_budget_pools_controller_decorates_the_tenant_namespaces(
    default_render: list[dict[str, Any]],
) -> None:
    """Its targets are the namespaces the labeller marks (every one a tenant could own, never
    unmarked, so a report is never orphaned by its target leaving the selector)."""
    spec = decorator(default_render, "gpuclass-budget-pools")["spec"]
    assert spec["resyncPeriodSeconds"] == 600  # its own, long: each resyncs every namespace
    assert spec["resources"] == [
        {
            "apiVersion": "v1",
            "resource": "namespaces",
            "labelSelector": {"matchLabels": {TENANT_NAMESPACE_LABEL: "true"}},
        }
    ]
    assert spec["attachments"] == [
        {"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}
    ]
    # without admission too: what is reserved is worth reading where nothing enforces it
    plain = render(*PLAIN, api_versions=())
    assert {"gpuclass-tenant-namespaces", "gpuclass-budget-pools"} <= {
        d["metadata"]["name"] for d in by_kind(plain, "DecoratorController")
    }


def test_the_class_index_decorates_the_releases_cluster_role_in_its_namespace(
    default_render: list[dict[str, Any]],
) -> None:
    """One target, the release's ClusterRole (where earlier versions attached their one-target
    reports, which the index's sync replaces); the index lives in the release's namespace, which
    the service is told, and is updated in place as classes change."""
    spec = decorator(default_render, "gpuclass-budget-report")["spec"]
    [resource] = spec["resources"]
    assert (resource["apiVersion"], resource["resource"]) == (
        "rbac.authorization.k8s.io/v1",
        "clusterroles",
    )
    targets = [
        r
        for r in by_kind(default_render, "ClusterRole")
        if resource["labelSelector"]["matchLabels"].items() <= r["metadata"]["labels"].items()
    ]
    assert [t["metadata"]["name"] for t in targets] == ["gpu-gpuclass-hooks"]
    assert spec["attachments"] == [
        {"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}
    ]
    assert set(spec["hooks"]) == {"customize", "sync"}
    assert "resyncPeriodSeconds" not in spec
    release_namespace = "cozy-gpu"  # render's
    assert env_of(default_render)["GPUCLASS_BUDGET_CLASSES_NAMESPACE"] == release_namespace
    elsewhere = render(namespace="gpu-system")
    assert env_of(elsewhere)["GPUCLASS_BUDGET_CLASSES_NAMESPACE"] == "gpu-system"


def test_deployment_is_hardened(default_render: list[dict[str, Any]]) -> None:
    deployment = one(default_render, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # The only writable place is gunicorn's heartbeat directory, in memory.
    assert [v["mountPath"] for v in container["volumeMounts"]] == [
        "/tmp",
        "/etc/gpuclass-hooks/auth",
        "/etc/gpuclass-hooks/tls",
    ]
    assert all(v["readOnly"] for v in container["volumeMounts"][1:])
    assert pod["volumes"][0] == {
        "name": "tmp",
        "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"},
    }
    assert "--worker-tmp-dir=/tmp" in container["args"]


def test_replicas_spread_over_nodes_and_zones_and_prefer_the_control_plane(
    default_render: list[dict[str, Any]],
) -> None:
    """While admission is on, tenants' GPU apps wait on these pods: two replicas on one node
    would both go with it, so they spread (softly: a cordoned node never leaves one pending),
    outrank workloads, and may run where Cozystack runs its own webhooks."""
    pod = one(default_render, "Deployment")["spec"]["template"]["spec"]
    selector = one(default_render, "Deployment")["spec"]["selector"]
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for constraint in spread.values():
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway" and constraint["maxSkew"] == 1
        assert constraint["labelSelector"] == selector
    preferred = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["preference"]["matchExpressions"][0]["key"] == (
        "node-role.kubernetes.io/control-plane"
    )
    assert {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
            "effect": "NoSchedule"} in pod["tolerations"]  # fmt: skip
    assert pod["priorityClassName"] == "system-cluster-critical"
    without = one(render("admission.enabled=false"), "Deployment")["spec"]["template"]["spec"]
    assert "priorityClassName" not in without
    chosen = render("priorityClassName=mine", "admission.enabled=true")
    assert one(chosen, "Deployment")["spec"]["template"]["spec"]["priorityClassName"] == "mine"
    none = render("priorityClassName=", "admission.enabled=true")
    assert "priorityClassName" not in one(none, "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "sets",
    [
        PLAIN,
        (
            *("tls.enabled=true", "tls.existingSecret=x", "tls.clientAuth.enabled=true"),
            *("tls.clientAuth.existingSecret=y", "admission.enabled=false"),
        ),
    ],
    ids=["plain", "mtls"],
)
def test_probes_ask_the_health_port_over_plain_http(sets: tuple[str, ...]) -> None:
    """The health listener (hooks.serving.listeners) serves the probes' paths, outside the hooks'
    threads and without the hooks' client certificate, so probes are real HTTP checks even under
    mTLS."""
    container = container_of(render(*sets))
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"hooks": 8080, "health": 8081, "metrics": 9090, "admission": 9443}
    assert "--health-port=8081" in container["args"]
    assert "--metrics-port=9090" in container["args"]
    served = set(listeners.health_routes(listeners.ServiceState()))
    for probe in (container["livenessProbe"], container["readinessProbe"]):
        assert probe["httpGet"]["port"] == "health"
        assert probe["httpGet"].get("scheme", "HTTP") == "HTTP"
        assert probe["httpGet"]["path"] in served


def test_the_service_exposes_the_metrics_port(default_render: list[dict[str, Any]]) -> None:
    ports = {p["name"]: p for p in one(default_render, "Service")["spec"]["ports"]}
    assert ports["metrics"]["targetPort"] == "metrics"
    assert set(listeners.metrics_routes(Metrics(1.0), None)) == {"/metrics"}


@pytest.mark.parametrize(
    ("sets", "scheme", "port"),
    [
        (("admission.enabled=true",), "https", 443),
        (PLAIN, "http", 80),
        (("admission.enabled=true", "service.port=8443"), "https", 8443),
    ],
)
def test_the_hook_service_port_is_named_after_its_scheme_and_every_caller_uses_it(
    sets: tuple[str, ...], scheme: str, port: int
) -> None:
    documents = render(*sets)
    ports = {p["name"]: p for p in one(documents, "Service")["spec"]["ports"]}
    assert ports[scheme] == {"name": scheme, "port": port, "targetPort": "hooks", "protocol": "TCP"}
    container_ports = {p["name"] for p in container_of(documents)["ports"]}
    assert "hooks" in container_ports
    for hook in hooks_of(documents).values():
        url = urlparse(hook["webhook"]["url"])
        assert (url.scheme, url.port) == (scheme, port)
    for configuration in by_kind(documents, "ValidatingWebhookConfiguration"):
        webhooks = configuration["webhooks"]
        assert {w["clientConfig"]["service"]["port"] for w in webhooks} == {9443}
        assert ports["admission"] == {
            "name": "admission", "port": 9443, "targetPort": "admission", "protocol": "TCP"
        }  # fmt: skip
    check = one(documents, "Pod")["spec"]["containers"][0]["args"][1]
    assert urlparse(check).port == port


def test_an_upgrade_from_port_80_keeps_the_old_port_until_told_to_drop_it() -> None:
    """Metacontroller and the API server call the new port only once they see the new spec: the
    port callers configured by an earlier release used stays routed to the hooks meanwhile."""
    ports = {p["name"]: p for p in one(render(), "Service")["spec"]["ports"]}
    assert ports["https-previous"] == {
        "name": "https-previous", "port": 80, "targetPort": "hooks", "protocol": "TCP"
    }  # fmt: skip
    dropped = {
        p["name"] for p in one(render("service.previousPort=null"), "Service")["spec"]["ports"]
    }
    assert dropped == {"https", "metrics", "admission"}
    same = {p["name"] for p in one(render("service.port=80"), "Service")["spec"]["ports"]}
    assert same == {"https", "metrics", "admission"}


def test_the_durations_the_settings_table_shows_the_chart_accepts() -> None:
    """The README's table (from hooks/settings.py) is read by people who set the chart's value."""
    description = Settings.model_fields["hook_timeout"].description or ""
    shown = re.findall(r"`([0-9][0-9a-z]*)`", description)
    assert shown
    for duration in shown:
        result = template(f"controllers.hookTimeout={duration}")
        assert result.returncode == 0, (duration, result.stderr)


@pytest.mark.parametrize(("timeout", "seconds"), [("30s", 30), ("2m", 120), ("1500ms", 2)])
def test_termination_grace_covers_the_drain_and_the_longest_call(
    timeout: str, seconds: int
) -> None:
    deployment = one(render(f"controllers.hookTimeout={timeout}"), "Deployment")
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    defaults = Settings()
    # gunicorn's graceful timeout, which a call accepted during the drain delay may use up
    assert grace > defaults.shutdown_delay_seconds + defaults.header_timeout_seconds + seconds
    assert env_of(render(f"controllers.hookTimeout={timeout}"))["GPUCLASS_HOOK_TIMEOUT"] == timeout


def test_every_setting_has_a_value(default_render: list[dict[str, Any]]) -> None:
    entries = container_of(default_render)["env"]
    env = env_of(default_render)
    # The memory budget follows the container's own limit, through the downward API.
    assert [e for e in entries if "value" not in e] == [
        {
            "name": "GPUCLASS_MEMORY_LIMIT_BYTES",
            "valueFrom": {
                "resourceFieldRef": {"containerName": "hooks", "resource": "limits.memory"}
            },
        }
    ]
    assert container_of(default_render)["name"] == "hooks"
    assert container_of(default_render)["resources"]["limits"]["memory"] == "2Gi"
    assert env == {
        "GPUCLASS_ENABLED": "true",
        "GPUCLASS_DRA_API": "false",  # Helm's own list, without a cluster, has no DRA
        "GPUCLASS_DRA_DEVICE_TAINT_RULES": "false",
        "GPUCLASS_KUBEVIRT_NAMESPACE": "cozy-kubevirt",
        "GPUCLASS_KUBEVIRT_NAME": "kubevirt",
        "GPUCLASS_NODE_SELECTOR": "",
        "GPUCLASS_POD_SELECTOR": "kubevirt.io=virt-launcher",
        "GPUCLASS_VGPU_NAMESPACE_LABEL": "namespace.cozystack.io/vgpu",
        "GPUCLASS_LICENSE_NAMESPACES": "cozy-gpu-operator",
        "GPUCLASS_AUTH_TOKEN_FILE": "/etc/gpuclass-hooks/auth/accepted-tokens",
        "GPUCLASS_TLS_CERT_FILE": "/etc/gpuclass-hooks/tls/tls.crt",
        "GPUCLASS_TLS_KEY_FILE": "/etc/gpuclass-hooks/tls/tls.key",
        "GPUCLASS_MAX_BODY_BYTES": "1073741824",
        "GPUCLASS_KUBE_READ_MAX_BYTES": "67108864",
        "GPUCLASS_METRICS_REQUIRE_AUTH": "true",
        "GPUCLASS_HOOK_TIMEOUT": "30s",
        "GPUCLASS_STATUS_RESYNC_SECONDS": "60",
        "GPUCLASS_BUDGET_CLASSES_NAMESPACE": "cozy-gpu",
        "GPUCLASS_BUDGET_REPORT_RESYNC_SECONDS": "600",
        "GPUCLASS_ADMISSION_CACHE_SECONDS": "5",
        "GPUCLASS_ADMISSION_TIMEOUT_SECONDS": "10",
        "GPUCLASS_GPU_INSTANCE_TYPES": "gn1.xlarge,gn1.2xlarge,gn1.4xlarge,gn1.8xlarge",
        "GPUCLASS_PLATFORM_VALUES_SECRET": "cozystack-values",
        "GPUCLASS_LOG_LEVEL": "info",
        "GPUCLASS_MEMORY_WAIT_SECONDS": "20",
    }
    # Every variable the chart sets is a real setting, and every value parses.
    for name in [e["name"] for e in entries]:
        assert name.removeprefix("GPUCLASS_").lower() in Settings.model_fields
    Settings(**{k.removeprefix("GPUCLASS_").lower(): v for k, v in env.items()})


def test_the_disruption_budget_selects_the_hook_pods(default_render: list[dict[str, Any]]) -> None:
    """A budget whose selector carries a label the pods lack protects nothing: a drain may evict
    both replicas at once."""
    selector = one(default_render, "PodDisruptionBudget")["spec"]["selector"]
    pods = one(default_render, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert set(selector) == {"matchLabels"} and selector["matchLabels"]
    assert selector["matchLabels"].items() <= pods.items()


def test_every_service_port_forwards_to_a_port_the_container_listens_on(
    default_render: list[dict[str, Any]],
) -> None:
    """Each Service port's target is a named port of the container, and that port is the one the
    service is told to listen on (hooks, metrics), so a call through the Service reaches a
    listener."""
    container = container_of(default_render)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    args = dict(arg.split("=", 1) for arg in container["args"] if "=" in arg)
    listening = {
        "hooks": int(args["--bind"].rsplit(":", 1)[1]),
        "metrics": int(args["--metrics-port"]),
        "admission": int(args["--admission-port"]),
    }
    service = one(default_render, "Service")
    assert service["spec"]["selector"].items() <= (
        one(default_render, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports, port
        assert ports[port["targetPort"]] == listening[port["targetPort"]], port


def test_the_serving_certificate_names_the_service_by_every_name_a_client_uses() -> None:
    documents = render(*SECURE)
    [server] = [
        c["spec"]
        for c in by_kind(documents, "Certificate")
        if c["metadata"]["name"] == "gpu-gpuclass-hooks-tls"
    ]
    service = one(documents, "Service")["metadata"]["name"]
    names = [f"{service}.cozy-gpu{suffix}" for suffix in ("", ".svc", ".svc.cluster.local")]
    assert set(server["dnsNames"]) >= {service, *names}


def test_pdb_and_rbac(default_render: list[dict[str, Any]]) -> None:
    assert one(default_render, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert by_kind(render("replicas=1"), "PodDisruptionBudget") == []
    role = named(default_render, "ClusterRole", "gpu-gpuclass-hooks")
    assert role["rules"] == [
        {
            "apiGroups": ["kubevirt.io"],
            "resources": ["kubevirts"],
            "resourceNames": ["kubevirt"],
            "verbs": ["get"],
        }
    ]
    account = one(default_render, "ServiceAccount")["metadata"]["name"]
    for binding in by_kind(default_render, "ClusterRoleBinding"):
        if not binding["metadata"]["name"].endswith("-class-reader"):
            assert binding["subjects"][0]["name"] == account
    assert not by_kind(default_render, "Role")


def test_the_budget_report_view_is_aggregated_into_cozystacks_tenant_view_role(
    default_render: list[dict[str, Any]],
) -> None:
    """Cozystack's `cozy:tenant:view` (which its use, admin and super-admin roles aggregate in
    turn) selects ClusterRoles by a label: the chart's report view carries it."""
    [view] = [r for r in cozystack.tenant_roles() if r["metadata"]["name"] == "cozy:tenant:view"]
    report_view = named(default_render, "ClusterRole", "gpu-gpuclass-hooks-budget-report-view")
    labels = report_view["metadata"]["labels"]
    assert any(
        selector["matchLabels"].items() <= labels.items()
        for selector in view["aggregationRule"]["clusterRoleSelectors"]
    )


def test_every_authenticated_user_may_read_gpuclasses_and_nothing_else_unless_narrowed(
    default_render: list[dict[str, Any]],
) -> None:
    """A tenant choosing a class reads its status; the role grants reads of GPUClasses alone,
    bound to the groups named (every authenticated user by default), or to no one."""
    role = named(default_render, "ClusterRole", "gpu-gpuclass-hooks-class-reader")
    assert role["rules"] == [
        {
            "apiGroups": ["cozystack.io"],
            "resources": ["gpuclasses"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    assert "labels" not in role or not any(
        key.startswith("rbac.cozystack.io/") for key in role["metadata"]["labels"]
    )

    def subjects(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            subject
            for b in by_kind(documents, "ClusterRoleBinding")
            if b["roleRef"]["name"] == "gpu-gpuclass-hooks-class-reader"
            for subject in b["subjects"]
        ]

    group = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group"}
    assert subjects(default_render) == [{**group, "name": "system:authenticated"}]
    narrowed = render("classReaders.groups={tenant-a-view,tenant-b-view}")
    assert subjects(narrowed) == [
        {**group, "name": "tenant-a-view"},
        {**group, "name": "tenant-b-view"},
    ]
    off = render("classReaders.groups=null")
    assert subjects(off) == []
    assert "gpu-gpuclass-hooks-class-reader" not in {
        r["metadata"]["name"] for r in by_kind(off, "ClusterRole")
    }


def test_tenants_view_role_lets_them_get_their_budget_report_and_nothing_else(
    default_render: list[dict[str, Any]],
) -> None:
    """Cozystack's tenant roles aggregate ClusterRoles by this label and grant no ConfigMaps:
    the chart adds `get` on the one ConfigMap name the report writes, bound nowhere by itself
    (the tenant's own bindings decide where), and not the report's target label."""
    role = named(default_render, "ClusterRole", "gpu-gpuclass-hooks-budget-report-view")
    assert role["metadata"]["labels"]["rbac.cozystack.io/aggregate-to-tenant-view"] == "true"
    assert "gpuclass.cozystack.io/budget-report" not in role["metadata"]["labels"]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [REPORT_NAME],
            "verbs": ["get"],
        }
    ]
    bound = {b["roleRef"]["name"] for b in by_kind(default_render, "ClusterRoleBinding")}
    assert role["metadata"]["name"] not in bound


@pytest.mark.parametrize(
    "value", ["gpuu.enabled=true", "selectors.node=x", "gpuOperator.variant=gpu", "replicas=0"]
)
def test_values_schema_rejects_misspelled_or_invalid_values(value: str) -> None:
    result = helm_run("template", "gpu", str(CHART), "--kube-version", KUBE_VERSION, "--set", value)
    assert result.returncode != 0
    assert "schema" in result.stderr


def test_every_value_is_documented() -> None:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(values) == set(schema["properties"])
    for key in values:
        assert re.search(rf"#.*\n(?:#.*\n)*{key}:|^{key}:", text, re.M)


# --- the CRD --------------------------------------------------------------------------------


def crd_schema() -> dict[str, Any]:
    [version] = crd()["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_crd_is_cluster_scoped_with_status_subresource() -> None:
    definition = crd()
    assert definition["metadata"]["name"] == "gpuclasses.cozystack.io"
    assert definition["spec"]["scope"] == "Cluster"
    [version] = definition["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}


def test_crd_printer_columns() -> None:
    [version] = crd()["spec"]["versions"]
    columns = [(c["name"], c.get("priority", 0)) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("Resource", 0),
        ("DeviceClass", 0),
        ("Free", 0),
        ("MaxPerNode", 0),
        ("Ready", 0),
        ("Age", 0),
        ("License", 1),
    ]


def test_crd_name_rule_limits_names_to_dns_labels() -> None:
    [rule] = crd_schema()["x-kubernetes-validations"]
    assert "self.metadata.name.size() <= 63" in rule["rule"]
    pattern = re.search(r"matches\('(.+)'\)", rule["rule"])
    assert pattern is not None
    assert re.fullmatch(pattern.group(1), "l40s-24q")
    assert not re.fullmatch(pattern.group(1), "L40S.24q")


def declared_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    paths = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        paths.add(path)
        paths |= declared_paths(sub, path)
        if "items" in sub:
            paths |= declared_paths(sub["items"], f"{path}[]")
    return paths


def produced_paths(value: Any, prefix: str = "") -> set[str]:
    paths = set()
    if isinstance(value, dict):
        for key, sub in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(path)
            paths |= produced_paths(sub, path)
    elif isinstance(value, list):
        for item in value:
            paths |= produced_paths(item, f"{prefix}[]")
    return paths


def test_crd_status_schema_declares_every_key_the_status_hook_writes(settings: Settings) -> None:
    client = create_app(settings).test_client()
    requests = [
        status_sync_request(
            licensed_class(),
            nodes=[node("gpu-1")],
            secrets=[source_secret(), secret("gpuclass-l40s-license", "b")],
            namespaces=[namespace("a"), namespace("b")],
        ),
        status_sync_request(gpuclass("broken", resource=None)),
    ]
    status_schema = crd_schema()["properties"]["status"]
    declared = declared_paths(status_schema)
    for request in requests:
        status = client.post("/status/sync", json=request).json["status"]
        assert produced_paths(status) <= declared
        jsonschema.validate(status, openapi_to_jsonschema(status_schema))
    assert "observedGeneration" in declared  # injected by Metacontroller


def openapi_to_jsonschema(schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI v3 structural schemas are JSON Schema but for `x-kubernetes-*` keys (ignored) and
    `format`; CEL rules are not checked here."""
    return copy.deepcopy(schema)


VALID_CLASSES = [
    {"resourceName": "nvidia.com/NVIDIA_L40S-24Q"},
    {
        "resourceName": "nvidia.com/GH100_H100_PCIE",
        "displayName": "H100",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    {"resourceName": "nvidia.com/X", "license": {"secretRef": {"name": "tok"}, "featureType": 2}},
    {
        "resourceName": "nvidia.com/X",
        "license": {"secretRef": {"name": "tok", "namespace": "cozy-gpu-operator", "key": "t.tok"}},
    },
    {"dra": {"driver": "gpu.nvidia.com", "attributes": {"type": "vfio", "index": 0}}},
]
INVALID_CLASSES = [
    {"dra": {"driver": "Not_DNS", "attributes": {"type": "vfio"}}},
    {"dra": {"driver": "gpu.nvidia.com", "attributes": {}}},
    {"dra": {"driver": "gpu.nvidia.com"}},
    {"resourceName": "gpu"},
    {"resourceName": "nvidia.com/"},
    {"resourceName": 5},
    {"resourceName": "nvidia.com/X", "license": {"secretRef": {"name": "tok"}, "featureType": 0}},
    {"resourceName": "nvidia.com/X", "license": {"secretRef": {"name": "tok"}, "featureType": 3}},
    {"resourceName": "nvidia.com/X", "license": {"featureType": 1}},
    {
        "resourceName": "nvidia.com/X",
        "license": {"secretRef": {"name": "tok", "namespace": "Bad_NS"}},
    },
]
# The CRD's CEL rules refuse these (tests/apiserver has them on the real API server); the hook too.
REFUSED_BY_CEL = [
    {},
    {"resourceName": "nvidia.com/X", "dra": {"driver": "a.b", "attributes": {"t": "v"}}},
    {"dra": {"driver": "a.b", "attributes": {"t": "v"}}, "license": {"secretRef": {"name": "t"}}},
    {"dra": {"driver": "a.b", "attributes": {"9t": "v"}}},
    {"dra": {"driver": "a.b", "attributes": {"t": True}}},
]
# The CRD refuses these, but the hook must cope with them (objects written before a CRD change):
# the toleration rule says an unknown operator matches nothing.
REFUSED_BY_CRD_ONLY = [
    {"resourceName": "nvidia.com/X", "tolerations": [{"key": "k", "operator": "Gt"}]},
    {"resourceName": "nvidia.com/X", "tolerations": [{"key": "k", "effect": "Sometimes"}]},
]


@pytest.mark.parametrize("spec", VALID_CLASSES)
def test_sample_gpuclasses_are_valid_against_the_crd(spec: dict[str, Any]) -> None:
    obj = {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": "c"},
        "spec": spec,
    }
    jsonschema.validate(obj, openapi_to_jsonschema(crd_schema()))


@pytest.mark.parametrize("spec", INVALID_CLASSES + REFUSED_BY_CRD_ONLY)
def test_invalid_gpuclasses_are_refused_by_the_crd(spec: dict[str, Any]) -> None:
    obj = {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": "c"},
        "spec": spec,
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, openapi_to_jsonschema(crd_schema()))


def test_crd_and_hook_agree_on_class_specs() -> None:
    """The CRD refuses what the hook calls InvalidSpec, and accepts what it accepts."""
    import msgspec

    from hooks.wire.gpuclass import InvalidSpecError, parse_spec

    for spec in VALID_CLASSES + REFUSED_BY_CRD_ONLY:
        parse_spec(msgspec.Raw(json.dumps(spec).encode()))
    for spec in INVALID_CLASSES + REFUSED_BY_CEL:
        with pytest.raises(InvalidSpecError):
            parse_spec(msgspec.Raw(json.dumps(spec).encode()))


def test_crd_defaults_match_the_hook_defaults() -> None:
    from hooks.wire.gpuclass import DEFAULT_TOKEN_KEY

    license = crd_schema()["properties"]["spec"]["properties"]["license"]["properties"]
    assert license["featureType"]["default"] == 1
    assert license["secretRef"]["properties"]["key"]["default"] == DEFAULT_TOKEN_KEY


# --- authentication and TLS wiring ----------------------------------------------------------

SECURE = (
    *("auth.enabled=true", "tls.enabled=true", "tls.clientAuth.enabled=true"),
    "admission.enabled=false",
)


def test_defaults_with_cert_manager_give_token_auth_and_https(
    default_render: list[dict[str, Any]],
) -> None:
    [token_secret] = by_kind(default_render, "Secret")
    for hook in hooks_of(default_render).values():
        assert set(hook["webhook"]) == {"url", "timeout", "authorization", "caBundle"}
        assert hook["webhook"]["url"].startswith("https://")
        assert (
            hook["webhook"]["authorization"]["secretRef"]["name"]
            == token_secret["metadata"]["name"]
        )
    issued = {c["spec"]["secretName"] for c in by_kind(default_render, "Certificate")}
    assert issued == {"gpu-gpuclass-hooks-ca", "gpu-gpuclass-hooks-tls"}


def test_the_defaults_render_without_a_cluster_with_or_without_the_cert_manager_api() -> None:
    """What Argo CD, a `helm template | kubectl apply` pipeline and manifest linters run: no
    cluster to read, no API versions passed. cert-manager issues the certificates (the install
    needs it, as on a cluster that serves its API), and the admission port is left open to
    every address, its own bounds protecting the hooks (NOTES.txt says how to narrow it)."""
    for api_versions in ((), (CERT_MANAGER,)):
        documents = render(api_versions=api_versions, api_servers=())
        issued = {c["spec"]["secretName"] for c in by_kind(documents, "Certificate")}
        assert issued == {"gpu-gpuclass-hooks-ca", "gpu-gpuclass-hooks-tls"}
        [config] = by_kind(documents, "ValidatingWebhookConfiguration")
        assert "cert-manager.io/inject-ca-from" in config["metadata"]["annotations"]


def test_plain_http_renders_only_when_asked_and_notes_warn(tmp_path: Path) -> None:
    documents = render(*PLAIN, api_versions=())
    for hook in hooks_of(documents).values():
        assert set(hook["webhook"]) == {"url", "timeout"}
        assert hook["webhook"]["url"].startswith("http://")
    assert by_kind(documents, "Secret") == [] and by_kind(documents, "Certificate") == []
    assert "WARNING: the hooks serve plain HTTP without authentication" in notes(
        *PLAIN, tmp_path=tmp_path / "plain"
    )
    assert "WARNING" not in notes(tmp_path=tmp_path / "secure")


def test_notes_say_how_to_narrow_an_admission_port_open_to_every_address(tmp_path: Path) -> None:
    opened = notes("networkPolicy.apiServerCIDRs=null", tmp_path=tmp_path / "open")
    assert "--set 'networkPolicy.apiServerCIDRs=" in opened
    assert "apiServerCIDRs" not in notes(tmp_path=tmp_path / "narrow")


def notes(*sets: str, tmp_path: Path) -> str:
    """NOTES.txt rendered as `helm install` prints it. helm template leaves NOTES out and helm
    install cannot be told the Kubernetes version, so a copy of the chart renders the same text
    through `tpl` into a ConfigMap."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "notes.txt") . | quote }}}\n'
    )
    args = ["template", "gpu", str(chart), "--kube-version", KUBE_VERSION]
    args += [*ON_A_CLUSTER, "--show-only", "templates/notes-under-test.yaml"]
    result = helm_run(*args, *(arg for value in sets for arg in ("--set", value)))
    assert result.returncode == 0, result.stderr
    return str(yaml.safe_load(result.stdout)["data"]["notes"])


def test_every_webhook_carries_token_ca_and_client_certificate_when_enabled() -> None:
    documents = render(*SECURE)
    [token_secret] = by_kind(documents, "Secret")
    for hook in hooks_of(documents).values():
        webhook = hook["webhook"]
        assert webhook["url"].startswith("https://")
        assert webhook["authorization"] == {
            "type": "Bearer",
            "secretRef": {
                "name": token_secret["metadata"]["name"],
                "namespace": "cozy-gpu",
                "key": "token",
            },
        }
        assert webhook["caBundle"] == {
            "secretRef": {
                "name": "gpu-gpuclass-hooks-tls",
                "namespace": "cozy-gpu",
                "key": "ca.crt",
            }
        }
        assert webhook["clientTLS"] == {
            "secretRef": {"name": "gpu-gpuclass-hooks-client", "namespace": "cozy-gpu"}
        }
    assert set(token_secret["data"]) == {"token", "accepted-tokens"}
    assert token_secret["data"]["token"] == token_secret["data"]["accepted-tokens"]


def test_cert_manager_issues_ca_server_and_client_certificates() -> None:
    documents = render(*SECURE)
    certificates = {c["metadata"]["name"]: c["spec"] for c in by_kind(documents, "Certificate")}
    assert certificates["gpu-gpuclass-hooks-ca"]["isCA"] is True
    server = certificates["gpu-gpuclass-hooks-tls"]
    assert "gpu-gpuclass-hooks.cozy-gpu.svc" in server["dnsNames"]
    assert "server auth" in server["usages"]
    assert "client auth" in certificates["gpu-gpuclass-hooks-client"]["usages"]
    mine = render("tls.enabled=true", "tls.existingSecret=mine", "admission.enabled=false")
    assert by_kind(mine, "Certificate") == []


def test_the_ca_keeps_its_key_on_renewal_and_each_certificate_has_an_explicit_lifetime() -> None:
    """cert-manager 1.18+ gives a renewed CA a new key unless told not to: the outage of a CA
    rotation on every renewal. Lifetimes are the chart's, not cert-manager's defaults."""
    certificates = {
        c["metadata"]["name"]: c["spec"] for c in by_kind(render(*SECURE), "Certificate")
    }
    ca = certificates.pop("gpu-gpuclass-hooks-ca")
    assert ca["privateKey"]["rotationPolicy"] == "Never"
    assert ca["duration"] == "43800h"
    assert {name: (c["duration"], c["renewBefore"]) for name, c in certificates.items()} == {
        "gpu-gpuclass-hooks-tls": ("8760h", "720h"),
        "gpu-gpuclass-hooks-client": ("8760h", "720h"),
    }
    renewed = render(*SECURE, "tls.certManager.duration=2160h", "tls.certManager.renewBefore=360h")
    assert {c["spec"]["duration"] for c in by_kind(renewed, "Certificate")} == {"43800h", "2160h"}


def test_deployment_gets_the_files_and_settings() -> None:
    documents = render(*SECURE)
    container, env = container_of(documents), env_of(documents)
    assert env["GPUCLASS_AUTH_TOKEN_FILE"] == "/etc/gpuclass-hooks/auth/accepted-tokens"
    assert env["GPUCLASS_TLS_CERT_FILE"] == "/etc/gpuclass-hooks/tls/tls.crt"
    assert env["GPUCLASS_TLS_KEY_FILE"] == "/etc/gpuclass-hooks/tls/tls.key"
    assert env["GPUCLASS_TLS_CLIENT_CA_FILE"] == "/etc/gpuclass-hooks/tls/ca.crt"
    assert {m["mountPath"] for m in container["volumeMounts"]} == {
        "/tmp",
        "/etc/gpuclass-hooks/auth",
        "/etc/gpuclass-hooks/tls",
    }
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["mountPath"] != "/tmp")
    Settings(**{k.removeprefix("GPUCLASS_").lower(): v for k, v in env.items()})


def test_body_limit_and_metrics_auth_reach_the_service() -> None:
    env = env_of(render("maxBodyBytes=2048", "metrics.requireAuth=true"))
    assert env["GPUCLASS_MAX_BODY_BYTES"] == "2048"
    assert env["GPUCLASS_METRICS_REQUIRE_AUTH"] == "true"


# --- the GPU budget admission webhook -------------------------------------------------------


def test_admission_webhook_is_on_by_default_and_off_only_when_told(
    default_render: list[dict[str, Any]],
) -> None:
    """Budget enforcement is a security control: an install or an upgrade that leaves it out
    keeps it, and only `admission.enabled=false` removes it."""
    [configuration] = by_kind(default_render, "ValidatingWebhookConfiguration")
    assert {w["failurePolicy"] for w in configuration["webhooks"]} == {"Fail"}
    roles = {r["metadata"]["name"] for r in by_kind(default_render, "ClusterRole")}
    assert roles == {
        "gpu-gpuclass-hooks",
        "gpu-gpuclass-hooks-admission",
        "gpu-gpuclass-hooks-budget-report-view",
        "gpu-gpuclass-hooks-class-reader",
    }
    off = render("admission.enabled=false")
    assert by_kind(off, "ValidatingWebhookConfiguration") == []
    assert {r["metadata"]["name"] for r in by_kind(off, "ClusterRole")} == {
        "gpu-gpuclass-hooks",
        "gpu-gpuclass-hooks-budget-report-view",
        "gpu-gpuclass-hooks-class-reader",
    }


def test_admission_webhook_rules_and_routes() -> None:
    documents = render("admission.enabled=true", "tls.enabled=true")
    config = one(documents, "ValidatingWebhookConfiguration")
    app = create_app(Settings())
    served = {rule.rule for rule in app.url_map.iter_rules() if "POST" in (rule.methods or set())}
    hooks = {w["name"]: w for w in config["webhooks"]}
    assert set(hooks) == {
        "gpu-budget.gpuclass.cozystack.io",
        "tenant-gpu-keys.gpuclass.cozystack.io",
    }
    resources = {
        "gpu-budget.gpuclass.cozystack.io": ["vminstances", "kubernetesnodeses", "kuberneteses"],
        "tenant-gpu-keys.gpuclass.cozystack.io": ["tenants"],
    }
    service = one(documents, "Service")
    for name, hook in hooks.items():
        assert hook["failurePolicy"] == "Fail"
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["clientConfig"]["service"]["path"] in served
        assert hook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
        assert hook["rules"] == [
            {
                "apiGroups": ["apps.cozystack.io"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": resources[name],
                "scope": "Namespaced",
            }
        ]
        assert (
            hook["namespaceSelector"]["matchExpressions"][0]["key"] == "kubernetes.io/metadata.name"
        )
    assert (
        config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == "cozy-gpu/gpu-gpuclass-hooks-tls"
    )


def test_admission_webhook_uses_a_given_ca_bundle() -> None:
    documents = render(
        "admission.enabled=true",
        "tls.enabled=true",
        "tls.existingSecret=mine",
        "admission.caBundle=Q0E=",
    )
    config = one(documents, "ValidatingWebhookConfiguration")
    assert {w["clientConfig"]["caBundle"] for w in config["webhooks"]} == {"Q0E="}
    assert "annotations" not in config["metadata"]


def test_a_trust_bundle_is_what_metacontroller_and_the_api_server_trust() -> None:
    """During a CA rotation both clients of the hooks must trust the old CA and the new one; one
    value says so for both, inline in the controllers' spec, so changing it rebuilds them."""
    both = trustme.CA().cert_pem.bytes().decode() + trustme.CA().cert_pem.bytes().decode()
    documents = render(
        "admission.enabled=true", "tls.existingSecret=mine", f"tls.trustBundle={both}"
    )
    for hook in hooks_of(documents).values():
        assert hook["webhook"]["caBundle"] == {"inline": both}
    config = one(documents, "ValidatingWebhookConfiguration")
    assert {
        base64.b64decode(w["clientConfig"]["caBundle"]).decode() for w in config["webhooks"]
    } == {both}
    assert "annotations" not in config["metadata"]
    issued = render("admission.enabled=true", f"tls.trustBundle={both}")
    assert "annotations" not in one(issued, "ValidatingWebhookConfiguration")["metadata"]
    twice = template("admission.enabled=true", f"tls.trustBundle={both}", "admission.caBundle=Q0E=")
    assert twice.returncode != 0 and "not both" in twice.stderr


def test_admission_refuses_to_render_without_a_ca_it_can_read() -> None:
    """A fail-closed webhook without a caBundle refuses every tenant change: with an existing
    Secret the chart cannot read (helm template, GitOps) and no bundle given, it does not render."""
    result = template("admission.enabled=true", "tls.existingSecret=mine")
    assert result.returncode != 0
    assert "needs a CA to trust" in result.stderr and "tls.trustBundle" in result.stderr


def test_admission_rbac_lists_what_the_webhook_reads() -> None:
    documents = render("admission.enabled=true", "tls.enabled=true")
    role = next(
        r for r in by_kind(documents, "ClusterRole") if r["metadata"]["name"].endswith("-admission")
    )
    assert role["rules"] == [
        {"apiGroups": ["cozystack.io"], "resources": ["gpuclasses"], "verbs": ["list"]},
        {"apiGroups": ["helm.toolkit.fluxcd.io"], "resources": ["helmreleases"], "verbs": ["list"]},
        {
            "apiGroups": ["instancetype.kubevirt.io"],
            "resources": ["virtualmachineclusterinstancetypes"],
            "verbs": ["list"],
        },
    ]
    binding = next(
        b
        for b in by_kind(documents, "ClusterRoleBinding")
        if b["roleRef"]["name"] == role["metadata"]["name"]
    )
    assert binding["subjects"][0]["name"] == one(documents, "ServiceAccount")["metadata"]["name"]
    assert env_of(documents)["GPUCLASS_ADMISSION_CACHE_SECONDS"] == "5"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ("admission.enabled=true", "tls.enabled=false", "auth.enabled=false"),
            "admission.enabled (on by default) needs tls.enabled",
        ),
    ],
)
def test_admission_webhook_refuses_settings_the_api_server_cannot_use(
    values: tuple[str, ...], message: str
) -> None:
    result = template(*values)
    assert result.returncode != 0 and message in result.stderr


def test_the_memory_budget_can_be_set_or_turned_off() -> None:
    for value, expected in (("1000000000", "1000000000"), ("0", "0")):
        env = {
            e["name"]: e.get("value")
            for e in container_of(render(f"memoryBudget.bytes={value}"))["env"]
        }
        assert env["GPUCLASS_MEMORY_BUDGET_BYTES"] == expected


# --- every combination that renders can start ------------------------------------------------

TLS_MATRIX = {
    "tls.enabled": (True, False),
    "tls.certManager.enabled": (True, False),
    "tls.existingSecret": ("", "own-tls"),
    "tls.clientAuth.enabled": (True, False),
    "tls.clientAuth.existingSecret": ("", "own-client"),
    "admission.enabled": (True, False),
    "auth.enabled": (True, False),
}


def secrets_used(documents: list[dict[str, Any]]) -> set[str]:
    """Every Secret a pod of the chart mounts, and every Secret a controller or webhook names."""
    used = set()
    for document in documents:
        spec = document.get("spec", {})
        pod = spec.get("template", {}).get("spec", spec) if document["kind"] in POD_KINDS else {}
        used |= {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        for hook in (spec.get("hooks") or {}).values():
            webhook = hook["webhook"]
            for field in ("authorization", "caBundle", "clientTLS"):
                if "secretRef" in webhook.get(field, {}):
                    used.add(webhook[field]["secretRef"]["name"])
    return used


POD_KINDS = {"Deployment", "Pod"}


def secrets_provided(documents: list[dict[str, Any]], values: dict[str, Any]) -> set[str]:
    created = {d["metadata"]["name"] for d in documents if d["kind"] == "Secret"}
    issued = {d["spec"]["secretName"] for d in documents if d["kind"] == "Certificate"}
    named = {values["tls.existingSecret"], values["tls.clientAuth.existingSecret"]} - {""}
    return created | issued | named


def should_render(values: dict[str, Any]) -> bool:
    tls, client = values["tls.enabled"], values["tls.clientAuth.enabled"]
    # rendered without a cluster: cert-manager issues wherever it is asked to
    issuing = tls and not values["tls.existingSecret"] and values["tls.certManager.enabled"]
    return not (
        (tls and not values["tls.existingSecret"] and not issuing)
        or (client and not tls)
        or (client and not issuing and not values["tls.clientAuth.existingSecret"])
        or (values["admission.enabled"] and not tls)
        # a fail-closed webhook with no CA to trust: helm template cannot read the Secret's
        or (values["admission.enabled"] and not issuing)
    )


def test_every_combination_that_renders_mounts_only_secrets_that_exist() -> None:
    from concurrent.futures import ThreadPoolExecutor
    from itertools import product

    combinations = [dict(zip(TLS_MATRIX, c, strict=True)) for c in product(*TLS_MATRIX.values())]

    def rendered(values: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        sets = [f"{k}={str(v).lower()}" for k, v in values.items()]
        return values, template(*sets, api_versions=())

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(rendered, combinations))
    rendering = 0
    for values, result in results:
        assert (result.returncode == 0) == should_render(values), (values, result.stderr)
        if result.returncode != 0:
            assert re.search(r"needs|cannot be combined", result.stderr), result.stderr
            continue
        rendering += 1
        documents = [d for d in yaml.safe_load_all(result.stdout) if d]
        missing = secrets_used(documents) - secrets_provided(documents, values)
        assert not missing, (values, missing)
        schemes = {h["webhook"]["url"].split(":")[0] for h in hooks_of(documents).values()}
        assert schemes == {"https" if values["tls.enabled"] else "http"}
        for config in by_kind(documents, "ValidatingWebhookConfiguration"):
            injected = "cert-manager.io/inject-ca-from" in config["metadata"].get("annotations", {})
            assert injected or all(w["clientConfig"].get("caBundle") for w in config["webhooks"])
    assert 0 < rendering < len(combinations)


# --- the image ----------------------------------------------------------------------------------

DIGEST = "sha256:" + "0123456789abcdef" * 4


def images(documents: list[dict[str, Any]]) -> set[str]:
    return {
        container["image"]
        for kind in ("Deployment", "Pod")
        for document in by_kind(documents, kind)
        for container in (
            document["spec"].get("template", {}).get("spec", document["spec"])["containers"]
        )
    }


def test_the_image_is_named_by_the_charts_app_version_by_tag_or_by_digest() -> None:
    """By digest when one is given (what a moved tag cannot change), else by tag, the chart's
    appVersion unless set; the deployment and the chart's test pod alike."""
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert images(render()) == {f"ghcr.io/cozystack/gpuclass-hooks:{app_version}"}
    assert images(render("image.tag=dev")) == {"ghcr.io/cozystack/gpuclass-hooks:dev"}
    pinned = render(f"image.digest={DIGEST}", "image.tag=dev")
    assert images(pinned) == {f"ghcr.io/cozystack/gpuclass-hooks@{DIGEST}"}


def test_a_digest_that_is_not_sha256_is_refused() -> None:
    result = helm_run(
        "template",
        "gpu",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "image.digest=latest",
    )
    assert result.returncode != 0 and "schema" in result.stderr
