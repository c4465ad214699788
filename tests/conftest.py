from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hooks.settings import Settings
from tests import profiles  # noqa: F401 - registers the quick profile before it is loaded
from tests.apiserver import FakeApiServer, fake_apiserver
from tests.controlplane import ControlPlane, control_plane


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--image",
        help="the image tests/image checks (`make image-test` builds it and passes its tag)",
    )
    parser.addoption("--image-base", help="the PYTHON_IMAGE the image was built on")


# The test files whose tests take seconds each (property tests over whole clusters, processes
# forked apart, live servers). mutmut runs a mutant's tests with -x in no fixed order; run these
# last, so that a mutant a unit test kills costs that unit test, not a second of each of these.
SLOW_FILES = (
    "rules/test_budget_invariant.py",
    "test_apart.py",
    "test_plan.py",
    "test_hostile.py",
    "test_memory.py",
    "test_check.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that asks for the control plane needs the tools, however it is declared; tests/image
    runs only when given an image (`make image-test`), never in `make test`. Under mutation
    testing the slow files' tests run after the others."""
    if config.getoption("--image") is None:
        image_tests = Path(__file__).parent / "image"
        left_out = [item for item in items if image_tests in item.path.parents]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if item not in left_out]
    for item in items:
        if "kube" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.tools)
    if os.environ.get("MUTANT_UNDER_TEST"):
        tests = Path(__file__).parent
        slow = {tests / name for name in SLOW_FILES}
        items.sort(key=lambda item: item.path in slow)


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with fake_apiserver() as server:
        yield server


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("sa-token-1\n")
    return path


@pytest.fixture
def settings(apiserver: FakeApiServer, token_file: Path, tmp_path: Path) -> Settings:
    return Settings(
        kube_api=apiserver.url,
        kube_token_file=token_file,
        kube_ca_file=tmp_path / "no-ca.crt",
        kubevirt_cache_seconds=0,
    )


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver, started once per test run (only when a test asks for them)."""
    with control_plane(tmp_path_factory.mktemp("controlplane")) as plane:
        yield plane
