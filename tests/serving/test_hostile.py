"""Hostile and broken input on every route: 200 with the defined fallback or 4xx with a JSON
error; never 500, never a hang, and the service keeps serving afterwards."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from hooks.routes import HOOKS
from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import Tenancy, Tenant
from hooks.rules.classes import ClassIdentity
from hooks.serving.app import create_app
from hooks.settings import Settings
from tests.builders import (
    GPU,
    admission_review,
    example_of,
    gpuclass,
    license_sync_request,
    licensed_class,
    namespace,
    node,
    pod,
    source_secret,
    status_sync_request,
)
from tests.profiles import examples

# Every hook of the table, by who calls it: Metacontroller's over HTTP, the API server's over HTTPS.
ROUTES = tuple(hook.path for hook in HOOKS if not hook.https_only)
ADMISSION_ROUTES = tuple(hook.path for hook in HOOKS if hook.https_only)


@pytest.fixture(scope="module")
def offline_client() -> FlaskClient:
    # No API server: KubeVirt is unreadable, which is itself a defined fallback.
    return create_app(
        Settings(kube_api="http://127.0.0.1:9", kube_timeout_seconds=0.2)
    ).test_client()


ANSWERS = {hook.path: hook.answers for hook in HOOKS}


def assert_answered(response: Any, route: str) -> None:
    """A 4xx with a short JSON error, or a 200 that is the exact envelope of the route."""
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.status_code
    assert response.mimetype == "application/json"
    payload = json.loads(response.get_data())
    if response.status_code != 200:
        assert set(payload) == {"error"} and isinstance(payload["error"], str)
        return
    envelope = ANSWERS[route]
    assert envelope.always <= set(payload) <= envelope.always | envelope.sometimes, payload.keys()
    if "relatedResources" in payload:
        rules = payload["relatedResources"]
        assert isinstance(rules, list)
        assert all({"apiVersion", "resource"} <= set(rule) for rule in rules)
    if "children" in payload:  # a composite's: the status, and no children ever
        assert payload["children"] == [] and isinstance(payload["status"], dict)
    if "attachments" in payload:  # a decorator's: the target's status left alone
        assert payload["status"] is None and isinstance(payload["attachments"], list)


def still_serving(offline_client: FlaskClient) -> None:
    response = offline_client.post(
        "/status/sync", json=status_sync_request(gpuclass("ok"), nodes=[node("gpu-1")])
    )
    assert response.status_code == 200


RAW_BODIES = [
    b"",
    b"{",
    b"}",
    b"null",
    b"[]",
    b"42",
    b'"text"',
    b"true",
    b'{"parent": ',
    b'{"parent": {"apiVersion": "cozystack.io/v1alpha1", "kind": "GPUClass"',
    b"\xff\xfe\x00garbage",
    b"{'parent': 1}",
    b'{"parent": NaN}',
    b'{"parent": Infinity}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b'{"parent": {"kind": "GPUClass", "kind": "Pod"}}',
    b'{"parent": 1, "parent": 2}',
]


def body_id(body: bytes) -> str:
    """A test id made of letters, digits and dashes (the body's first bytes in hex when it has no
    letter or digit): mutmut names the tests it runs by their ids, and cannot name again one with
    brackets or escapes in it."""
    words = re.sub(r"[^A-Za-z0-9]+", "-", body[:24].decode("ascii", "replace")).strip("-")
    return words or f"hex-{body[:8].hex()}"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("body", RAW_BODIES, ids=body_id)
def test_malformed_bodies(offline_client: FlaskClient, route: str, body: bytes) -> None:
    assert_answered(offline_client.post(route, data=body, content_type="application/json"), route)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""],
)
def test_wrong_content_types(offline_client: FlaskClient, route: str, content_type: str) -> None:
    body = json.dumps(
        status_sync_request(gpuclass("a")) if "sync" in route else {"parent": gpuclass("a")}
    )
    assert_answered(offline_client.post(route, data=body, content_type=content_type), route)
    assert_answered(
        offline_client.post(route, data="parent=x&related=y", content_type=content_type), route
    )


def envelope_variants() -> list[dict[str, Any]]:
    good = status_sync_request(gpuclass("a"), nodes=[node("gpu-1")], pods=[pod("p")])
    bad_values: list[Any] = [None, 0, -1, 1e308, "x", [], {}, [None], True, "\u202e\u0000"]
    variants = []
    for value in bad_values:
        variants.append(dict(good, parent=value))
        variants.append(dict(good, related=value))
        variants.append(dict(good, related={"Node.v1": value}))
        variants.append(
            dict(
                good,
                related={
                    "Node.v1": {"n": value},
                    "Pod.v1": {},
                    "GPUClass.cozystack.io/v1alpha1": {},
                },
            )
        )
        variants.append(dict(good, attachments=value, object=gpuclass("a")))
        for field in ("metadata", "spec", "status", "apiVersion", "kind"):
            parent = dict(gpuclass("a"))
            parent[field] = value
            variants.append(dict(good, parent=parent, object=parent))
        for field in ("metadata", "spec", "status"):
            broken = node("gpu-2")
            broken[field] = value
            variants.append(
                dict(good, related=dict(good["related"], **{"Node.v1": {"gpu-2": broken}}))
            )
    return variants


@pytest.mark.parametrize("route", ROUTES)
def test_wrong_types_at_every_level(offline_client: FlaskClient, route: str) -> None:
    for variant in envelope_variants():
        assert_answered(offline_client.post(route, json=variant), route)
    still_serving(offline_client)


# A malformed quantity counts 0 wherever it stands, so only gpu-2's 4 units are free; 1Ki is 1024
# whole units: gpu-1 offers them all, and the pod's 1024 exhaust gpu-2.
@pytest.mark.parametrize(
    ("quantity", "free"),
    [
        ("-1", 4),
        ("-999999999999", 4),
        ("1e30", 4),
        ("9" * 60, 4),
        ("NaN", 4),
        ("Inf", 4),
        ("0x10", 4),
        ("1.5", 4),
        ("", 4),
        (" 1", 4),
        ("1Ki", 1024),
        ("\u0661", 4),
    ],
)
def test_negative_and_absurd_quantities(
    offline_client: FlaskClient, quantity: str, free: int
) -> None:
    request = status_sync_request(
        gpuclass("a"),
        nodes=[node("gpu-1", gpus=quantity), node("gpu-2", gpus=4, capacity=quantity)],
        pods=[pod("p", node_name="gpu-2", gpus=quantity)],
    )
    response = offline_client.post("/status/sync", json=request)
    assert response.status_code == 200
    assert (response.json["status"]["free"], response.json["status"]["maxFreePerNode"]) == (
        free,
        free,
    )


def test_unknown_kinds_and_groups_under_related_are_ignored(offline_client: FlaskClient) -> None:
    request = status_sync_request(gpuclass("a"), nodes=[node("gpu-1")])
    request["related"]["Widget.example.com/v1"] = {"w": {"kind": "Widget", "spec": [1, 2, 3]}}
    request["related"]["Node.v1"]["not-a-node"] = {"kind": "Pod", "metadata": {"name": "x"}}
    response = offline_client.post("/status/sync", json=request)
    assert response.status_code == 200
    assert response.json["status"]["free"] == 4


def test_huge_strings(offline_client: FlaskClient) -> None:
    huge = "x" * 5_000_000
    request = status_sync_request(gpuclass("a"), nodes=[node("gpu-1", labels={"big": huge})])
    request["related"]["Node.v1"]["gpu-1"]["metadata"]["annotations"] = {"a": huge}
    assert offline_client.post("/status/sync", json=request).status_code == 200
    parent = gpuclass("a")
    parent["spec"]["resourceName"] = huge
    response = offline_client.post("/status/sync", json=status_sync_request(parent))
    assert response.status_code == 200
    assert response.json["status"]["conditions"][0]["reason"] == "InvalidSpec"
    assert len(response.get_data()) < 10_000  # the message names the field, never the value


def test_unicode_in_names(offline_client: FlaskClient) -> None:
    request = status_sync_request(
        gpuclass("a"), nodes=[node("gpü-✓-1")], pods=[pod("пуд", node_name="gpü-✓-1")]
    )
    assert offline_client.post("/status/sync", json=request).json["status"]["free"] == 3
    weird = license_sync_request(
        licensed_class(),
        secrets=[source_secret()],
        namespaces=[namespace("tenant-a"), namespace("tenänt-✓"), namespace("UPPER")],
    )
    response = offline_client.post("/license/sync", json=weird)
    assert response.status_code == 200
    # Kubernetes would refuse a copy in an invalid namespace name: it is skipped, never emitted.
    assert [a["metadata"]["namespace"] for a in response.json["attachments"]] == ["tenant-a"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
kube_keys = st.sampled_from(
    [
        "metadata",
        "spec",
        "status",
        "name",
        "namespace",
        "labels",
        "resourceName",
        "allocatable",
        "capacity",
        "containers",
        "resources",
        "requests",
        "nodeName",
        "taints",
        "conditions",
        "data",
        "license",
        "secretRef",
        "uid",
        "ownerReferences",
    ]
)
kube_like = st.recursive(
    st.none()
    | st.integers(-5, 5)
    | st.sampled_from(["1", "-1", "True", "nvidia.com/X", "Always", "Ready", ""]),
    lambda children: (
        st.dictionaries(kube_keys, children, max_size=5) | st.lists(children, max_size=3)
    ),
    max_leaves=25,
)
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "parent": st.one_of(kube_like, st.just(gpuclass("a")), st.just(licensed_class())),
        "object": st.one_of(kube_like, st.just(licensed_class())),
        "related": st.dictionaries(
            st.sampled_from(
                [
                    "Node.v1",
                    "Pod.v1",
                    "Secret.v1",
                    "Namespace.v1",
                    "GPUClass.cozystack.io/v1alpha1",
                    "X",
                ]
            ),
            st.dictionaries(st.text(max_size=8), kube_like, max_size=3) | json_values,
            max_size=5,
        ),
        "attachments": st.one_of(json_values, st.just({"Secret.v1": {}})),
        "children": json_values,
        "finalizing": json_values,
    },
)


@hypothesis_settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(envelope=envelopes, route=st.sampled_from(ROUTES))
def test_generated_envelopes_never_fail_the_service(
    offline_client: FlaskClient, envelope: dict[str, Any], route: str
) -> None:
    assert_answered(offline_client.post(route, json=envelope), route)


def test_service_keeps_serving_after_the_storm(offline_client: FlaskClient) -> None:
    for body in RAW_BODIES:
        offline_client.post("/status/sync", data=body)
    still_serving(offline_client)


# --- the admission routes: what tenants' own actions reach ------------------------------------

HTTPS = "https://localhost"


class BoundedTenantA:
    """Inputs with one bounded tenant, so that reviews reach the arithmetic."""

    def catalog(self) -> Catalog:
        return Catalog((ClassIdentity("l40s", "2026-01-01T00:00:00Z", False, GPU),))

    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        return Tenancy((Tenant("tenant-root", "a", {TOTAL_KEY: 4, class_key("l40s"): 2}),), ())


@pytest.fixture(scope="module")
def admission_client() -> FlaskClient:
    # Bodies past the admission limit are refused unread (tested in test_auth.py); these reach
    # the decoder.
    settings = Settings(admission_max_body_bytes=1024**3)
    return create_app(settings, budgets=BoundedTenantA()).test_client()


def assert_reviewed(response: Any, uid: str | None = None) -> dict[str, Any] | None:
    """A 400 with a short JSON error, or an AdmissionReview answer for the uid; never 5xx."""
    assert response.status_code in (200, 400), response.status_code
    payload = json.loads(response.get_data())
    if response.status_code == 400:
        assert set(payload) == {"error"} and len(payload["error"]) < 2_000
        return None
    assert (payload["apiVersion"], payload["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    answer: dict[str, Any] = payload["response"]
    assert isinstance(answer["allowed"], bool)
    if uid is not None:
        assert answer["uid"] == uid
    if answer["allowed"]:
        assert set(answer) == {"uid", "allowed"}
    else:
        assert answer["status"]["code"] == 403
        assert 0 < len(answer["status"]["message"]) < 2_000
    return answer


@pytest.mark.parametrize("route", ADMISSION_ROUTES)
@pytest.mark.parametrize("body", RAW_BODIES, ids=body_id)
def test_admission_malformed_bodies_are_400(
    admission_client: FlaskClient, route: str, body: bytes
) -> None:
    response = admission_client.post(route, data=body, base_url=HTTPS)
    assert response.status_code == 400
    assert_reviewed(response)


def review_variants(kind: str, route: str) -> list[tuple[dict[str, Any], str]]:
    """(review, expectation): "400" when the review itself is unreadable, "denied" when it is
    readable but the object under review is not (and the route checks that kind), "allowed" for
    what the route does not check, "answered" when either verdict is fine."""
    ours = (kind == "Tenant") == (route == "/admit/tenant-gpu-keys")
    spec = {"gpus": [{"name": GPU}]} if kind != "Tenant" else {"resourceQuotas": {TOTAL_KEY: "1"}}
    good = admission_review(kind, "tenant-a", "x", spec, operation="UPDATE", old_spec=spec)
    variants: list[tuple[dict[str, Any], str]] = []
    missing_uid = json.loads(json.dumps(good))
    del missing_uid["request"]["uid"]
    variants.append((missing_uid, "400"))
    for value in (None, 0, "x", [], True):
        broken = json.loads(json.dumps(good))
        broken["request"] = value
        variants.append((broken, "400"))
        for field in ("uid", "kind", "namespace", "operation"):
            broken = json.loads(json.dumps(good))
            broken["request"][field] = value
            # a string is a string: only the kind (a group/version/kind map) refuses one
            readable = isinstance(value, str) and field != "kind"
            variants.append((broken, "answered" if readable else "400"))
        broken = json.loads(json.dumps(good))
        broken["request"]["object"] = value
        variants.append((broken, "denied" if ours else "allowed"))
        broken = json.loads(json.dumps(good))
        broken["request"]["object"]["spec"] = value
        variants.append((broken, "denied" if ours and value is not None else "answered"))
        broken = json.loads(json.dumps(good))
        broken["request"]["oldObject"] = value  # only the baseline of growth: never a 400
        variants.append((broken, "answered"))
    wrong_kind = json.loads(json.dumps(good))
    wrong_kind["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
    variants.append((wrong_kind, "allowed"))
    return variants


@pytest.mark.parametrize("route", ADMISSION_ROUTES)
@pytest.mark.parametrize("kind", ["VMInstance", "KubernetesNodes", "Tenant"])
def test_admission_wrong_types_at_every_level(
    admission_client: FlaskClient, route: str, kind: str
) -> None:
    for review, expected in review_variants(kind, route):
        response = admission_client.post(route, json=review, base_url=HTTPS)
        answer = assert_reviewed(response)
        if expected == "400":
            assert response.status_code == 400, review
        elif expected == "denied":
            assert answer is not None and answer["allowed"] is False, review
        elif expected == "allowed":
            assert answer is not None and answer["allowed"] is True, review
        else:
            assert answer is not None, review


def test_admission_deeply_nested_and_huge_objects_are_answered(
    admission_client: FlaskClient,
) -> None:
    nested = b'{"a":' * 50_000 + b"1" + b"}" * 50_000
    review = json.dumps(admission_review("VMInstance", "tenant-a", "x", {})).encode()
    body = review.replace(b'"spec": {}', b'"spec": ' + nested)
    response = admission_client.post("/admit/gpu-budget", data=body, base_url=HTTPS)
    assert response.status_code == 400
    assert response.json == {"error": "request body is nested too deeply"}
    many = admission_review("VMInstance", "tenant-a", "x", {"gpus": [{"name": GPU}] * 200_000})
    answer = assert_reviewed(admission_client.post("/admit/gpu-budget", json=many, base_url=HTTPS))
    assert answer is not None and answer["allowed"] is False
    assert "needs 200000" in answer["status"]["message"]
    huge = admission_review(
        "Tenant", "tenant-a", "x" * 1_000_000, {"resourceQuotas": {"k" * 1_000_000: "1"}}
    )
    assert_reviewed(admission_client.post("/admit/tenant-gpu-keys", json=huge, base_url=HTTPS))


def test_admission_a_huge_worker_pool_of_unmapped_devices_is_counted_not_built(
    admission_client: FlaskClient,
) -> None:
    spec = {"gpus": [{"name": "nvidia.com/NOT_A_CLASS"}] * 3, "maxReplicas": 10**15}
    pool = admission_review("KubernetesNodes", "tenant-a", "w", spec)
    answer = assert_reviewed(admission_client.post("/admit/gpu-budget", json=pool, base_url=HTTPS))
    assert answer is not None and answer["allowed"] is False
    assert "map to no GPUClass" in answer["status"]["message"]


def test_admission_negative_max_replicas_is_denied_naming_the_field(
    admission_client: FlaskClient,
) -> None:
    spec = {"gpus": [{"name": GPU}], "maxReplicas": -100}
    pool = admission_review("KubernetesNodes", "tenant-a", "w", spec)
    answer = assert_reviewed(admission_client.post("/admit/gpu-budget", json=pool, base_url=HTTPS))
    assert answer is not None and answer["status"]["message"] == (
        "object is not a valid app: spec.maxReplicas: expected an integer >= 0"
    )


finite_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
admission_specs = st.fixed_dictionaries(
    {},
    optional={
        "gpus": st.lists(st.fixed_dictionaries({"name": st.sampled_from([GPU, "x", ""])}))
        | finite_json,
        "maxReplicas": st.integers(-(2**70), 2**70) | finite_json,
        "resourceQuotas": st.dictionaries(
            st.sampled_from([TOTAL_KEY, class_key("l40s"), "xgpuclass.cozystack.io/devices"]),
            st.sampled_from(["1", "-1", "1500m", "1e3", "", 3, 2.5, None, True]) | finite_json,
        )
        | finite_json,
    },
)


@hypothesis_settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    route=st.sampled_from(ADMISSION_ROUTES),
    kind=st.sampled_from(["VMInstance", "KubernetesNodes", "Tenant", "Postgres"]),
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", ""]),
    spec=admission_specs,
    old_spec=admission_specs | finite_json,
)
def test_admission_generated_reviews_are_answered(
    admission_client: FlaskClient,
    route: str,
    kind: str,
    operation: str,
    spec: dict[str, Any],
    old_spec: Any,
) -> None:
    review = admission_review(
        "Tenant" if kind == "Postgres" else kind, "tenant-a", "x", spec, old_spec=old_spec
    )
    review["request"]["operation"] = operation
    review["request"]["kind"]["kind"] = kind
    response = admission_client.post(route, json=review, base_url=HTTPS)
    assert response.status_code == 200
    assert_reviewed(response, uid=review["request"]["uid"])


@pytest.mark.parametrize("route", [hook.path for hook in HOOKS])
def test_invalid_utf8_inside_an_object_is_never_a_500(
    admission_client: FlaskClient, route: str
) -> None:
    # msgspec checks a raw sub-object's UTF-8 only when that object is decoded on its own.
    body = example_of(route).replace(b'"uid-', b'"\xff\xfe-', 1)
    body = body.replace(b"tenant-a", b"tenant-\xff", 1) if b'"\xff' not in body else body
    body = body.replace(b'"cpu"', b'"cpu\xff"', 1) if b"\xff" not in body else body
    assert b"\xff" in body
    response = admission_client.post(route, data=body, base_url=HTTPS)
    assert response.status_code in (200, 400), response.get_data()
    payload = json.loads(response.get_data())
    assert set(payload) == {"error"} or response.status_code == 200
