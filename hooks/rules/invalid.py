"""What every rule reports about the objects it could not use."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InvalidObject:
    """An object a rule skipped; the reason never carries object contents."""

    kind: str
    name: str
    reason: str
