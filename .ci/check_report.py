"""Fail CI unless every collected test ran and passed, and at least the floor of tests ran.

pytest exits 0 when tests are skipped, and a whole module can be skipped (a missing tool, an
import guarded by `importorskip`) while the summary still says "passed".
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree


def main(report: str, floor: str) -> int:
    suites = ElementTree.parse(report).getroot()
    cases = list(suites.iter("testcase"))
    skipped = [c for c in cases if c.find("skipped") is not None]
    failed = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    ran = len(cases) - len(skipped)
    for case in skipped:
        reason = case.find("skipped")
        message = reason.get("message", "") if reason is not None else ""
        print(f"CI: skipped {case.get('classname')}::{case.get('name')}: {message}")
    if skipped or failed:
        print(f"CI: {len(skipped)} skipped, {len(failed)} failed: every test must run and pass")
        return 1
    if ran < int(floor):
        print(f"CI: {ran} tests ran, fewer than the floor of {floor} in .ci/min-tests")
        return 1
    print(f"CI: {ran} tests ran and passed (floor {floor})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
