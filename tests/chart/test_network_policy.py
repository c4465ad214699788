"""The chart's NetworkPolicy (docs/install.md, "Who reaches which port"): who is let in, by the
rendered rules as the NetworkPolicy API defines them, for each caller a cluster has."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from tests.chart import API_SERVERS, by_kind, one, render

# Renders the chart with helm (`make tools`).

NAMESPACE = "cozy-gpu"
RELEASE_LABELS = {"app.kubernetes.io/name": "gpuclass-hooks", "app.kubernetes.io/instance": "gpu"}


@dataclass(frozen=True)
class Caller:
    """A pod (its namespace and labels) or, on the host network, an address alone."""

    namespace: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    address: str = "10.244.3.7"


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def peer_admits(peer: dict[str, Any], caller: Caller) -> bool:
    if "ipBlock" in peer:
        # for pods ipBlock is the CNI's choice; the chart's are for host-network callers
        block = peer["ipBlock"]
        inside = ipaddress.ip_address(caller.address) in ipaddress.ip_network(block["cidr"])
        excepted = any(
            ipaddress.ip_address(caller.address) in ipaddress.ip_network(e)
            for e in block.get("except", [])
        )
        return caller.namespace is None and inside and not excepted
    if caller.namespace is None:
        return False
    namespace_labels = {"kubernetes.io/metadata.name": caller.namespace}
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], namespace_labels):
            return False
    elif caller.namespace != NAMESPACE:
        return False
    return selects(peer.get("podSelector", {}), caller.labels)


def admitted(policy: dict[str, Any], port: str, caller: Caller) -> bool:
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    for rule in spec.get("ingress", []):
        if rule.get("ports") and port not in {p["port"] for p in rule["ports"]}:
            continue
        peers = rule.get("from")
        if peers is None or any(peer_admits(peer, caller) for peer in peers):
            return True
    return False


METACONTROLLER = Caller("metacontroller", {"app.kubernetes.io/name": "metacontroller-helm"})
AGGREGATED_API = Caller("cozy-system", {"app": "cozystack-api"})
HELM_TEST = Caller(NAMESPACE, {**RELEASE_LABELS, "app.kubernetes.io/component": "helm-test"})
NEIGHBOUR = Caller(NAMESPACE, {"app": "something-else"})
TENANT_POD = Caller("tenant-acme", {"app": "x"})
OTHER_SYSTEM = Caller("cozy-fluxcd", {"app": "source-controller"})
SCRAPER = Caller("cozy-monitoring", {"app.kubernetes.io/name": "vmagent"})
API_SERVER = Caller(address=API_SERVERS[0].split("/")[0])
A_NODE = Caller(address="192.0.2.99")

CALLERS = {
    "Metacontroller": METACONTROLLER,
    "Cozystack's aggregated API server": AGGREGATED_API,
    "helm test": HELM_TEST,
    "another pod of the release namespace": NEIGHBOUR,
    "a tenant's pod": TENANT_POD,
    "another system pod": OTHER_SYSTEM,
    "the metrics scraper": SCRAPER,
    "kube-apiserver": API_SERVER,
    "a node": A_NODE,
}
# port -> who reaches it (everyone else is refused)
REACHES = {
    "hooks": {"Metacontroller", "helm test"},
    "admission": {"Cozystack's aggregated API server", "kube-apiserver"},
    "metrics": {"the metrics scraper"},
    "health": set(CALLERS),
}


def policy_of(*sets: str) -> dict[str, Any]:
    return one(render(*sets), "NetworkPolicy")


def test_only_the_callers_that_need_a_port_reach_it() -> None:
    policy = policy_of()
    assert policy["spec"]["podSelector"] == {"matchLabels": RELEASE_LABELS}
    for port, expected in REACHES.items():
        reached = {name for name, caller in CALLERS.items() if admitted(policy, port, caller)}
        assert reached == expected, port


def test_without_admission_no_api_server_reaches_any_port_but_the_probes() -> None:
    policy = policy_of("admission.enabled=false")
    assert not admitted(policy, "hooks", API_SERVER)
    assert not admitted(policy, "admission", API_SERVER)
    assert admitted(policy, "hooks", METACONTROLLER)


def test_the_named_ports_are_the_pods_ports() -> None:
    documents = render()
    container = one(documents, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    named = {p["name"] for p in container["ports"]}
    for rule in one(documents, "NetworkPolicy")["spec"]["ingress"]:
        assert {p["port"] for p in rule["ports"]} <= named


def test_the_helm_test_pod_carries_the_label_the_policy_admits() -> None:
    pod = one(render(), "Pod")
    caller = Caller(NAMESPACE, pod["metadata"]["labels"])
    assert admitted(policy_of(), "hooks", caller)


def test_callers_follow_the_values() -> None:
    policy = policy_of(
        "networkPolicy.hookNamespaces={mc}",
        "networkPolicy.admissionNamespaces={agg}",
        "networkPolicy.metricsNamespaces={prom}",
        "networkPolicy.apiServerCIDRs={198.51.100.0/24}",
    )
    assert admitted(policy, "hooks", Caller("mc"))
    assert not admitted(policy, "hooks", METACONTROLLER)
    assert admitted(policy, "metrics", Caller("prom"))
    assert admitted(policy, "admission", Caller(address="198.51.100.4"))
    assert admitted(policy, "admission", Caller("agg"))
    assert not admitted(policy, "admission", API_SERVER)
    assert not admitted(policy, "admission", AGGREGATED_API)


def test_off_renders_no_policy() -> None:
    assert by_kind(render("networkPolicy.enabled=false"), "NetworkPolicy") == []


def test_a_render_that_cannot_read_the_api_servers_addresses_opens_the_admission_port_alone() -> (
    None
):
    """helm template of the defaults: the API server must reach the fail-closed webhook, from
    addresses nothing could read, so the admission port admits every address (its own threads,
    memory and bounds keep what anyone sends there off the hooks); every other port stays as
    narrow as ever, and NOTES.txt says how to narrow the admission port too."""
    policy = one(render(api_servers=()), "NetworkPolicy")
    for name, caller in CALLERS.items():
        assert admitted(policy, "admission", caller), name
        assert admitted(policy, "hooks", caller) == (name in REACHES["hooks"]), name
