"""The README is a front door and the docs are the manual: both stay inside the repository and
true to the code."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from hooks.routes import HOOKS
from tests import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
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
    """Every page of docs/ from the README; each entry of the benchmarks' journal from its index."""
    linked = {(ROOT / target).resolve() for target in links(ROOT / "README.md")}
    journal = ROOT / "docs" / "benchmarks"
    assert {p for p in PAGES[1:] if p.parent != journal} <= linked
    indexed = {(journal / target).resolve() for target in links(journal / "README.md")}
    assert {p for p in PAGES[1:] if p.parent == journal and p.name != "README.md"} <= indexed


def test_the_link_check_sees_links() -> None:
    # A check that matched nothing would pass on anything.
    assert "docs/gpuclass.md" in links(ROOT / "README.md")
    assert links(PAGES[1])


def test_every_hook_is_in_the_readme_routes_table() -> None:
    text = (ROOT / "README.md").read_text()
    for hook in HOOKS:
        assert f"`POST {hook.path}`" in text, hook.path


def cited_documents(text: str) -> set[str]:
    """The Markdown documents a source file names (`docs/x.md`, `x.md`), links excepted."""
    return {m for m in re.findall(r"(?<![\w/.:-])[\w./-]+\.md\b", text) if "//" not in m}


def test_every_document_the_code_and_tests_cite_is_in_the_repository() -> None:
    """A reader of the project can follow every citation: no module, test or docstring names a
    document the repository does not hold."""
    held = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("**/*.md") if ".venv" not in p.parts}
    names = {Path(p).name for p in held}
    sources = [
        p
        for folder in ("hooks", "tests", "bench", "fuzz", "mutation")
        for p in (ROOT / folder).rglob("*.py")
        if p != Path(__file__)  # whose examples name documents on purpose
    ]
    missing = sorted(
        f"{source.relative_to(ROOT)}: {cited}"
        for source in sources
        for cited in cited_documents(source.read_text())
        if cited not in held and cited not in names
    )
    assert cited_documents("see budget-admission.md and docs/x.md") == {
        "budget-admission.md",
        "docs/x.md",
    }
    assert missing == []


def test_every_budget_rule_a_test_cites_is_numbered_in_the_docs_and_each_has_its_test() -> None:
    page = (ROOT / "docs" / "gpu-budgets.md").read_text()
    numbered = {int(n) for n in re.findall(r"^(\d+)\. \*\*", page, flags=re.MULTILINE)}
    tests = "\n".join(
        p.read_text() for p in (ROOT / "tests" / "rules" / "budget").glob("test_*.py")
    )
    cited = {
        int(n)
        for name in re.findall(r"^def test_rule_([\d_and]+?)_[a-z]", tests, flags=re.MULTILINE)
        for n in name.split("_and_")
    }
    assert numbered == set(range(1, 8))
    assert cited == numbered


def _resolves(dotted: str) -> bool:
    """A dotted name is a module, or a name inside the longest module it starts with."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


PATH_IN_THE_REPOSITORY = r"(?<![\w/.-])((?:hooks|tests|testenv|bench|mutation|fuzz)/[\w/.-]*\w)"


def test_no_doc_names_a_module_or_file_that_does_not_exist() -> None:
    """Modules move; the pages that name them must move with them (README, docs/, the chart's
    README)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        text = page.read_text()
        for dotted in set(re.findall(r"(?<![\w.-])hooks(?:\.[A-Za-z_]\w*)+", text)):
            if not _resolves(dotted.rstrip(".")):
                missing.append(f"{page.name}: {dotted}")
        paths = re.findall(PATH_IN_THE_REPOSITORY, text)
        for path in set(paths):
            if not (ROOT / path).exists():
                missing.append(f"{page.name}: {path}")
    assert sorted(missing) == []


WORDS_PER_PAGE = 7000


def words(path: Path) -> int:
    return len(path.read_text().split())


def test_a_hoster_sizes_from_short_pages_and_no_page_is_a_notebook() -> None:
    """Sizing in under 1,500 words, today's figures in under 5,000, and no page over 7,000: the
    comparisons that chose each design live in docs/benchmarks/, a file per measurement."""
    assert words(ROOT / "docs" / "sizing.md") <= 1500
    assert words(ROOT / "docs" / "scale.md") <= 5000
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    assert [p.name for p in pages if words(p) > WORDS_PER_PAGE] == []


def test_every_journal_entry_names_its_date_its_commits_and_its_machine() -> None:
    entries = [p for p in (ROOT / "docs" / "benchmarks").glob("*.md") if p.name != "README.md"]
    index = (ROOT / "docs" / "benchmarks" / "README.md").read_text()
    assert entries
    for entry in entries:
        text = entry.read_text()
        assert re.match(r"\d{4}-\d{2}-\d{2}-", entry.name), entry.name
        assert re.search(r"\b[0-9a-f]{7}\b", text) and "machine" in text, entry.name
        assert f"]({entry.name})" in index, entry.name


def decision_bullets() -> list[list[str]]:
    bullets: list[list[str]] = []
    for line in (ROOT / "docs" / "decisions.md").read_text().splitlines():
        if line.startswith("- "):
            bullets.append([line])
        elif line.startswith("  ") and bullets and bullets[-1]:
            bullets[-1].append(line)
        elif bullets and bullets[-1]:
            bullets.append([])
    return [b for b in bullets if b]


def test_no_decision_runs_past_25_lines_or_cites_a_commit_by_its_place() -> None:
    """A reader can follow every commit a decision names: "the parent commit" of nothing they can
    see is a hash."""
    assert [b[0][:60] for b in decision_bullets() if len(b) > 25] == []
    for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        assert "parent commit" not in page.read_text(), page.name


def test_every_module_of_hooks_is_in_the_layout() -> None:
    """A newcomer finds every module in docs/development.md's Layout, by its name."""
    text = (ROOT / "docs" / "development.md").read_text()
    layout = text.split("## Layout", 1)[1].split("```", 2)[1]
    missing = [
        str(module.relative_to(ROOT))
        for module in sorted((ROOT / "hooks").rglob("*.py"))
        if module.name != "__init__.py"
        and not re.search(rf"(?<!\w){re.escape(module.stem)}(?!\w)", layout)
    ]
    assert missing == []
