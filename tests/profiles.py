"""Hypothesis profiles: `make unit` runs every property test on fewer examples
(`--hypothesis-profile=quick`); `make test` and CI run the full counts."""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("quick", max_examples=30)


def examples(full: int) -> int:
    """A property test's example count: `full` under the default profile, scaled down with the
    profile in force."""
    return max(10, full * settings().max_examples // 100)
