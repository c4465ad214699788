"""CI's verdict on a test report: every collected test ran and passed, and at least the floor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ROOT

CHECK = ROOT / ".ci" / "check_report.py"


def report(tmp_path: Path, *cases: str) -> Path:
    path = tmp_path / "junit.xml"
    body = "".join(
        f'<testcase classname="tests.m" name="t{i}">{c}</testcase>' for i, c in enumerate(cases)
    )
    path.write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


def verdict(path: Path, floor: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), str(path), str(floor)], capture_output=True, text=True
    )


def test_all_passed_at_the_floor_is_green(tmp_path: Path) -> None:
    result = verdict(report(tmp_path, "", ""), 2)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    "case",
    ['<skipped message="no helm"/>', '<failure message="x"/>', '<error message="x"/>'],
)
def test_one_skipped_or_failed_test_is_red(tmp_path: Path, case: str) -> None:
    result = verdict(report(tmp_path, "", "", case), 2)
    assert result.returncode == 1
    assert "every test must run and pass" in result.stdout


def test_fewer_tests_than_the_floor_is_red(tmp_path: Path) -> None:
    result = verdict(report(tmp_path, ""), 2)
    assert result.returncode == 1
    assert "fewer than the floor" in result.stdout


def test_an_empty_report_is_red(tmp_path: Path) -> None:
    assert verdict(report(tmp_path), 1).returncode == 1


def test_the_floor_is_set_near_the_size_of_the_suite() -> None:
    floor = int((ROOT / ".ci" / "min-tests").read_text())
    assert floor > 600


def test_the_image_floor_is_the_number_of_image_tests() -> None:
    """`make image-test` runs in CI after the suite, with a floor of its own."""
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/image", "--image=any"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert collected.returncode == 0, collected.stdout
    count = sum(1 for line in collected.stdout.splitlines() if "::" in line)
    assert int((ROOT / ".ci" / "min-image-tests").read_text()) == count
    run = (ROOT / ".ci" / "run").read_text()
    assert "make image-test" in run and ".ci/min-image-tests" in run


def test_make_test_leaves_the_image_tests_out() -> None:
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/image"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert "test_image" not in collected.stdout


def collect_e2e(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/e2e"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=environment,
    )


def test_the_e2e_floor_is_the_number_of_cluster_tests() -> None:
    """`make e2e` runs in CI after the image tests, with a floor of its own."""
    collected = collect_e2e({**os.environ, "GPUCLASS_E2E_DIR": "/nonexistent"})
    assert collected.returncode == 0, collected.stdout
    count = sum(1 for line in collected.stdout.splitlines() if "::" in line)
    assert int((ROOT / ".ci" / "min-e2e-tests").read_text()) == count
    run = (ROOT / ".ci" / "run").read_text()
    assert "make e2e" in run and ".ci/min-e2e-tests" in run


def test_make_test_leaves_the_cluster_tests_out() -> None:
    environment = {key: value for key, value in os.environ.items() if key != "GPUCLASS_E2E_DIR"}
    collected = collect_e2e(environment)
    assert "tests/e2e" not in collected.stdout
    assert "deselected" in collected.stdout
