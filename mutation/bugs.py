"""Bugs the suite must keep catching: each patch under mutation/bugs/ puts back one (a mutant that
once survived, or the bug behind a behaviour an issue named), and `make unit` must fail on it.

For each patch: a scratch copy of the tracked files, the patch applied, and `make unit` run there
with this checkout's venv (its first failure ends the run). The unpatched copy runs first and must
pass, so that a failure is the patch's doing. Prints one line per patch and exits 1 if any patch
leaves `make unit` green. Not in CI (a few minutes): run it with `make bugs` after changing tests
or the code a patch touches; a patch that no longer applies is refreshed by hand.
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
BUGS = Path(__file__).with_name("bugs")
VENV = ROOT / ".venv"
PATCHES_APPLY = "tests/test_mutation_report.py::test_every_bug_patch_still_applies_to_the_code"


def scratch_copy(into: Path) -> Path:
    """The tracked files (as they are in the working tree), without the venv or caches."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    copy = into / "repo"
    for name in filter(None, listed.split("\0")):
        source, target = ROOT / name, copy / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return copy


def make_unit(copy: Path) -> subprocess.CompletedProcess[str]:
    """`make unit` in the copy with this checkout's venv, which make must not rebuild (its
    editable install points here; pytest imports the copy's hooks first)."""
    venv_ready = f"{VENV}/bin/gpuclass-hooks"
    # The patched copy no longer takes its own patch: the test that checks every patch applies
    # would fail first on each, and a patch no other test catches would pass for caught.
    addopts = f"-x -p no:cacheprovider --deselect={PATCHES_APPLY}"
    env = {**os.environ, "PYTEST_ADDOPTS": addopts}
    return subprocess.run(
        ["make", "--no-print-directory", "-o", venv_ready, f"VENV={VENV}", "unit"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


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
        baseline = make_unit(clean)
        if baseline.returncode != 0:
            print(f"the unpatched copy fails make unit: {first_failure(baseline.stdout)}")
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
            started = time.monotonic()
            result = make_unit(copy)
            took = time.monotonic() - started
            if result.returncode == 0:
                print(f"{patch.stem}: NOT CAUGHT (make unit passed in {took:.0f} s)")
                missed.append(patch.stem)
            else:
                print(f"{patch.stem}: caught by {first_failure(result.stdout)} ({took:.0f} s)")
            shutil.rmtree(copy)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
