"""spec.dra of a GPUClass (hooks.wire.gpuclass.DraSpec): what a DRA class may name."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from hooks.wire.gpuclass import DraSpec


def test_a_dra_spec_keeps_typed_values() -> None:
    spec = DraSpec.model_validate(
        {"driver": "gpu.nvidia.com", "attributes": {"type": "vfio", "index": 0, "x.io/n": "1"}}
    )
    assert spec.attributes == {"type": "vfio", "index": 0, "x.io/n": "1"}
    assert isinstance(spec.attributes["index"], int)
    assert isinstance(spec.attributes["x.io/n"], str)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"driver": "Not_DNS", "attributes": {"a": "b"}}, "DNS subdomain"),
        ({"driver": "gpu.nvidia.com", "attributes": {}}, "1 to 8"),
        ({"driver": "gpu.nvidia.com", "attributes": {f"a{i}": 1 for i in range(9)}}, "1 to 8"),
        ({"driver": "gpu.nvidia.com", "attributes": {"bad-name": "x"}}, "C identifier"),
        ({"driver": "gpu.nvidia.com", "attributes": {"a" * 33: "x"}}, "C identifier"),
        ({"driver": "gpu.nvidia.com", "attributes": {"Bad_Domain/a": "x"}}, "domain"),
        ({"driver": "gpu.nvidia.com", "attributes": {"a": "x" * 65}}, "at most 64"),
        ({"driver": "gpu.nvidia.com", "attributes": {"a": True}}, "valid integer"),
        ({"driver": "gpu.nvidia.com", "attributes": {"a": 1.5}}, "valid integer"),
    ],
)
def test_a_dra_spec_refuses_what_a_driver_cannot_publish(
    spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        DraSpec.model_validate(spec)
