"""Hostile and broken input on every route: 200 with the defined fallback or 4xx with a JSON
error; never 500, never a hang, and the service keeps serving afterwards."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from hooks.app import create_app
from hooks.settings import Settings
from tests.builders import (
    gpuclass,
    license_sync_request,
    licensed_class,
    namespace,
    node,
    pod,
    source_secret,
    status_sync_request,
)

ROUTES = ("/status/sync", "/status/customize", "/license/sync", "/license/customize")


@pytest.fixture(scope="module")
def client() -> FlaskClient:
    # No API server: KubeVirt is unreadable, which is itself a defined fallback.
    return create_app(
        Settings(kube_api="http://127.0.0.1:9", kube_timeout_seconds=0.2)
    ).test_client()


def assert_answered(response: Any) -> None:
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.status_code
    assert response.mimetype == "application/json"
    payload = json.loads(response.get_data())
    if response.status_code != 200:
        assert set(payload) == {"error"}


def still_serving(client: FlaskClient) -> None:
    response = client.post(
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


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("body", RAW_BODIES, ids=lambda b: repr(b[:24]))
def test_malformed_bodies(client: FlaskClient, route: str, body: bytes) -> None:
    assert_answered(client.post(route, data=body, content_type="application/json"))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""],
)
def test_wrong_content_types(client: FlaskClient, route: str, content_type: str) -> None:
    body = json.dumps(
        status_sync_request(gpuclass("a")) if "sync" in route else {"parent": gpuclass("a")}
    )
    assert_answered(client.post(route, data=body, content_type=content_type))
    assert_answered(client.post(route, data="parent=x&related=y", content_type=content_type))


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
def test_wrong_types_at_every_level(client: FlaskClient, route: str) -> None:
    for variant in envelope_variants():
        assert_answered(client.post(route, json=variant))
    still_serving(client)


@pytest.mark.parametrize(
    "quantity",
    [
        "-1",
        "-999999999999",
        "1e30",
        "9" * 60,
        "NaN",
        "Inf",
        "0x10",
        "1.5",
        "",
        " 1",
        "1Ki",
        "\u0661",
    ],
)
def test_negative_and_absurd_quantities(client: FlaskClient, quantity: str) -> None:
    request = status_sync_request(
        gpuclass("a"),
        nodes=[node("gpu-1", gpus=quantity), node("gpu-2", gpus=4, capacity=quantity)],
        pods=[pod("p", node_name="gpu-2", gpus=quantity)],
    )
    response = client.post("/status/sync", json=request)
    assert response.status_code == 200
    assert 0 <= response.json["status"]["free"] <= 1024 + 4


def test_unknown_kinds_and_groups_under_related_are_ignored(client: FlaskClient) -> None:
    request = status_sync_request(gpuclass("a"), nodes=[node("gpu-1")])
    request["related"]["Widget.example.com/v1"] = {"w": {"kind": "Widget", "spec": [1, 2, 3]}}
    request["related"]["Node.v1"]["not-a-node"] = {"kind": "Pod", "metadata": {"name": "x"}}
    response = client.post("/status/sync", json=request)
    assert response.status_code == 200
    assert response.json["status"]["free"] == 4


def test_huge_strings(client: FlaskClient) -> None:
    huge = "x" * 5_000_000
    request = status_sync_request(gpuclass("a"), nodes=[node("gpu-1", labels={"big": huge})])
    request["related"]["Node.v1"]["gpu-1"]["metadata"]["annotations"] = {"a": huge}
    assert client.post("/status/sync", json=request).status_code == 200
    parent = gpuclass("a")
    parent["spec"]["resourceName"] = huge
    response = client.post("/status/sync", json=status_sync_request(parent))
    assert response.status_code == 200
    assert response.json["status"]["conditions"][0]["reason"] == "InvalidSpec"
    assert len(response.get_data()) < 10_000  # the message names the field, never the value


def test_unicode_in_names(client: FlaskClient) -> None:
    request = status_sync_request(
        gpuclass("a"), nodes=[node("gpü-✓-1")], pods=[pod("пуд", node_name="gpü-✓-1")]
    )
    assert client.post("/status/sync", json=request).json["status"]["free"] == 3
    weird = license_sync_request(
        licensed_class(),
        secrets=[source_secret()],
        namespaces=[namespace("tenant-a"), namespace("tenänt-✓"), namespace("UPPER")],
    )
    response = client.post("/license/sync", json=weird)
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
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(envelope=envelopes, route=st.sampled_from(ROUTES))
def test_generated_envelopes_never_fail_the_service(
    client: FlaskClient, envelope: dict[str, Any], route: str
) -> None:
    assert_answered(client.post(route, json=envelope))


def test_service_keeps_serving_after_the_storm(client: FlaskClient) -> None:
    for body in RAW_BODIES:
        client.post("/status/sync", data=body)
    still_serving(client)
