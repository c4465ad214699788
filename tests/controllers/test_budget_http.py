"""The admission routes with real AdmissionReview bodies; inputs from a local API server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from hooks.kubeapi.budget import GPUCLASSES, HELMRELEASES
from hooks.kubeapi.client import ReadShare
from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.serving.app import create_app
from hooks.serving.logs import LOGGER
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from tests import EXAMPLES
from tests.builders import (
    GPU,
    OTHER_GPU,
    admission_review,
    example_of,
    gpuclass,
    gpus,
    helmrelease,
)
from tests.fake_apiserver import FakeApiServer, list_of

HTTPS = "https://localhost"
L40S_KEY = class_key("l40s")


@pytest.fixture(autouse=True)
def cluster(apiserver: FakeApiServer) -> list[dict[str, Any]]:
    """Tenant a (4 GPUs in all, 2 of them L40S) with a VM of 2 L40S and a bounded sub-tenant b
    (1 GPU); tenant c unbounded."""
    apiserver.serve(
        GPUCLASSES, 200, list_of([gpuclass("l40s"), gpuclass("h100", resource=OTHER_GPU)])
    )
    releases = [
        helmrelease(
            "Tenant", "tenant-root", "a", {"resourceQuotas": {TOTAL_KEY: "4", L40S_KEY: "2"}}
        ),
        helmrelease("Tenant", "tenant-a", "b", {"resourceQuotas": {TOTAL_KEY: "1", L40S_KEY: "0"}}),
        helmrelease("Tenant", "tenant-root", "c", {}),
        helmrelease("VMInstance", "tenant-a", "render", {"gpus": gpus(GPU, GPU)}),
    ]
    apiserver.serve(HELMRELEASES, 200, list_of(releases))
    return releases


def review(client: FlaskClient, route: str, body: dict[str, Any] | bytes) -> dict[str, Any]:
    kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
    response = client.post(route, base_url=HTTPS, **kwargs)
    assert response.status_code == 200, response.get_data()
    answer: dict[str, Any] = response.json
    assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    return answer["response"]


def vm_body(namespace: str, name: str, *resources: str, **kwargs: Any) -> dict[str, Any]:
    return admission_review(
        "VMInstance", namespace, name, {"gpus": gpus(*resources), "running": True}, **kwargs
    )


def test_within_budget_is_allowed_with_the_uid_echoed(client: FlaskClient) -> None:
    answer = review(client, "/admit/gpu-budget", vm_body("tenant-a", "train", OTHER_GPU))
    assert answer == {"uid": "8c1f5e2a-0c4d-4b5e-9a51-3d2f1b0e7a11", "allowed": True}


def test_the_reads_of_a_review_and_of_a_status_sync_take_from_one_share(
    settings: Settings, cluster: list[dict[str, Any]]
) -> None:
    """One share bounds what the process's API reads hold together: with it held by reads in
    flight elsewhere, a review fails closed and a status sync goes without KubeVirt, each naming
    the share; given back, both read again."""
    reads = ReadShare(1 << 20)
    client = create_app(
        settings.model_copy(update={"admission_cache_seconds": 0}), reads=reads
    ).test_client()
    assert reads.take(1 << 20)
    answer = review(client, "/admit/gpu-budget", vm_body("tenant-a", "train", OTHER_GPU))
    assert answer["allowed"] is False
    assert "the reads in flight hold the 1048576 bytes" in answer["status"]["message"]
    sync = client.post("/status/sync", data=(EXAMPLES / "status-sync.json").read_bytes())
    ready = sync.json["status"]["conditions"][-1]
    assert ready["reason"] == "KubeVirtUnreadable"
    assert "the reads in flight hold the 1048576 bytes" in ready["message"]
    reads.give(1 << 20)
    assert review(client, "/admit/gpu-budget", vm_body("tenant-a", "train", OTHER_GPU))["allowed"]
    assert reads.used_bytes == 0


def test_over_budget_is_denied_with_403_and_an_actionable_message(client: FlaskClient) -> None:
    answer = review(client, "/admit/gpu-budget", vm_body("tenant-a", "more", GPU))
    assert answer["allowed"] is False
    assert answer["status"] == {
        "code": 403,
        "message": (
            f"{L40S_KEY}: this VMInstance needs 1, the pool of tenant a (tenant-a) has 0 left "
            "(budget 2, 0 carved out for sub-tenants, 2 reserved by other apps)"
        ),
    }


def test_carve_out_of_a_bounded_sub_tenant(client: FlaskClient) -> None:
    # total 4, 1 carved out for b, 2 reserved by render: one more GPU fits, two do not
    assert review(client, "/admit/gpu-budget", vm_body("tenant-a", "x", OTHER_GPU))["allowed"]
    answer = review(client, "/admit/gpu-budget", vm_body("tenant-a", "x", OTHER_GPU, OTHER_GPU))
    assert f"{TOTAL_KEY}: this VMInstance needs 2" in answer["status"]["message"]
    assert "1 carved out for sub-tenants" in answer["status"]["message"]


def test_update_shrinking_passes_growth_is_denied(client: FlaskClient) -> None:
    shrink = vm_body(
        "tenant-a", "render", GPU, operation="UPDATE", old_spec={"gpus": gpus(GPU, GPU)}
    )
    assert review(client, "/admit/gpu-budget", shrink)["allowed"]
    grow = vm_body(
        "tenant-a", "render", GPU, GPU, GPU, operation="UPDATE", old_spec={"gpus": gpus(GPU, GPU)}
    )
    assert not review(client, "/admit/gpu-budget", grow)["allowed"]


def test_update_in_a_pool_already_over_budget_checks_only_growth(
    client: FlaskClient, cluster: list[dict[str, Any]]
) -> None:
    # written before the webhook: tenant a holds 3 L40S against its budget of 2
    cluster.append(helmrelease("VMInstance", "tenant-a", "legacy", {"gpus": gpus(GPU)}))
    old_spec = {"gpus": gpus(GPU), "running": True}
    stop = vm_body("tenant-a", "legacy", GPU, operation="UPDATE", old_spec=old_spec)
    stop["request"]["object"]["spec"]["running"] = False
    assert review(client, "/admit/gpu-budget", stop)["allowed"]
    grow = vm_body("tenant-a", "legacy", GPU, GPU, operation="UPDATE", old_spec=old_spec)
    answer = review(client, "/admit/gpu-budget", grow)
    assert not answer["allowed"] and "this VMInstance needs 2" in answer["status"]["message"]


def test_worker_pool_reserves_gpus_times_max_replicas(client: FlaskClient) -> None:
    pool = admission_review("KubernetesNodes", "tenant-a", "workers", {"gpus": gpus(OTHER_GPU)})
    answer = review(client, "/admit/gpu-budget", pool)  # maxReplicas defaults to 10
    assert answer["allowed"] is False and "KubernetesNodes needs 10" in answer["status"]["message"]
    small = admission_review(
        "KubernetesNodes", "tenant-a", "workers", {"gpus": gpus(OTHER_GPU), "maxReplicas": 1}
    )
    assert review(client, "/admit/gpu-budget", small)["allowed"]


def test_unbounded_tenant_and_unknown_entries(client: FlaskClient) -> None:
    assert review(
        client, "/admit/gpu-budget", vm_body("tenant-c", "any", GPU, GPU, GPU, "nvidia.com/NONE")
    )["allowed"]
    answer = review(client, "/admit/gpu-budget", vm_body("tenant-a", "odd", "nvidia.com/NONE"))
    assert not answer["allowed"] and "map to no GPUClass" in answer["status"]["message"]


def test_tenant_declaration_gate(client: FlaskClient) -> None:
    def tenant_body(quotas: dict[str, str], **kwargs: Any) -> dict[str, Any]:
        return admission_review(
            "Tenant", "tenant-a", "d", {"resourceQuotas": quotas, "host": ""}, **kwargs
        )

    stray = review(
        client, "/admit/tenant-gpu-keys", tenant_body({"gpuclass.cozystack.io/gpus": "1"})
    )
    assert not stray["allowed"] and "not a GPU budget key" in stray["status"]["message"]
    missing = review(client, "/admit/tenant-gpu-keys", tenant_body({"requests.cpu": "2"}))
    assert not missing["allowed"]
    assert f"declare {TOTAL_KEY}, {L40S_KEY} too" in missing["status"]["message"]
    # a: 4 total; b declares 1; render reserves 2: d may declare at most 1
    too_much = review(
        client, "/admit/tenant-gpu-keys", tenant_body({TOTAL_KEY: "2", L40S_KEY: "0"})
    )
    assert not too_much["allowed"]
    assert "the pool of tenant a (tenant-a) can give 1" in too_much["status"]["message"]
    assert review(client, "/admit/tenant-gpu-keys", tenant_body({TOTAL_KEY: "1", L40S_KEY: "0"}))[
        "allowed"
    ]


def test_unreadable_inputs_deny_saying_what_could_not_be_read(
    client: FlaskClient, apiserver: FakeApiServer
) -> None:
    apiserver.serve(HELMRELEASES, 503, {"kind": "Status"})
    answer = review(client, "/admit/gpu-budget", vm_body("tenant-a", "x", GPU))
    assert answer["allowed"] is False
    assert answer["status"]["message"].startswith(
        "GPU budget check failed closed: could not list HelmReleases"
    )


def test_budget_reviews_are_counted_by_verdict_failed_closed_apart(
    settings: Settings, cluster: list[dict[str, Any]], apiserver: FakeApiServer
) -> None:
    metrics = Metrics(180.0)
    client = create_app(settings, metrics=metrics).test_client()
    review(client, "/admit/gpu-budget", vm_body("tenant-c", "x", GPU))  # an unbounded tenant
    review(client, "/admit/gpu-budget", vm_body("tenant-a", "y", GPU, GPU, GPU, GPU, GPU))
    apiserver.serve(HELMRELEASES, 503, {"kind": "Status"})
    review(client, "/admit/gpu-budget", vm_body("tenant-a", "z", GPU))
    counted = {
        sample.labels["verdict"]: sample.value
        for family in text_string_to_metric_families(metrics.exposition()[0].decode())
        for sample in family.samples
        if sample.name == "cozystack_gpu_budget_reviews_total"
    }
    assert counted == {"allowed": 1, "denied": 1, "failed_closed": 1}


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [
        ("admission.k8s.io/v1", "ConfigMap"),
        ("admission.k8s.io/v1", "AdmissionRequest"),
        ("admission.k8s.io/v1beta1", "AdmissionReview"),
        ("v1", "AdmissionReview"),
    ],
)
def test_an_envelope_that_is_not_a_v1_admission_review_is_a_400(
    client: FlaskClient, api_version: str, kind: str
) -> None:
    body = vm_body("tenant-a", "x", GPU)
    body["apiVersion"], body["kind"] = api_version, kind
    response = client.post("/admit/gpu-budget", json=body, base_url=HTTPS)
    assert response.status_code == 400 and set(response.json) == {"error"}


def test_a_real_delete_with_a_null_object_is_allowed(client: FlaskClient) -> None:
    """What the API server sends for a DELETE: no object, the old one as it was."""
    body = vm_body("tenant-a", "render", GPU, GPU, GPU, GPU, GPU, operation="DELETE")
    body["request"]["oldObject"] = body["request"]["object"]
    body["request"]["object"] = None
    answer = review(client, "/admit/gpu-budget", body)
    assert answer["allowed"] is True and answer["uid"] == body["request"]["uid"]


def test_other_kinds_and_operations_pass(client: FlaskClient) -> None:
    other = vm_body("tenant-a", "x", GPU, GPU, GPU)
    other["request"]["kind"]["kind"] = "Postgres"
    assert review(client, "/admit/gpu-budget", other)["allowed"]
    delete = vm_body("tenant-a", "render", GPU, operation="DELETE")
    assert review(client, "/admit/gpu-budget", delete)["allowed"]


def test_a_malformed_object_in_a_readable_review_is_denied_with_200(client: FlaskClient) -> None:
    body = vm_body("tenant-a", "x", GPU)
    body["request"]["object"]["spec"]["gpus"] = "all of them"
    answer = review(client, "/admit/gpu-budget", body)
    assert answer["allowed"] is False and "object is not a valid app" in answer["status"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"{}",
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
        b'{"apiVersion": "v1", "kind": "Pod", "request": {"uid": "x"}}',
    ],
)
def test_an_unreadable_review_is_a_400(client: FlaskClient, body: bytes) -> None:
    response = client.post("/admit/gpu-budget", data=body, base_url=HTTPS)
    assert response.status_code == 400 and set(response.json) == {"error"}


ADMISSION_ROUTES = ("/admit/gpu-budget", "/admit/tenant-gpu-keys")


@pytest.mark.parametrize("route", ADMISSION_ROUTES)
def test_plain_http_is_refused(client: FlaskClient, route: str) -> None:
    response = client.post(route, data=example_of(route), content_type="application/json")
    assert response.status_code == 403
    assert response.json == {"error": "admission webhooks are served over HTTPS only"}


@pytest.mark.parametrize("route", ADMISSION_ROUTES)
def test_admission_is_exempt_from_the_hook_token(
    settings: Settings, cluster: list[dict[str, Any]], tmp_path: Path, route: str
) -> None:
    """With the token required, the API server's calls (which carry none) are still answered."""
    tokens = tmp_path / "tokens"
    tokens.write_text("hook-token\n")
    client = create_app(settings.model_copy(update={"auth_token_file": tokens})).test_client()
    answer = review(client, route, example_of(route))
    assert answer["uid"] and isinstance(answer["allowed"], bool)
    assert client.post("/status/sync", json={}, base_url=HTTPS).status_code == 401


def test_example_review_in_examples(client: FlaskClient) -> None:
    example = EXAMPLES / "admit-gpu-budget.json"
    assert review(client, "/admit/gpu-budget", example.read_bytes())["allowed"] is False


# --- issue 12, through the route --------------------------------------------------------------


@pytest.fixture
def warnings() -> Iterator[list[dict[str, Any]]]:
    """The service's structured log lines at WARNING and above, as dicts."""
    records: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append({"event": record.getMessage(), **getattr(record, "fields", {})})

    handler = Collect(logging.WARNING)
    LOGGER.addHandler(handler)
    try:
        yield records
    finally:
        LOGGER.removeHandler(handler)


def helmrelease_reads(apiserver: FakeApiServer) -> int:
    return sum(1 for path, _ in apiserver.requests if path.startswith(HELMRELEASES))


def test_a_gpu_less_app_and_a_shrinking_update_read_nothing(
    client: FlaskClient, apiserver: FakeApiServer
) -> None:
    apiserver.serve(HELMRELEASES, 503, {"kind": "Status"})  # would deny if it were read
    plain = admission_review("VMInstance", "tenant-a", "plain", {"instanceType": ""})
    assert review(client, "/admit/gpu-budget", plain)["allowed"]
    shrink = vm_body(
        "tenant-a", "render", GPU, operation="UPDATE", old_spec={"gpus": gpus(GPU, GPU)}
    )
    assert review(client, "/admit/gpu-budget", shrink)["allowed"]
    assert helmrelease_reads(apiserver) == 0
    # an instance type, the default one included, may attach GPUs: its pool is read
    typed = review(client, "/admit/gpu-budget", vm_body("tenant-a", "typed"))
    assert not typed["allowed"] and "could not list HelmReleases" in typed["status"]["message"]


def test_a_declaration_without_gpu_keys_that_stays_unbounded_reads_nothing(
    client: FlaskClient, apiserver: FakeApiServer
) -> None:
    apiserver.serve(HELMRELEASES, 503, {"kind": "Status"})
    body = admission_review("Tenant", "tenant-a", "d", {"resourceQuotas": {}, "host": "d.example"})
    assert review(client, "/admit/tenant-gpu-keys", body)["allowed"]
    assert helmrelease_reads(apiserver) == 0


def test_growth_only_on_update_in_an_over_budget_pool(
    client: FlaskClient, cluster: list[dict[str, Any]]
) -> None:
    # render already holds 2 L40S of a's 2; a new VM with 3 more puts the pool over budget
    cluster.append(helmrelease("VMInstance", "tenant-a", "extra", {"gpus": gpus(OTHER_GPU) * 3}))
    old_spec = {"gpus": gpus(GPU, OTHER_GPU)}
    cluster.append(helmrelease("VMInstance", "tenant-a", "mixed", old_spec))
    same = vm_body("tenant-a", "mixed", GPU, OTHER_GPU, operation="UPDATE", old_spec=old_spec)
    assert review(client, "/admit/gpu-budget", same)["allowed"]
    as_create = vm_body("tenant-a", "mixed", GPU, OTHER_GPU)
    assert not review(client, "/admit/gpu-budget", as_create)["allowed"]


def test_a_malformed_quota_elsewhere_is_skipped_and_logged_once(
    client: FlaskClient, cluster: list[dict[str, Any]], warnings: list[dict[str, Any]]
) -> None:
    quota = {"resourceQuotas": {L40S_KEY: "1500m"}}
    cluster.append(helmrelease("Tenant", "tenant-root", "legacy", quota))
    # a bounded tenant x inside legacy: its pool is its own, so legacy's quota is read (legacy
    # owns an ancestor namespace) but not needed
    cluster.append(helmrelease("Tenant", "tenant-legacy", "x", {"resourceQuotas": {TOTAL_KEY: 2}}))
    assert review(client, "/admit/gpu-budget", vm_body("tenant-legacy-x", "v", OTHER_GPU))[
        "allowed"
    ]
    skipped = [w for w in warnings if w["event"] == "skipped unreadable objects"]
    assert skipped == [
        {
            "event": "skipped unreadable objects",
            "route": "/admit/gpu-budget",
            "objects": [
                "HelmRelease tenant-root/tenant-legacy: spec.values.resourceQuotas."
                "l40s.gpuclass.cozystack.io/devices: extended resources are whole units"
            ],
            "count": 1,
        }
    ]
    # inside that tenant's own pool the verdict needs it: denied, naming object and field
    answer = review(client, "/admit/gpu-budget", vm_body("tenant-legacy", "x", GPU))
    assert answer["status"]["message"] == (
        "GPU budget check failed closed: HelmRelease tenant-root/tenant-legacy: "
        "spec.values.resourceQuotas.l40s.gpuclass.cozystack.io/devices: "
        "extended resources are whole units"
    )


def test_a_malformed_quota_is_correctable_through_the_tenant_api(
    client: FlaskClient, cluster: list[dict[str, Any]]
) -> None:
    quota = {"resourceQuotas": {L40S_KEY: "1500m"}}
    cluster.append(helmrelease("Tenant", "tenant-root", "legacy", quota))
    for fixed in ({L40S_KEY: "1"}, {"requests.cpu": "2"}):
        body = admission_review(
            "Tenant",
            "tenant-root",
            "legacy",
            {"resourceQuotas": fixed},
            operation="UPDATE",
            old_spec=quota,
        )
        assert review(client, "/admit/tenant-gpu-keys", body)["allowed"], fixed
    still_bad = admission_review(
        "Tenant", "tenant-root", "legacy", quota, operation="UPDATE", old_spec=quota
    )
    answer = review(client, "/admit/tenant-gpu-keys", still_bad)
    assert answer["status"]["message"] == (
        f"Tenant tenant-root/legacy: spec.resourceQuotas.{L40S_KEY}: "
        "extended resources are whole units"
    )


def test_an_unreadable_member_app_denies_naming_object_and_field(
    client: FlaskClient, cluster: list[dict[str, Any]]
) -> None:
    cluster.append(helmrelease("VMInstance", "tenant-a", "legacy", {"gpus": None}))
    answer = review(client, "/admit/gpu-budget", vm_body("tenant-a", "x", OTHER_GPU))
    assert answer["status"]["message"] == (
        "GPU budget check failed closed: HelmRelease tenant-a/vm-instance-legacy: "
        "spec.values.gpus: expected a list, got null"
    )
    # a VM in another pool is not held up by it
    assert review(client, "/admit/gpu-budget", vm_body("tenant-c", "x", GPU))["allowed"]


def test_declarations_are_never_cached_two_quick_siblings_cannot_share_a_budget(
    settings: Settings, cluster: list[dict[str, Any]]
) -> None:
    cached = create_app(settings.model_copy(update={"admission_cache_seconds": 5})).test_client()
    cluster.append(helmrelease("Tenant", "tenant-root", "p", {"resourceQuotas": {TOTAL_KEY: "4"}}))

    def sibling(name: str) -> dict[str, Any]:
        return admission_review("Tenant", "tenant-p", name, {"resourceQuotas": {TOTAL_KEY: "3"}})

    assert review(cached, "/admit/tenant-gpu-keys", sibling("s"))["allowed"]
    cluster.append(helmrelease("Tenant", "tenant-p", "s", {"resourceQuotas": {TOTAL_KEY: "3"}}))
    answer = review(cached, "/admit/tenant-gpu-keys", sibling("t"))
    assert answer["allowed"] is False
    assert "the pool of tenant p (tenant-p) can give 1" in answer["status"]["message"]


def logged_calls(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The fields of each call's log line, less its duration."""
    calls = [r.fields for r in caplog.records if r.getMessage() == "hook call"]  # type: ignore[attr-defined]
    return [{k: v for k, v in call.items() if k != "duration_ms"} for call in calls]


def test_each_review_logs_one_line_with_its_verdict_and_what_it_read(
    client: FlaskClient, apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    malformed = vm_body("tenant-a", "bad", GPU)
    malformed["request"]["object"]["spec"]["gpus"] = "all of them"
    objectless = vm_body("tenant-a", "none", GPU)
    objectless["request"]["object"] = None
    tenant = admission_review("Tenant", "tenant-c", "d", {"resourceQuotas": {TOTAL_KEY: "1"}})
    bodies = [
        ("/admit/gpu-budget", vm_body("tenant-c", "ok", GPU)),
        (
            "/admit/gpu-budget",
            vm_body("tenant-a", "big", GPU, GPU, GPU, GPU, GPU, operation="UPDATE"),
        ),
        ("/admit/gpu-budget", malformed),
        ("/admit/gpu-budget", objectless),
        ("/admit/tenant-gpu-keys", tenant),
    ]
    with caplog.at_level(logging.INFO, logger=LOGGER.name):
        answers = [review(client, route, body) for route, body in bodies]
    assert [(a["uid"], a["allowed"]) for a in answers] == [
        (body["request"]["uid"], allowed)
        for (_, body), allowed in zip(bodies, [True, False, False, False, True], strict=True)
    ]
    calls = logged_calls(caplog)
    for call in calls:
        assert call.pop("body_bytes") > 0
    assert calls == [
        reviewed("/admit/gpu-budget", True, "VMInstance", "tenant-c", "ok", "CREATE"),
        reviewed("/admit/gpu-budget", False, "VMInstance", "tenant-a", "big", "UPDATE"),
        reviewed("/admit/gpu-budget", False, "VMInstance", "tenant-a", "bad", "CREATE"),
        {"route": "/admit/gpu-budget", "outcome": "denied", "allowed": False, "code": 200},
        reviewed("/admit/tenant-gpu-keys", True, "Tenant", "tenant-c", "d", "CREATE"),
    ]


def reviewed(
    route: str, allowed: bool, kind: str, namespace: str, name: str, operation: str
) -> dict[str, Any]:
    """The log line of a review that read its inputs and was answered 200."""
    return {
        "route": route,
        "outcome": "allowed" if allowed else "denied",
        "allowed": allowed,
        "kind": kind,
        "namespace": namespace,
        "name": name,
        "operation": operation,
        "read_inputs": True,
        "code": 200,
    }


@pytest.mark.parametrize("route", ["/admit/gpu-budget", "/admit/tenant-gpu-keys"])
def test_a_create_without_its_object_is_denied_saying_so_and_counted_nowhere(
    settings: Settings, cluster: list[dict[str, Any]], route: str
) -> None:
    metrics = Metrics(180.0)
    client = create_app(settings, metrics=metrics).test_client()
    kind = "Tenant" if route.endswith("keys") else "VMInstance"
    body = admission_review(kind, "tenant-a", "x", {}, uid="0b6f4d1e-0000-4000-8000-000000000001")
    body["request"]["object"] = None
    answer = review(client, route, body)
    assert answer == {
        "uid": "0b6f4d1e-0000-4000-8000-000000000001",
        "allowed": False,
        "status": {"code": 403, "message": "AdmissionReview request has no object"},
    }
    counted = [
        sample.value
        for family in text_string_to_metric_families(metrics.exposition()[0].decode())
        for sample in family.samples
        if sample.name == "cozystack_gpu_budget_reviews_total"
    ]
    assert counted == [0, 0, 0]
