"""The report of `make mutate`: the score over the mutants that change behaviour, and the news.

Reads `mutmut results --all true` on standard input and `mutation/equivalent.txt`, which lists the
survivors judged equivalent (no observable change), one per line with the reason after `#`.
Prints the score (killed / (killed + survivors not listed)), every survivor not listed (the news:
a test to write, or a line to add), and every listed mutant that no longer survives (a line to
remove). Exits 1 when there is news, so that a run on one file shows it plainly.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

EQUIVALENT = Path(__file__).with_name("equivalent.txt")
TARGET = 0.95


def equivalents(text: str) -> dict[str, str]:
    listed = {}
    for line in text.splitlines():
        name, _, reason = line.partition("#")
        if name.strip():
            listed[name.strip()] = reason.strip()
    return listed


def statuses(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name:
            found[name] = status
    return found


def report(results: str, listed: dict[str, str]) -> tuple[str, int]:
    status = statuses(results)
    counts = Counter(status.values())
    survivors = {name for name, state in status.items() if state == "survived"}
    news = sorted(survivors - set(listed))
    stale = sorted(name for name in listed if status.get(name) not in (None, "survived"))
    killed = counts["killed"] + counts["timeout"]
    judged = killed + len(news)
    score = killed / judged if judged else 1.0
    lines = [
        f"{len(status)} mutants: {killed} killed, {len(survivors)} survived "
        f"({len(survivors) - len(news)} listed as equivalent), {counts['not checked']} not checked",
        f"score over mutants that change behaviour: {score:.1%} (target {TARGET:.0%})",
    ]
    lines += [f"NEW SURVIVOR {name}" for name in news]
    lines += [f"listed but killed now, remove from {EQUIVALENT.name}: {name}" for name in stale]
    return "\n".join(lines), 1 if news else 0


def main() -> int:
    text, code = report(sys.stdin.read(), equivalents(EQUIVALENT.read_text()))
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
