"""docs/gpu-budgets.md, "What reaches the webhook": the chart's match conditions, evaluated by a
real API server whose webhook cannot answer (its URL is a closed port: every review sent to it
is refused, failing closed). What is refused was sent; what is admitted was let through unjudged.

For every shape of the fields the rules read (absent, null, empty, set, of another type), as a
create and as an update from stored objects of each kind: whatever passes unjudged must be what
the webhook would have admitted in a pool whose budget is 0 for every key, and, stored as
Cozystack stores it, must not make that pool's verdicts fail closed. A GPU request is refused.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import trustme

from hooks.controllers.budget import review_app, review_tenant
from hooks.rules.budget.instance_types import catalog_of
from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.releases import release_object
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import Tenant
from hooks.wire.admission import decode_review
from tests import cozystack
from tests.builders import GPU, admission_review, app_object, gpus, helmrelease
from tests.chart import by_kind, render
from tests.controllers.test_budget import Inputs
from tests.controlplane import ControlPlane, collection_path, control_plane, manifests, object_path

ABSENT = object()
GPUS = [ABSENT, None, [], [{}], gpus(GPU), "x", [1]]
REPLICAS = [ABSENT, None, 0, 3, -1, "x"]
# Cozystack's default, an instance type that attaches a GPU (the chart names it), none, another
# type of value
INSTANCE_TYPES = [ABSENT, None, "", "u1.medium", "gn1.xlarge", 5]
QUOTAS = [ABSENT, None, {}, {TOTAL_KEY: "1"}, {"requests.cpu": "1"}, "x"]
POOL = "tenant-x"


class Hostile(Inputs):
    """Tenant x owns tenant-x and gives its pool nothing: any review that can be refused is.
    The cluster's instance types are Cozystack's."""

    def catalog(self) -> Catalog:
        types = [msgspec.Raw(msgspec.json.encode(t)) for t in cozystack.instance_types()]
        return catalog_of(super().catalog().classes, types)


HOSTILE = Hostile([Tenant("tenant-root", "x", {TOTAL_KEY: 0, class_key("l40s"): 0})])
REVIEW = {
    "VMInstance": review_app,
    "KubernetesNodes": review_app,
    "Kubernetes": review_app,
    "Tenant": review_tenant,
}


def spec(**fields: Any) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not ABSENT}


def shapes(kind: str) -> list[dict[str, Any]]:
    """Every shape of what the kind's rules read, with a field another kind reads beside it."""
    if kind == "VMInstance":
        return [
            spec(gpus=g, instanceType=t, resourceQuotas=q)
            for g, t in itertools.product(GPUS, INSTANCE_TYPES)
            for q in (ABSENT, "x")
        ]
    if kind == "KubernetesNodes":
        return [
            *(spec(gpus=g, maxReplicas=r) for g, r in itertools.product(GPUS, REPLICAS)),
            *(
                spec(instanceType=t, maxReplicas=r)
                for t, r in itertools.product(INSTANCE_TYPES, REPLICAS)
            ),
        ]
    if kind == "Kubernetes":
        groups = [spec(gpus=g, instanceType=t) for g, t in itertools.product(GPUS, INSTANCE_TYPES)]
        groups += [
            spec(instanceType=t, maxReplicas=r)
            for t, r in itertools.product(INSTANCE_TYPES, REPLICAS)
        ]
        return [
            *(spec(nodeGroups=n) for n in (ABSENT, None, {}, "x", {"md0": "x"})),
            *(spec(nodeGroups={"md0": {}, "gpu": group}) for group in groups),
        ]
    return [spec(resourceQuotas=q, gpus=g) for q in QUOTAS for g in (ABSENT, None)]


OLD = {
    "VMInstance": [
        {"gpus": []},
        {"gpus": gpus(GPU)},
        {"gpus": None},
        {"instanceType": "gn1.xlarge"},
    ],
    "KubernetesNodes": [
        {"gpus": []},
        {"gpus": gpus(GPU), "maxReplicas": 1},
        {"maxReplicas": -1},
        {"instanceType": "gn1.xlarge", "maxReplicas": 1},
    ],
    "Kubernetes": [{}, {"nodeGroups": {"gpu": {"instanceType": "gn1.xlarge", "maxReplicas": 1}}}],
    "Tenant": [{}, {"resourceQuotas": {TOTAL_KEY: "1"}}, {"resourceQuotas": {}}],
}


def closed_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return int(listener.getsockname()[1])


@pytest.fixture(scope="module")
def unanswered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane with Cozystack's app CRDs, the stored objects the updates start from, and
    the chart's webhook configuration pointed at a port where nothing listens."""
    with control_plane(tmp_path_factory.mktemp("unanswered")) as kube:
        kube.apply(*cozystack.app_crds(), *manifests("kubevirt-crd.yaml"))
        for namespace in (POOL, "cozy-system"):
            kube.namespace(namespace)
        for kind, olds in OLD.items():
            for index, old in enumerate(olds):
                assert create(kube, app_object(kind, POOL, f"old-{index}", old)) == 201
        ca = trustme.CA()
        [configuration] = by_kind(
            render("admission.enabled=true", f"tls.trustBundle={ca.cert_pem.bytes().decode()}"),
            "ValidatingWebhookConfiguration",
        )
        dead = f"https://127.0.0.1:{closed_port()}"
        for webhook in configuration["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {
                "url": f"{dead}{path}",
                "caBundle": webhook["clientConfig"]["caBundle"],
            }
        kube.apply(configuration)
        probe = app_object("VMInstance", POOL, "probe", {"gpus": gpus(GPU)})
        for _ in range(100):  # the API server picks the configuration up from its informer
            if create(kube, probe, dry_run=True) == 500:
                break
        yield kube


def create(kube: ControlPlane, document: dict[str, Any], dry_run: bool = False) -> int:
    query = "?dryRun=All" if dry_run else ""
    return kube.request("POST", collection_path(document) + query, document).status_code


def update(kube: ControlPlane, document: dict[str, Any]) -> int:
    stored = kube.request("GET", object_path(document)).json()
    changed = {**document, "metadata": {**document["metadata"], **stored["metadata"]}}
    return kube.request("PUT", object_path(document) + "?dryRun=All", changed).status_code


def creating_sends(kube: ControlPlane, kind: str, namespace: str, app_spec: dict[str, Any]) -> bool:
    """Whether a (dry-run) create of this app reaches the webhook."""
    return sent(create(kube, app_object(kind, namespace, "new", app_spec), dry_run=True))


def sent(code: int) -> bool:
    """Refused by the webhook that cannot answer (failurePolicy Fail), or admitted unjudged."""
    assert code in (200, 201, 500), code
    return code == 500


def judged_harmless(kind: str, app_spec: dict[str, Any], old: dict[str, Any] | None) -> None:
    """What passed unjudged: admitted by the webhook in a pool with nothing left, and stored, a
    release its pool's verdicts can read."""
    operation = "CREATE" if old is None else "UPDATE"
    review = admission_review(kind, POOL, "app", app_spec, operation=operation, old_spec=old)
    outcome = REVIEW[kind](decode_review(msgspec.json.encode(review)), HOSTILE)
    assert outcome.verdict.allowed, (kind, app_spec, old, outcome.verdict)
    stored = release_object(
        msgspec.Raw(msgspec.json.encode(helmrelease(kind, POOL, "app", app_spec))),
        "cozystack-values",
    )
    assert stored.unreadable is None, (kind, app_spec, stored.unreadable)


@pytest.mark.parametrize("kind", ["VMInstance", "KubernetesNodes", "Kubernetes", "Tenant"])
def test_what_passes_the_match_conditions_unjudged_the_webhook_would_admit(
    unanswered: ControlPlane, kind: str
) -> None:
    passed = 0
    for app_spec in shapes(kind):
        if not creating_sends(unanswered, kind, POOL, app_spec):
            judged_harmless(kind, app_spec, None)
            passed += 1
        for number, old in enumerate(OLD[kind]):
            if not sent(update(unanswered, app_object(kind, POOL, f"old-{number}", app_spec))):
                judged_harmless(kind, app_spec, old)
                passed += 1
    assert passed > 0  # the conditions let something through


@pytest.mark.parametrize(
    ("kind", "app_spec", "refused"),
    [
        ("VMInstance", {"gpus": gpus(GPU)}, True),
        ("VMInstance", {"gpus": None}, True),
        ("VMInstance", {"gpus": []}, False),
        ("VMInstance", {"running": True}, False),
        ("KubernetesNodes", {"gpus": gpus(GPU), "maxReplicas": 0}, True),
        ("KubernetesNodes", {"minReplicas": 3}, False),
        ("VMInstance", {"instanceType": "gn1.xlarge"}, True),
        ("VMInstance", {"instanceType": "u1.medium"}, False),
        ("VMInstance", {"instanceType": "gpu.own"}, False),  # not named: the alert's case
        ("KubernetesNodes", {"instanceType": "gn1.8xlarge", "maxReplicas": 2}, True),
        ("Kubernetes", {}, False),
        ("Kubernetes", {"nodeGroups": {"md0": {"instanceType": "u1.medium"}}}, False),
        ("Kubernetes", {"nodeGroups": {"gpu": {"instanceType": "gn1.xlarge"}}}, True),
        ("Kubernetes", {"nodeGroups": {"md0": {}, "gpu": {"gpus": gpus(GPU)}}}, True),
        ("Tenant", {"resourceQuotas": {TOTAL_KEY: "1"}}, True),
        ("Tenant", {"resourceQuotas": {"requests.cpu": "4"}}, True),
        ("Tenant", {"resourceQuotas": {}}, False),
        ("Tenant", {"etcd": True}, False),
    ],
)
def test_with_the_service_stopped_only_what_a_rule_judges_is_refused(
    unanswered: ControlPlane, kind: str, app_spec: dict[str, Any], refused: bool
) -> None:
    assert creating_sends(unanswered, kind, POOL, app_spec) is refused


def test_outside_tenant_namespaces_nothing_is_sent(unanswered: ControlPlane) -> None:
    """A namespace outside `tenant-root` and `tenant-*` is in no pool (rule 2)."""
    for kind, app_spec in (
        ("VMInstance", {"gpus": gpus(GPU)}),
        ("Tenant", {"resourceQuotas": {TOTAL_KEY: "1"}}),
    ):
        assert not creating_sends(unanswered, kind, "cozy-system", app_spec)
