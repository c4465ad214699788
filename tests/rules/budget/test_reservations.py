"""What an app reserves (`hooks.rules.budget.reservations`)."""

from __future__ import annotations

from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.reservations import Catalog, cannot_grow, reservation
from hooks.rules.classes import ClassIdentity
from tests.rules.budget import (
    CLASSES,
    H100,
    L40S,
    pool,
    vm,
)


def test_the_oldest_class_wins_a_shared_resource_name() -> None:
    classes = (
        *CLASSES,
        ClassIdentity("a-newer", "2026-06-01T00:00:00Z", False, L40S),
        ClassIdentity("z-older", "2025-06-01T00:00:00Z", False, L40S),
    )
    assert reservation(vm("ns", "v", L40S), Catalog(classes)).keys == {
        class_key("z-older"): 1,
        TOTAL_KEY: 1,
    }


def test_reviews_that_cannot_grow_need_no_input() -> None:
    assert cannot_grow(vm("ns", "v"), None)
    old = vm("ns", "v", L40S, H100)
    assert cannot_grow(vm("ns", "v", H100), old)
    assert not cannot_grow(vm("ns", "v", L40S, L40S), old)
    workers = pool("ns", "p", L40S, max_replicas=3)
    assert cannot_grow(pool("ns", "p", L40S, max_replicas=2), workers)
    assert not cannot_grow(pool("ns", "p", L40S), workers)  # unset is 10
    assert not cannot_grow(vm("ns", "v", L40S), None)
