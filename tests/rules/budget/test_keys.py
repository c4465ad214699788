"""Budget keys and the quantities a declaration holds (`hooks.rules.budget.keys`)."""

from __future__ import annotations

import pytest

from hooks.rules.budget.keys import TOTAL_KEY, in_gpu_domain, is_budget_key
from tests.rules.budget import (
    L40S_KEY,
)


def test_budget_keys_and_the_gpu_domain() -> None:
    assert is_budget_key(TOTAL_KEY) and is_budget_key("l40s.gpuclass.cozystack.io/devices")
    assert not is_budget_key("l40s.gpuclass.cozystack.io/memory")
    assert not is_budget_key("Bad_Name.gpuclass.cozystack.io/devices")
    assert in_gpu_domain("gpuclass.cozystack.io/units") and in_gpu_domain(
        "x.gpuclass.cozystack.io/devices"
    )
    assert not in_gpu_domain("requests.cpu") and not in_gpu_domain("nvidia.com/gpu")


def test_parse_budget_whole_devices_from_what_people_write() -> None:
    from hooks.rules.budget.keys import parse_budget
    from hooks.rules.quantity import QuantityError

    assert (parse_budget(2), parse_budget("2"), parse_budget(2.0), parse_budget("2000m")) == (
        2,
        2,
        2,
        2,
    )
    for value, reason in ((None, "not a quantity"), (True, "not a quantity"), (-1, "negative")):
        with pytest.raises(QuantityError, match=f"^{reason}"):
            parse_budget(value)
    with pytest.raises(QuantityError):
        parse_budget(1.5)


def test_tenant_declaration_marks_values_that_do_not_parse() -> None:
    from hooks.rules.budget.keys import tenant_declaration

    assert tenant_declaration({TOTAL_KEY: "1500m", L40S_KEY: "2", "requests.cpu": "4"}) == {
        TOTAL_KEY: None,
        L40S_KEY: 2,
        "requests.cpu": 0,
    }
