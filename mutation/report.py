"""The report of `make mutate`: the score over the mutants that change behaviour, and the news.

Reads `mutmut results --all true` on standard input and `mutation/equivalent.txt`, which lists the
survivors judged equivalent (no observable change). mutmut numbers a function's mutants in the
order it makes them, so a number points at another mutation as soon as the function changes; the
list therefore names each survivor by its content: the file, the function and the lines the
mutation changes, on one line, and the reason on the next line, indented after `why:`:

    hooks/rules/license.py::_namespace_of: - return key.partition("/")[0] + return key.rpartition(…
        why: keys are namespace/name, and Kubernetes names hold no "/"

Prints the score (killed / (killed + survivors not listed)), every survivor not listed (the news:
a test to write, or a line to add), and every listed mutation that no longer survives in a function
the run checked (a line to remove). Exits 1 when there is news, so that a run on one file shows it
plainly. `python mutation/report.py --key NAME...` prints the content key of mutants by name.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

EQUIVALENT = Path(__file__).with_name("equivalent.txt")
TARGET = 0.95
WHY = "why:"
CLASS_SEPARATOR = "ǁ"  # mutmut's: xǁClassǁmethod__mutmut_3


def function_of(name: str) -> str:
    """`path.py::function` (or `path.py::Class.method`) of a mutant named by mutmut."""
    mangled = name.partition("__mutmut_")[0]
    module, _, function = mangled.rpartition(".")
    if function.startswith("x" + CLASS_SEPARATOR):
        function = ".".join(function.removeprefix("x" + CLASS_SEPARATOR).split(CLASS_SEPARATOR))
    else:
        function = function.removeprefix("x_")
    return f"{module.replace('.', '/')}.py::{function}"


def content_key(name: str, diff: str) -> str:
    """The file, function and changed lines of a mutant, from its unified diff (`mutmut show`)."""
    changed = [
        f"{line[0]} {line[1:].strip()}"
        for line in diff.splitlines()
        if line[:1] in ("-", "+") and not line.startswith(("---", "+++"))
    ]
    return f"{function_of(name)}: {' '.join(changed)}"


def equivalents(text: str) -> dict[str, str]:
    """Content key -> reason, from equivalent.txt (comment lines start with `#`)."""
    listed: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or line.startswith("#"):
            continue
        if stripped.startswith(WHY) and key is not None:
            listed[key] = stripped.removeprefix(WHY).strip()
        else:
            key = stripped
            listed[key] = ""
    return listed


def statuses(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name:
            found[name] = status
    return found


def report(
    results: str, listed: Mapping[str, str], key_of: Callable[[str], str]
) -> tuple[str, int]:
    """The report of a run; `key_of` gives the content key of a mutant by name."""
    status = statuses(results)
    counts = Counter(status.values())
    # A mutant no test reaches is not killed: it counts as a survivor, news like any other.
    survivors = {
        name: key_of(name) for name, state in status.items() if state in ("survived", "no tests")
    }
    news = sorted(name for name, key in survivors.items() if key not in listed)
    checked = {function_of(name) for name, state in status.items() if state != "not checked"}
    surviving = set(survivors.values())
    stale = sorted(
        key for key in listed if key not in surviving and key.partition(": ")[0] in checked
    )
    killed = counts["killed"] + counts["timeout"]
    judged = killed + len(news)
    score = killed / judged if judged else 1.0
    lines = [
        f"{len(status)} mutants: {killed} killed, {len(survivors)} survived "
        f"({counts['no tests']} reached by no test; {len(survivors) - len(news)} listed as "
        f"equivalent), {counts['not checked']} not checked",
        f"score over mutants that change behaviour: {score:.1%} (target {TARGET:.0%})",
    ]
    lines += [f"NEW SURVIVOR {name}\n    {survivors[name]}" for name in news]
    lines += [
        f"listed but not surviving now, remove from {EQUIVALENT.name}: {key}" for key in stale
    ]
    return "\n".join(lines), 1 if news else 0


def mutmut_key(name: str) -> str:
    """The content key of a mutant of the last run (read from mutmut's `mutants/`)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant  # only where make mutate runs

    return content_key(name, get_diff_for_mutant(name))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--key"]:
        for name in argv[1:]:
            print(mutmut_key(name))
        return 0
    text, code = report(sys.stdin.read(), equivalents(EQUIVALENT.read_text()), mutmut_key)
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
