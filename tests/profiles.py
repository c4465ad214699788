"""Hypothesis profiles: `make unit` (`--hypothesis-profile=quick`) and `make mutate` run every
property test on fewer examples; `make test` and CI run the full counts."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("quick", max_examples=30)
# Under mutation testing (mutmut sets MUTANT_UNDER_TEST) the property tests run on the quick
# counts too: each of thousands of mutant runs then costs what `make unit` costs.
if os.environ.get("MUTANT_UNDER_TEST"):
    settings.load_profile("quick")


def examples(full: int) -> int:
    """A property test's example count: `full` under the default profile, scaled down with the
    profile in force."""
    return max(10, full * settings().max_examples // 100)
