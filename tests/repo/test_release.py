"""One version for the project, the chart and the image, and a changelog entry for it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import hooks
from mutation.bugs import scratch_copy
from tests import ROOT

SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")


def test_the_chart_and_the_package_carry_the_one_version() -> None:
    chart = yaml.safe_load((ROOT / "metacontroller" / "Chart.yaml").read_text())
    assert SEMVER.match(hooks.__version__)
    assert chart["version"] == chart["appVersion"] == hooks.__version__
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "hooks.__version__"}


def test_the_changelog_has_an_entry_for_the_version_with_its_upgrade_notes() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    entries = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert entries and entries[0] in (hooks.__version__, "Unreleased")
    assert hooks.__version__ in entries
    entry = text.split(f"## [{hooks.__version__}]", 1)[1].split("\n## [", 1)[0]
    assert "### Upgrade notes" in entry
    assert "CHANGELOG.md" in (ROOT / "docs" / "install.md").read_text()


# --- make release's refusals (the release itself: tests/image/test_release.py) ------------------

IDENTITY = {
    "GIT_AUTHOR_NAME": "release test",
    "GIT_AUTHOR_EMAIL": "release@test.invalid",
    "GIT_COMMITTER_NAME": "release test",
    "GIT_COMMITTER_EMAIL": "release@test.invalid",
}


def release(copy: Path, version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "release/release.py", "--version", version, "--base", "unused"],
        cwd=copy,
        env={**os.environ, **IDENTITY},
        capture_output=True,
        text=True,
        timeout=120,
    )


def committed_copy(tmp_path: Path) -> Path:
    """A copy of the checkout with its working tree committed, as a clean clone is."""
    copy = scratch_copy(tmp_path)
    subprocess.run(["git", "add", "--all"], cwd=copy, check=True)
    subprocess.run(
        ["git", "commit", "--quiet", "--allow-empty", "-m", "the tree under test"],
        cwd=copy,
        env={**os.environ, **IDENTITY},
        check=True,
    )
    return copy


def test_a_release_refuses_a_tree_with_changes(tmp_path: Path) -> None:
    copy = committed_copy(tmp_path)
    (copy / "README.md").write_text((copy / "README.md").read_text() + "\nchanged\n")
    done = release(copy, hooks.__version__)
    assert done.returncode == 2
    assert done.stderr == "release: the tree has changes: commit or stash them, then release\n"


def test_a_release_refuses_a_version_without_a_changelog_entry(tmp_path: Path) -> None:
    copy = committed_copy(tmp_path)
    done = release(copy, "9.9.9")
    assert done.returncode == 2
    assert "CHANGELOG.md has no entry for 9.9.9" in done.stderr
    tags = subprocess.run(["git", "tag"], cwd=copy, capture_output=True, text=True).stdout
    assert "v9.9.9" not in tags.split()


@pytest.mark.parametrize("version", ["1.2", "v1.2.3", "01.2.3", "1.2.3-rc1"])
def test_a_release_refuses_a_version_that_is_not_semantic(tmp_path: Path, version: str) -> None:
    done = release(committed_copy(tmp_path), version)
    assert done.returncode == 2
    assert f"{version!r} is not a version MAJOR.MINOR.PATCH" in done.stderr


def test_a_release_refuses_a_tag_of_its_version_on_another_commit(tmp_path: Path) -> None:
    copy = committed_copy(tmp_path)
    subprocess.run(
        ["git", "tag", "--force", f"v{hooks.__version__}", "HEAD~1"], cwd=copy, check=True
    )
    done = release(copy, hooks.__version__)
    assert done.returncode == 2
    assert f"v{hooks.__version__} already tags another commit" in done.stderr


def test_the_previous_release_is_the_newest_release_commit_in_the_history(tmp_path: Path) -> None:
    """`make e2e` upgrades from it; the commit's subject finds it where tags did not travel."""
    copy = committed_copy(tmp_path)
    for subject in ("release 0.3.0", "after the release", "release notes: a draft", "release v9"):
        subprocess.run(
            ["git", "commit", "--quiet", "--allow-empty", "-m", subject],
            cwd=copy,
            env={**os.environ, **IDENTITY},
            check=True,
        )
    found = subprocess.run(
        [sys.executable, "-c", "from release.release import latest_release as l; print(*l())"],
        cwd=copy,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    released = subprocess.run(
        ["git", "rev-parse", "HEAD~3"], cwd=copy, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert found == ["0.3.0", released]
