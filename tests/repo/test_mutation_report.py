"""The report of `make mutate`: its score and its news, from mutmut's results and the list of
equivalent survivors, which names each by its content so that renumbering cannot hide one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests import ROOT

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
HEAD = "--- a\n+++ a\n@@ -1 +1 @@\n"
DIFFS = {
    "hooks.rules.a.x_f__mutmut_1": HEAD + "-    return x + 1\n+    return x - 1",
    "hooks.rules.a.x_f__mutmut_2": HEAD + "-    s = 'a'\n+    s = 'XXaXX'",
    "hooks.rules.a.x_f__mutmut_3": HEAD + "-    if a and b:\n+    if a or b:",
}
F2 = "hooks/rules/a.py::f: - s = 'a' + s = 'XXaXX'"


def key_of(name: str) -> str:
    return report.content_key(name, DIFFS[name])


def test_a_mutant_is_keyed_by_file_function_and_the_lines_it_changes() -> None:
    assert key_of("hooks.rules.a.x_f__mutmut_2") == F2
    method = report.function_of("hooks.wire.kube.xǁNodeǁready__mutmut_7")
    assert method == "hooks/wire/kube.py::Node.ready"


def test_listed_survivors_are_left_out_of_the_score_and_the_news() -> None:
    listed = report.equivalents(f"# a comment\n{F2}\n    why: the same string either way\n")
    assert listed == {F2: "the same string either way"}
    text, code = report.report(RESULTS, listed, key_of)
    assert "score over mutants that change behaviour: 66.7%" in text
    assert (
        "NEW SURVIVOR hooks.rules.a.x_f__mutmut_3\n    hooks/rules/a.py::f: - if a and b:" in text
    )
    assert "x_f__mutmut_2" not in text.split("\n", 2)[2]
    assert code == 1


def test_a_mutant_no_test_reaches_counts_as_a_survivor() -> None:
    untested = RESULTS + "    hooks.rules.a.x_f__mutmut_5: no tests\n"
    diffs = {**DIFFS, "hooks.rules.a.x_f__mutmut_5": HEAD + "-    y = 1\n+    y = 2"}
    text, code = report.report(untested, {}, lambda name: report.content_key(name, diffs[name]))
    assert "3 survived (1 reached by no test; 0 listed as equivalent)" in text
    assert "score over mutants that change behaviour: 40.0%" in text
    assert "NEW SURVIVOR hooks.rules.a.x_f__mutmut_5" in text and code == 1


def test_a_renumbered_survivor_is_still_recognised_by_its_content() -> None:
    """The same mutation under another number (the function gained a mutant before it) is the
    same listed equivalent; a number that now points at another mutation is news."""
    listed = report.equivalents(f"{F2}\n    why: the same string either way\n")
    renumbered = RESULTS.replace("x_f__mutmut_2: survived", "x_f__mutmut_2: killed")
    diffs = {**DIFFS, "hooks.rules.a.x_f__mutmut_1": DIFFS["hooks.rules.a.x_f__mutmut_2"]}
    renumbered = renumbered.replace("x_f__mutmut_1: killed", "x_f__mutmut_1: survived")
    text, _ = report.report(renumbered, listed, lambda name: report.content_key(name, diffs[name]))
    assert "NEW SURVIVOR hooks.rules.a.x_f__mutmut_1" not in text
    assert "NEW SURVIVOR hooks.rules.a.x_f__mutmut_3" in text


def test_a_listed_mutation_that_no_longer_survives_is_to_be_removed() -> None:
    f1 = key_of("hooks.rules.a.x_f__mutmut_1")
    f3 = key_of("hooks.rules.a.x_f__mutmut_3")
    unchecked = "hooks/rules/a.py::g: - x + y"
    listed = report.equivalents(
        f"{f1}\n    why: once\n{F2}\n    why: x\n{f3}\n    why: y\n{unchecked}\n    why: z\n"
    )
    text, code = report.report(RESULTS, listed, key_of)
    assert f"remove from equivalent.txt: {f1}" in text
    assert unchecked not in text  # g was not checked in this run: nothing is known of it
    assert "score over mutants that change behaviour: 100.0%" in text
    assert code == 0


def test_every_listed_line_has_a_reason_and_names_a_function_of_the_service() -> None:
    listed = report.equivalents(report.EQUIVALENT.read_text())
    assert listed
    for key, reason in listed.items():
        assert reason, f"{key} is listed without a reason"
        path, _, function = key.partition(": ")[0].partition("::")
        assert (ROOT / path).is_file(), key
        assert f"def {function.rpartition('.')[2]}(" in (ROOT / path).read_text(), key


def test_every_listed_line_is_still_in_the_code() -> None:
    """An entry whose line the code no longer has can match no mutant: its reason was judged
    for code that is gone, and the mutant of the line that replaced it goes unjudged."""
    listed = report.equivalents(report.EQUIVALENT.read_text())
    for key in listed:
        where, _, change = key.partition(": - ")
        removed = change.split(" + ")[0]
        path = where.partition("::")[0]
        assert removed in (ROOT / path).read_text(), key


def test_every_bug_patch_still_applies_to_the_code() -> None:
    """mutation/bugs.py puts each bug back (`make bugs`, not in CI); a patch that no longer
    applies would silently stop proving anything, so the suite checks they all apply."""
    import subprocess

    root = ROOT
    patches = sorted((root / "mutation" / "bugs").glob("*.patch"))
    assert len(patches) >= 14
    for patch in patches:
        checked = subprocess.run(
            ["git", "apply", "--check", str(patch)], cwd=root, capture_output=True, text=True
        )
        assert checked.returncode == 0, f"{patch.name}: {checked.stderr}"


def test_every_test_a_bug_patch_names_exists() -> None:
    """A `Caught by:` line that names a renamed or deleted test would make pytest fail on the
    unknown name, which `make bugs` would count as the bug caught."""
    bugs_spec = importlib.util.spec_from_file_location("bugs", ROOT / "mutation" / "bugs.py")
    assert bugs_spec is not None and bugs_spec.loader is not None
    bugs = importlib.util.module_from_spec(bugs_spec)
    bugs_spec.loader.exec_module(bugs)
    named = 0
    for patch in sorted((ROOT / "mutation" / "bugs").glob("*.patch")):
        for node in bugs.named_tests(patch):
            path, _, name = node.partition("::")
            assert name and f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), node
            named += 1
    assert named >= 5


def test_the_bug_runs_leave_out_exactly_the_patch_test_by_its_real_name() -> None:
    """A patched copy fails the patch test whatever the bug (its patch is already in), so
    `make bugs` must leave it out; pytest ignores a --deselect that names nothing, so the name
    must be this test file's."""
    bugs_spec = importlib.util.spec_from_file_location("bugs", ROOT / "mutation" / "bugs.py")
    assert bugs_spec is not None and bugs_spec.loader is not None
    bugs = importlib.util.module_from_spec(bugs_spec)
    bugs_spec.loader.exec_module(bugs)
    path, _, name = bugs.PATCHES_APPLY.partition("::")
    assert ROOT / path == Path(__file__)
    assert name == test_every_bug_patch_still_applies_to_the_code.__name__
