"""The budget webhook's controller: an AdmissionRequest in, a verdict and what the route logs out.

Inputs are plain values here; the reading of them is tested in test_budget_reader.py and against
a real API server.
"""

from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from hooks.controllers.budget import review_app, review_tenant
from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.pools import Pools
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import App, Tenancy, Tenant
from hooks.rules.budget.verdicts import Verdict
from hooks.rules.classes import ClassIdentity
from hooks.wire.admission import AdmissionRequest, decode_review
from hooks.wire.problems import BadRequest, Unreadable
from tests.builders import GPU, OTHER_GPU, admission_review, gpus, review_request, tenant_request
from tests.rules.budget import pool, vm

CLASSES = [
    ClassIdentity("l40s", "2026-01-01T00:00:00Z", False, GPU),
    ClassIdentity("h100", "2026-01-01T00:00:00Z", False, OTHER_GPU),
]


class Inputs:
    """A fixed cluster; remembers which namespaces each review asked about."""

    def __init__(self, tenants: Sequence[Tenant], apps: Sequence[App] = ()) -> None:
        self._tenancy = Tenancy(tuple(tenants), tuple(apps))
        self.asked: list[tuple[str, ...]] = []

    def catalog(self) -> Catalog:
        return Catalog(tuple(CLASSES))

    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        self.asked.append(tuple(namespaces))
        return self._tenancy


def request(review: dict[str, Any]) -> AdmissionRequest:
    return decode_review(msgspec.json.encode(review))


def vm_review(namespace: str, name: str, *devices: str, old: tuple[str, ...] | None = None) -> Any:
    old_spec = None if old is None else {"gpus": gpus(*old)}
    operation = "CREATE" if old is None else "UPDATE"
    spec = {"gpus": gpus(*devices)}
    return review_request(
        "VMInstance", namespace, name, spec, operation=operation, old_spec=old_spec
    )


POOL_A = Tenant("tenant-root", "a", {TOTAL_KEY: 3})
RENDER = vm("tenant-a", "render", GPU, GPU)


def test_a_checked_review_says_what_it_reviewed_and_that_it_read() -> None:
    inputs = Inputs([POOL_A], [RENDER])
    outcome = review_app(vm_review("tenant-a", "new", GPU), inputs)
    assert outcome.verdict.allowed is True
    assert (outcome.kind, outcome.namespace, outcome.name, outcome.operation) == (
        "VMInstance",
        "tenant-a",
        "new",
        "CREATE",
    )
    assert outcome.read_inputs is True and inputs.asked == [("tenant-a",)]
    denied = review_app(vm_review("tenant-a", "more", GPU, GPU), inputs)
    assert denied.verdict.allowed is False and denied.read_inputs is True


class Unlistable(Inputs):
    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        super().tenancy(namespaces)
        raise Unreadable("could not list HelmReleases (HTTP 503)")


def test_a_review_whose_inputs_cannot_be_read_fails_closed_having_tried_to_read_them() -> None:
    outcome = review_app(vm_review("tenant-a", "new", GPU), Unlistable([POOL_A]))
    assert outcome.verdict == Verdict(
        False, "GPU budget check failed closed: could not list HelmReleases (HTTP 503)"
    )
    assert (outcome.read_inputs, outcome.failed_closed) == (True, True)


class ClassesUnlistable(Inputs):
    def catalog(self) -> Catalog:
        raise Unreadable("could not list GPUClasses (HTTP 503)")


@pytest.mark.parametrize(
    ("review", "inputs", "unread"),
    [
        (vm_review("tenant-a", "new", GPU), Unlistable([POOL_A]), "HelmReleases"),
        (vm_review("tenant-a", "new", GPU), ClassesUnlistable([POOL_A], [RENDER]), "GPUClasses"),
        (
            tenant_request("tenant-root", "a", {TOTAL_KEY: 4}, old={TOTAL_KEY: 3}),
            Unlistable([POOL_A]),
            "HelmReleases",
        ),
        (
            request(admission_review("VMInstance", "tenant-a", "broken", {"gpus": "one"})),
            Unlistable([POOL_A]),
            "HelmReleases",
        ),
    ],
    ids=["app", "app-classes", "declaration", "undecodable-app"],
)
def test_every_review_fails_closed_when_an_input_it_needs_cannot_be_read(
    review: AdmissionRequest, inputs: Inputs, unread: str
) -> None:
    """The second fault: an object that did not decode is judged by whether a pool applies,
    and a pool that cannot be read is denied, never taken for none."""
    decide = review_tenant if review.kind.kind == "Tenant" else review_app
    outcome = decide(review, inputs)
    assert outcome.verdict.allowed is False
    assert outcome.verdict.message.startswith(
        f"GPU budget check failed closed: could not list {unread}"
    )
    assert (outcome.read_inputs, outcome.failed_closed) == (True, True)


def test_a_review_that_cannot_grow_reads_nothing() -> None:
    inputs = Inputs([POOL_A], [RENDER])
    outcome = review_app(vm_review("tenant-a", "render", GPU, old=(GPU, GPU)), inputs)
    assert (outcome.verdict.allowed, outcome.read_inputs, inputs.asked) == (True, False, [])
    assert outcome.operation == "UPDATE"


def test_the_app_under_review_replaces_its_stored_self_even_when_the_object_has_no_name() -> None:
    review = vm_review("tenant-a", "render", GPU, GPU, GPU, old=(GPU, GPU))
    nameless = msgspec.json.encode({"spec": {"gpus": gpus(GPU, GPU, GPU)}})
    review = msgspec.structs.replace(review, object=msgspec.Raw(nameless))
    # render grows from 2 to 3 of a pool of 3: counted once, under the request's name, it fits
    outcome = review_app(review, Inputs([POOL_A], [RENDER]))
    assert outcome.verdict.allowed is True, outcome.verdict.message


def test_an_update_that_moves_a_device_to_another_class_is_checked_for_growth_only() -> None:
    # the pool holds 3 of a total of 2 (written before the webhook); the total does not grow
    over = Tenant("tenant-root", "a", {TOTAL_KEY: 2})
    legacy = vm("tenant-a", "legacy", GPU)
    inputs = Inputs([over], [RENDER, legacy])
    moved = review_app(vm_review("tenant-a", "legacy", OTHER_GPU, old=(GPU,)), inputs)
    assert moved.verdict.allowed is True, moved.verdict.message
    assert moved.read_inputs is True


def test_a_review_without_an_object_is_a_bad_request() -> None:
    review = msgspec.structs.replace(vm_review("tenant-a", "x", GPU), object=msgspec.Raw(b"null"))
    with pytest.raises(BadRequest, match=r"^AdmissionReview request has no object$"):
        review_app(review, Inputs([]))


def test_a_tenant_review_asks_about_its_pool_and_its_own_namespace() -> None:
    inputs = Inputs([POOL_A])
    outcome = review_tenant(tenant_request("tenant-root", "b", {TOTAL_KEY: "1"}), inputs)
    assert outcome.verdict.allowed is True
    assert inputs.asked == [("tenant-root", "tenant-b")]
    assert (outcome.kind, outcome.namespace, outcome.name, outcome.read_inputs) == (
        "Tenant",
        "tenant-root",
        "b",
        True,
    )


def test_a_tenant_refused_for_its_keys_is_refused_without_reading() -> None:
    inputs = Inputs([POOL_A])
    typo = review_tenant(
        tenant_request("tenant-root", "b", {"l40sgpuclass.cozystack.io/devices": "1"}), inputs
    )
    assert typo.verdict.allowed is False and "not a GPU budget key" in typo.verdict.message
    malformed = review_tenant(tenant_request("tenant-root", "b", {TOTAL_KEY: "1500m"}), inputs)
    assert malformed.verdict.allowed is False
    assert malformed.verdict.message == (
        f"Tenant tenant-root/b: spec.resourceQuotas.{TOTAL_KEY}: extended resources are whole units"
    )
    assert inputs.asked == []


def test_an_unchanged_declaration_in_an_overcommitted_pool_passes() -> None:
    # a holds more than it declares today (written before the webhook): an update that lowers
    # a key is refused by the floor, one that changes nothing passes
    declared = {TOTAL_KEY: "1", class_key("l40s"): "1"}
    inputs = Inputs([Tenant("tenant-root", "a", {TOTAL_KEY: 1, class_key("l40s"): 1})], [RENDER])
    lowered = {TOTAL_KEY: "1", class_key("l40s"): "0"}
    outcome = review_tenant(tenant_request("tenant-root", "a", lowered, old=declared), inputs)
    assert outcome.verdict.allowed is False  # lowering below what is held is refused
    kept = review_tenant(tenant_request("tenant-root", "a", declared, old=declared), inputs)
    assert kept.verdict.allowed is True, kept.verdict.message


def test_a_worker_pool_update_grows_by_its_replicas_not_by_its_entries() -> None:
    # workers reserves 1 device x 3 replicas of a's 6; a second device makes 6: it fits exactly
    pool_a = Tenant("tenant-root", "a", {TOTAL_KEY: 6})
    workers = pool("tenant-a", "workers", GPU, max_replicas=3)
    review = admission_review(
        "KubernetesNodes",
        "tenant-a",
        "workers",
        {"gpus": gpus(GPU, GPU), "maxReplicas": 3},
        operation="UPDATE",
        old_spec={"gpus": gpus(GPU), "maxReplicas": 3},
    )
    outcome = review_app(request(review), Inputs([pool_a], [workers]))
    assert outcome.verdict.allowed is True, outcome.verdict.message


def test_a_tenant_object_without_a_name_is_named_by_the_request() -> None:
    review = tenant_request("tenant-root", "b", {TOTAL_KEY: "1"})
    nameless = msgspec.json.encode({"spec": {"resourceQuotas": {TOTAL_KEY: "1"}}})
    review = msgspec.structs.replace(review, object=msgspec.Raw(nameless))
    inputs = Inputs([POOL_A])
    outcome = review_tenant(review, inputs)
    assert outcome.verdict.allowed is True and inputs.asked == [("tenant-root", "tenant-b")]


def test_a_bounded_tenant_changing_only_other_quotas_reads_nothing() -> None:
    inputs = Inputs([POOL_A])
    outcome = review_tenant(
        tenant_request("tenant-root", "b", {"requests.cpu": "8"}, old={"requests.cpu": "4"}), inputs
    )
    assert (outcome.verdict.allowed, outcome.read_inputs, inputs.asked) == (True, False, [])


def test_an_unchanged_worker_pool_cannot_grow_even_in_a_pool_over_budget() -> None:
    # workers holds 1 device x 3 replicas against a's 2 (written before the webhook)
    pool_a = Tenant("tenant-root", "a", {TOTAL_KEY: 2})
    workers = pool("tenant-a", "workers", GPU, max_replicas=3)
    spec = {"gpus": gpus(GPU), "maxReplicas": 3}
    review = admission_review(
        "KubernetesNodes", "tenant-a", "workers", spec, operation="UPDATE", old_spec=spec
    )
    inputs = Inputs([pool_a], [workers])
    outcome = review_app(request(review), inputs)
    assert (outcome.verdict.allowed, outcome.read_inputs, inputs.asked) == (True, False, [])


@pytest.mark.parametrize(
    "review",
    [
        vm_review("tenant-a", "render", GPU, GPU, GPU, old=(GPU, GPU)),  # the app check, pooled
        vm_review("tenant-b", "outside", GPU),  # the app check, outside every pool
        tenant_request(
            "tenant-root", "a", {TOTAL_KEY: 4}, old={TOTAL_KEY: 3}
        ),  # the declaration gate
        request(admission_review("VMInstance", "tenant-a", "broken", {"gpus": "one"})),
    ],
    ids=["app", "app-outside-pools", "declaration", "undecodable"],
)
def test_one_review_builds_its_pools_once(
    monkeypatch: pytest.MonkeyPatch, review: AdmissionRequest
) -> None:
    built = []
    build = Pools.__init__

    def counted(self: Pools, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        build(self, *args, **kwargs)

    monkeypatch.setattr(Pools, "__init__", counted)
    decide = review_tenant if review.kind.kind == "Tenant" else review_app
    decide(review, Inputs([Tenant("tenant-root", "root", {}), POOL_A], [RENDER]))
    assert len(built) == 1
