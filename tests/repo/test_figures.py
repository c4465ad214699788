"""Measured figures live in docs/scale.md and its journal, docs/benchmarks/ (and the README's
headline): a size or a timing in a code comment, a docstring or a comment of the chart's values
that neither states is a figure that will drift from the next measurement."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import ROOT

SCALE = ROOT / "docs" / "scale.md"
# A number with a unit of size or time: "540 MB", "~75 MB", "1.5 GB", "30-50 MB", "60 s", "3 ms".
FIGURE = re.compile(
    r"(?<![\w.])~?(\d[\d,]*(?:\.\d+)?(?:\s*-\s*\d[\d,]*(?:\.\d+)?)?)\s*"
    r"(KB|MB|GB|KiB|MiB|GiB|ms|s|seconds|minutes)\b"
)


def figures(text: str) -> Iterator[str]:
    """Each size or timing in a text, as `<number> <unit>` without `~` or thousands commas."""
    for match in FIGURE.finditer(text):
        number = re.sub(r"\s*-\s*", "-", match.group(1).replace(",", ""))
        yield f"{number} {match.group(2)}"


def python_prose(path: Path) -> Iterator[tuple[int, str]]:
    """Comments and docstrings of a Python file, with their line numbers."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring and node.body:
                yield node.body[0].lineno, docstring


def yaml_comments(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if "#" in line:
            yield number, line[line.index("#") :]


def prose() -> Iterator[tuple[str, int, str]]:
    for folder in ("hooks", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, text in python_prose(path):
                yield str(path.relative_to(ROOT)), line, text
    values = ROOT / "metacontroller" / "values.yaml"
    for line, text in yaml_comments(values):
        yield str(values.relative_to(ROOT)), line, text


def stated_in_scale() -> set[str]:
    pages = [SCALE, *sorted((ROOT / "docs" / "benchmarks").glob("*.md"))]
    return {figure for page in pages for figure in figures(page.read_text())}


def test_figures_are_found_with_or_without_decorations() -> None:
    text = "about ~540 MB, 1,061 MB at the peak, 30-50 MB each, 60 s; not v3.22.0s or 2x"
    assert list(figures(text)) == ["540 MB", "1061 MB", "30-50 MB", "60 s"]


def test_no_figure_in_code_or_values_comments_that_docs_scale_does_not_state() -> None:
    stated = stated_in_scale()
    unstated = [
        f"{where}:{line}: {figure}"
        for where, line, text in prose()
        for figure in figures(text)
        if figure not in stated
    ]
    assert unstated == [], (
        "state these in docs/scale.md (or docs/benchmarks/) or remove them:\n" + "\n".join(unstated)
    )


@pytest.mark.parametrize("figure", ["540 MB", "75 MB"])
def test_the_figures_that_drifted_are_gone(figure: str) -> None:
    """The L cluster's old size and the old idle memory, once copied into comments."""
    assert all(figure not in list(figures(text)) for _, _, text in prose())
