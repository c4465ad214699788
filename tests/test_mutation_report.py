"""The report of `make mutate`: its score and its news, from mutmut's results and the list."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parent.parent
spec = importlib.util.spec_from_file_location("report", ROOT / "mutation" / "report.py")
assert spec is not None and spec.loader is not None
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

RESULTS = """
    hooks.rules.a.x_f__mutmut_1: killed
    hooks.rules.a.x_f__mutmut_2: survived
    hooks.rules.a.x_f__mutmut_3: survived
    hooks.rules.a.x_f__mutmut_4: killed
    hooks.rules.a.x_g__mutmut_1: not checked
"""


def test_listed_survivors_are_left_out_of_the_score_and_the_news() -> None:
    listed = report.equivalents(
        "# a comment\nhooks.rules.a.x_f__mutmut_2  # the same string either way\n"
    )
    text, code = report.report(RESULTS, listed)
    assert "score over mutants that change behaviour: 66.7%" in text
    assert "NEW SURVIVOR hooks.rules.a.x_f__mutmut_3" in text
    assert "x_f__mutmut_2" not in text.split("\n", 2)[2]
    assert code == 1


def test_a_listed_mutant_that_is_killed_now_is_to_be_removed() -> None:
    listed = report.equivalents(
        "hooks.rules.a.x_f__mutmut_1 # once\nhooks.rules.a.x_f__mutmut_2 #\n"
        "hooks.rules.a.x_f__mutmut_3 #\n"
    )
    text, code = report.report(RESULTS, listed)
    assert "remove from equivalent.txt: hooks.rules.a.x_f__mutmut_1" in text
    assert "score over mutants that change behaviour: 100.0%" in text
    assert code == 0


def test_every_listed_line_has_a_reason() -> None:
    for name, reason in report.equivalents(report.EQUIVALENT.read_text()).items():
        assert reason, f"{name} is listed without a reason"
