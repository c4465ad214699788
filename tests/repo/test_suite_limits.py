"""Every test has a time limit by its tier, so a hang is a failure that names its test."""

from __future__ import annotations

import pytest

from tests.conftest import TIER_TIMEOUT_SECONDS


def test_a_unit_test_has_the_unit_tiers_limit(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args == (TIER_TIMEOUT_SECONDS["unit"],)


@pytest.mark.live
def test_a_live_test_has_the_live_tiers_limit(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args == (TIER_TIMEOUT_SECONDS["live"],)
