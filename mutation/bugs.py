"""Bugs the suite must keep catching: each patch under mutation/bugs/ puts back one (a mutant that
once survived, or the bug behind a behaviour an issue named), and the suite must fail on it.

For each patch: a scratch copy of the checkout, the patch applied, and the tests run there
with this checkout's venv (the first failure ends the run): `make unit`, or, for a bug only the
real server, helm or the API server shows, the tests the patch names before its diff, one line
`Caught by: <pytest node ids>` (git apply skips the lines before a diff). The unpatched copy runs
the same tests first and must pass, so that a failure is the patch's doing. Prints one line per
patch and exits 1 if any patch leaves its tests green. Not in CI (a few minutes): run it with
`make bugs` after changing tests or the code a patch touches; a patch that no longer applies is
refreshed by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import cozystack  # noqa: E402 (the checkout's own test helpers)

BUGS = Path(__file__).with_name("bugs")
VENV = ROOT / ".venv"
CAUGHT_BY = "Caught by: "
PATCHES_APPLY = "tests/repo/test_mutation_report.py::test_every_bug_patch_still_applies_to_the_code"


def scratch_copy(into: Path) -> Path:
    """A clone sharing this checkout's history (tests read commits: a design at a commit, the
    chart of an earlier release), its tracked files as they are in the working tree, without the
    venv or caches."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    copy = into / "repo"
    subprocess.run(
        ["git", "clone", "--quiet", "--shared", "--no-checkout", str(ROOT), str(copy)], check=True
    )
    subprocess.run(["git", "-C", str(copy), "reset", "--quiet"], check=True)
    for name in filter(None, listed.split("\0")):
        source, target = ROOT / name, copy / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return copy


def named_tests(patch: Path) -> list[str]:
    """The node ids of the patch's `Caught by:` line; none means `make unit`."""
    for line in patch.read_text().splitlines():
        if line.startswith(("diff ", "--- ")):
            break
        if line.startswith(CAUGHT_BY):
            return line.removeprefix(CAUGHT_BY).split()
    return []


def run_tests(copy: Path, tests: list[str]) -> subprocess.CompletedProcess[str]:
    """`make unit` in the copy, or the named tests, with this checkout's venv, which make must not
    rebuild (its editable install points here; pytest imports the copy's hooks first)."""
    venv_ready = f"{VENV}/bin/gpuclass-hooks"
    # The patched copy no longer takes its own patch: the test that checks every patch applies
    # would fail first on each, and a patch no other test catches would pass for caught.
    addopts = f"-x -p no:cacheprovider --deselect={PATCHES_APPLY}"
    # The copies live elsewhere: they read Cozystack's sources where this checkout does.
    env = {
        **os.environ,
        "PYTEST_ADDOPTS": addopts,
        cozystack.ARCHIVE_VARIABLE: str(cozystack.archive()),
    }
    if tests:
        testenv = os.environ.get("GPUCLASS_TESTENV_CACHE", "")
        env["PATH"] = f"{testenv}:{VENV}/bin:{env['PATH']}"
        command = [f"{VENV}/bin/pytest", "-q", *tests]
    else:
        command = ["make", "--no-print-directory", "-o", venv_ready, f"VENV={VENV}", "unit"]
    return subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=1800)


def first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("FAILED ") or line.startswith("ERROR "):
            return line.split(" - ")[0]
    return output.strip().splitlines()[-1] if output.strip() else "(no output)"


def main(names: list[str]) -> int:
    patches = sorted(BUGS.glob("*.patch"))
    if names:
        patches = [p for p in patches if p.stem in names]
    with tempfile.TemporaryDirectory(prefix="gpuclass-bugs-") as work:
        clean = scratch_copy(Path(work) / "clean")
        for tests in sorted({tuple(named_tests(patch)) for patch in patches}):
            baseline = run_tests(clean, list(tests))
            if baseline.returncode != 0:
                what = " ".join(tests) or "make unit"
                print(f"the unpatched copy fails {what}: {first_failure(baseline.stdout)}")
                return 1
        missed = []
        for patch in patches:
            copy = scratch_copy(Path(work) / patch.stem)
            applied = subprocess.run(
                ["git", "apply", str(patch)], cwd=copy, capture_output=True, text=True
            )
            if applied.returncode != 0:
                print(f"{patch.stem}: does not apply: {applied.stderr.strip()}")
                missed.append(patch.stem)
                continue
            tests = named_tests(patch)
            started = time.monotonic()
            result = run_tests(copy, tests)
            took = time.monotonic() - started
            if result.returncode == 0:
                what = " ".join(tests) or "make unit"
                print(f"{patch.stem}: NOT CAUGHT ({what} passed in {took:.0f} s)")
                missed.append(patch.stem)
            else:
                print(f"{patch.stem}: caught by {first_failure(result.stdout)} ({took:.0f} s)")
            shutil.rmtree(copy)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
