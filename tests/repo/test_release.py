"""One version for the project, the chart and the image, and a changelog entry for it."""

from __future__ import annotations

import re
import tomllib

import yaml

import hooks
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
