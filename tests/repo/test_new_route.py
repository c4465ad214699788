"""Adding a route touches only the files docs/development.md's recipe names: a route with a trivial
handler, added in a copy of the checkout the way the recipe says (its `Hook` at the end of the
table, its example request, its row in the README's routes table), passes the quick tier there.
A test that kept its own copy of the table, or counted routes, fails it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mutation.bugs import scratch_copy
from tests import ROOT, cozystack

ROUTE = "/example-widgets/sync"
HANDLER = """

def example_widgets_sync(inputs: HookInputs, body: bytes) -> Answer:
    return Answer(encode(CompositeSyncResponse(status={}, children=[])), {})
"""
README_ROW = f'| `POST {ROUTE}` | Metacontroller | `{{"status": {{}}, "children": []}}` |\n'


def add_route(copy: Path) -> None:
    """The recipe's steps for a route whose handler needs no rules, wire types or controller."""
    routes = copy / "hooks" / "routes.py"
    text = routes.read_text()
    handlers_end = text.index("\n\n# A new route goes at the end")
    entry = f'    Hook("{ROUTE}", "metacontroller", example_widgets_sync, COMPOSITE_SYNCED),\n'
    table_end = text.index("\n)\n", handlers_end) + 1
    routes.write_text(
        text[:handlers_end] + HANDLER + text[handlers_end:table_end] + entry + text[table_end:]
    )
    (copy / "examples" / "example-widgets-sync.json").write_bytes(
        (copy / "examples" / "status-sync.json").read_bytes()
    )
    readme = copy / "README.md"
    lines = readme.read_text().splitlines(keepends=True)
    last_row = max(i for i, line in enumerate(lines) if line.startswith("| `POST /"))
    lines.insert(last_row + 1, README_ROW)
    readme.write_text("".join(lines))


@pytest.mark.live
def test_a_new_route_passes_the_quick_tier_touching_only_the_files_the_recipe_names(
    tmp_path: Path,
) -> None:
    copy = scratch_copy(tmp_path)
    add_route(copy)
    changed = subprocess.run(
        ["git", "status", "--porcelain"], cwd=copy, capture_output=True, text=True, check=True
    ).stdout
    touched = {line[3:] for line in changed.splitlines()}
    assert touched <= {"hooks/routes.py", "examples/example-widgets-sync.json", "README.md"}
    recipe = (ROOT / "docs" / "development.md").read_text()
    for named in ("hooks/routes.py", "examples/", "README"):
        assert named in recipe, named
    here = "tests/repo/test_new_route.py"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-m",
            "not tools and not live",
            "--hypothesis-profile=quick",
            f"--deselect={here}",
        ],
        cwd=copy,
        env={**os.environ, cozystack.ARCHIVE_VARIABLE: str(cozystack.archive())},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-3000:]
