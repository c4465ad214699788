"""A DRA class's DeviceClass selector on the real API server, which compiles every selector's
CEL when the DeviceClass is written: hostile attribute values still make one valid expression."""

from __future__ import annotations

import pytest

from hooks.rules.dra import device_class_selector
from tests.controlplane import ControlPlane

DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


@pytest.mark.tools
@pytest.mark.parametrize(
    "value", ["NVIDIA A10", '" || true || "', "\\", '\\"', "a\nb", "\u2028", "'", "`", 7, True]
)
def test_the_selector_compiles_whatever_the_attribute_value(
    kube: ControlPlane, value: str | int | bool
) -> None:
    selector = device_class_selector("gpu.nvidia.com", {"productName": value, "x.io/kind": "a"})
    name = f"t{abs(hash(repr(value))) % 10**8}.gpuclass.cozystack.io"
    created = kube.request(
        "POST",
        DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": selector}}]},
        },
    )
    assert created.status_code == 201, created.text
    stored = created.json()["spec"]["selectors"][0]["cel"]["expression"]
    assert stored == selector
    kube.request("DELETE", f"{DEVICE_CLASSES}/{name}")


@pytest.mark.tools
def test_a_broken_selector_is_refused_so_the_compile_check_is_real(kube: ControlPlane) -> None:
    created = kube.request(
        "POST",
        DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "broken.gpuclass.cozystack.io"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "a" || "'}}]},
        },
    )
    assert created.status_code == 422, created.text
