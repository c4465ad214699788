"""Verdicts, and how a rule set's verdict is reached: the first denial, failing closed on what its
arithmetic needed and could not read."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from hooks.rules.budget.pools import FailedClosed
from hooks.rules.budget.tenancy import App, Tenant

FAILED_CLOSED = "GPU budget check failed closed: "


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    skipped: tuple[str, ...] = ()


ALLOWED = Verdict(True)


def unreadable_objects(tenants: Iterable[Tenant], apps: Iterable[App]) -> tuple[str, ...]:
    objects: tuple[Tenant | App, ...] = (*tenants, *apps)
    return tuple(sorted(o.unreadable for o in objects if o.unreadable is not None))


def decided(
    decide: Callable[[], Verdict], tenants: Iterable[Tenant], apps: Iterable[App]
) -> Verdict:
    """The verdict, denied naming the first unreadable object its arithmetic needed; otherwise
    carrying the unreadable objects it did not need, for the route to log."""
    try:
        verdict = decide()
    except FailedClosed as unreadable:
        return Verdict(False, f"{FAILED_CLOSED}{unreadable}")
    return replace(verdict, skipped=unreadable_objects(tenants, apps))


def first_denial(verdicts: Iterable[Verdict | None]) -> Verdict:
    """The first denial of rules tried in order (later rules are not run), else allowed."""
    return next((v for v in verdicts if v is not None), ALLOWED)
