"""The README is a front door and the docs are the manual: both stay inside the repository and
true to the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hooks.routes import HOOKS

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target): the target up to a closing parenthesis or a space (a title may follow).
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)[^)]*\)")
FENCE = re.compile(r"```.*?```", re.DOTALL)


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def test_the_readme_is_at_most_250_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_readme_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in first_block.splitlines()] == [
        ["make", "run"],
        ["make", "test"],
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    found = links(page)
    for target in found:
        assert not re.match(r"^[a-z][a-z0-9+.-]*:", target), f"{page.name}: {target} leaves"
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(ROOT.resolve()), f"{page.name}: {target} leaves the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target).resolve() for target in links(ROOT / "README.md")}
    assert set(PAGES[1:]) <= linked


def test_the_link_check_sees_links() -> None:
    # A check that matched nothing would pass on anything.
    assert "docs/gpuclass.md" in links(ROOT / "README.md")
    assert links(PAGES[1])


def test_every_hook_is_in_the_readme_routes_table() -> None:
    text = (ROOT / "README.md").read_text()
    for hook in HOOKS:
        assert f"`POST {hook.path}`" in text, hook.path
