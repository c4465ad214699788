"""What a hook's handler gives back, wherever it ran: the payload, the facts of its log line, what
it skipped, and what its metrics record.

Kept apart from Flask, prometheus-client and requests: a large call is computed in a child of the
fork server (`hooks.forked`), which imports the handlers and this module and none of those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hooks.rules.budget.usage import PoolUse
from hooks.rules.capacity import Capacity
from hooks.wire.kube import Condition


@dataclass(frozen=True)
class ClassComputation:
    """One class's status computation, from the controller to the metrics: every class the sync
    saw (None when the request did not say, so that deleted classes are forgotten), the capacity
    (None when the spec could not be read), whether the class exports its inventory (a
    conflicting class reports zero and does not), and its conditions (none: nothing to record)."""

    class_name: str
    known_classes: tuple[str, ...] | None = None
    resource: str | None = None
    capacity: Capacity | None = None
    exports_inventory: bool = False
    free: int = 0
    max_free_per_node: int = 0
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True)
class LicenseCopiesObserved:
    """A license sync as the metrics see it: the copies it keeps, or None for a class that holds
    no license (its series goes)."""

    class_name: str
    copies: int | None


@dataclass(frozen=True)
class BudgetReviewObserved:
    """A budget review as the metrics see it: allowed, denied by the budget rules, or denied
    because an input could not be read (the webhook fails closed)."""

    verdict: Literal["allowed", "denied", "failed_closed"]


@dataclass(frozen=True)
class BudgetUsageObserved:
    """A budget report sync as the metrics see it: every GPU budget pool, the whole set (a pool
    missing from it is gone)."""

    pools: tuple[PoolUse, ...]


Observation = ClassComputation | LicenseCopiesObserved | BudgetReviewObserved | BudgetUsageObserved


@dataclass(frozen=True)
class Answer:
    """What a hook answers: the payload, the fields of its log line, the objects it skipped
    because they did not decode (named in one warning, with `about` saying where), and for a sync
    what its metrics record."""

    payload: bytes
    facts: dict[str, Any]
    skipped: Sequence[str] = ()
    about: dict[str, str] = field(default_factory=dict)
    observation: Observation | None = None


class FailedElsewhere(Exception):
    """An unexpected error where its traceback cannot follow (in another process): its type and
    last frames, which is all the serving process logs of any unexpected error."""

    def __init__(self, error_type: str, frames: list[str]) -> None:
        super().__init__(error_type)
        self.error_type = error_type
        self.frames = frames
