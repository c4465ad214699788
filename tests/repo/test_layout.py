"""The house: where code and tests go (docs/development.md, "Layout" and "Tests")."""

from __future__ import annotations

import re

from tests import ROOT

TIER_FOLDERS = {"serving/live": "live", "chart": "tools", "apiserver": "tools"}


def test_the_top_of_the_package_holds_the_spine_and_the_wings_only() -> None:
    """At most eight modules and packages at the top of `hooks/`: the command line, the settings,
    the route table, the serving machinery and the domain's four packages."""
    top = sorted(
        p.name
        for p in (ROOT / "hooks").iterdir()
        if p.name not in ("__init__.py", "__pycache__")
        and (p.suffix == ".py" or (p / "__init__.py").exists())
    )
    assert len(top) <= 8, top


def test_a_test_that_starts_the_real_server_is_in_a_slow_tier() -> None:
    """`make unit` leaves the slow tiers out: a test outside their folders that starts gunicorn
    says so, or the quick tier would start servers."""
    unmarked = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        folder = path.parent.relative_to(ROOT / "tests").as_posix()
        text = path.read_text()
        slow = folder in TIER_FOLDERS or folder in ("image", "e2e") or "mark.live" in text
        if "live_server(" in text and not slow:
            unmarked.append(path.relative_to(ROOT).as_posix())
    assert unmarked == []


def test_every_slow_tier_folder_is_marked_by_the_conftest() -> None:
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    for folder, tier in TIER_FOLDERS.items():
        assert re.search(rf'"{folder}": \(pytest\.mark\.{tier},\)', conftest), folder
        assert (ROOT / "tests" / folder).is_dir()
