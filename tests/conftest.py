from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from hooks.serving.app import create_app
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from tests import profiles  # noqa: F401 - registers the quick profile before it is loaded
from tests.controlplane import ControlPlane, control_plane
from tests.fake_apiserver import FakeApiServer, fake_apiserver

HERE = Path(__file__).parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--image",
        help="the image tests/image checks (`make image-test` builds it and passes its tag)",
    )
    parser.addoption("--image-base", help="the PYTHON_IMAGE the image was built on")
    parser.addoption(
        "--e2e-image", default="gpuclass-hooks:dev", help="the image `make e2e` built (docker)"
    )
    parser.addoption(
        "--e2e-previous",
        help="where `make e2e` built the previous release (python -m release.previous --into)",
    )


def measured_durations() -> dict[str, float]:
    """The duration of each test as mutmut measured it unmutated, in the directory it runs the
    tests from; empty anywhere else."""
    try:
        durations: dict[str, float] = json.loads(Path("mutmut-stats.json").read_text())[
            "duration_by_test"
        ]
    except (OSError, ValueError, KeyError):
        return {}
    return durations


def fastest_first(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Under mutation testing, the fastest tests first. mutmut runs a mutant's tests with -x in no
    fixed order, so a mutant that a unit test kills would otherwise also pay for seconds of
    property tests and forked processes."""
    items.sort(key=lambda item: durations.get(item.nodeid, 0.0))


# A test that hangs fails, named, at its tier's limit (pytest-timeout), instead of holding the
# run until CI's own limit: generous for each tier, since a busy machine is slow, never stuck.
TIER_TIMEOUT_SECONDS = {"unit": 300, "live": 600, "tools": 900, "image": 900, "e2e": 1800}
# mutmut stops a mutant's run only after CPU time, which a test that waits for ever (a mutant that
# never rings an alarm, never sets an event) does not use: under mutation testing a test may take
# this many times its unmutated duration, plus the margin, and then fails, killing its mutant.
MUTANT_TEST_FACTOR, MUTANT_TEST_MARGIN_SECONDS = 5, 15.0


def tier_of(item: pytest.Item) -> str:
    folder = item.path.relative_to(HERE).parts[0] if item.path.is_relative_to(HERE) else ""
    for tier in ("e2e", "image", "tools", "live"):
        if tier == folder or item.get_closest_marker(tier):
            return tier
    return "unit"


# The slow tiers, by folder: `make unit` leaves them out. A test that starts the real server
# elsewhere (the chart's `helm test`, Prometheus on the dashboard) says so itself.
TIERS = {
    "serving/live": (pytest.mark.live,),
    "chart": (pytest.mark.tools,),
    "apiserver": (pytest.mark.tools,),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that asks for the control plane needs the tools, however it is declared; tests/image
    runs only when given an image (`make image-test`), tests/e2e only inside the cluster
    testenv/cluster.py boots (`make e2e`, which sets GPUCLASS_E2E_DIR), neither in `make test`.
    Every test gets its tier's time limit; under mutation testing, the tests run fastest first,
    each limited by its unmutated duration."""
    here = HERE
    for folder, runs in (
        ("image", config.getoption("--image") is not None),
        ("e2e", bool(os.environ.get("GPUCLASS_E2E_DIR"))),
    ):
        left_out = [item for item in items if here / folder in item.path.parents]
        if left_out and not runs:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if item not in left_out]
    for item in items:
        folder = item.path.parent.relative_to(here).as_posix()
        for tier in TIERS.get(folder, ()):
            item.add_marker(tier)
        if "kube" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.tools)
    durations: dict[str, float] = {}
    if os.environ.get("MUTANT_UNDER_TEST"):
        durations = measured_durations()
        fastest_first(items, durations)
    for item in items:
        if item.get_closest_marker("timeout"):
            continue  # a test that sets its own
        if item.nodeid in durations:
            limit = MUTANT_TEST_FACTOR * durations[item.nodeid] + MUTANT_TEST_MARGIN_SECONDS
        else:
            limit = TIER_TIMEOUT_SECONDS[tier_of(item)]
        item.add_marker(pytest.mark.timeout(limit))


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
        admission_cache_seconds=0,
    )


@pytest.fixture
def client(settings: Settings) -> FlaskClient:
    """The hooks' app for the test's settings, through Flask's test client."""
    return create_app(settings).test_client()


@pytest.fixture
def metered_client(settings: Settings, metrics: Metrics) -> FlaskClient:
    """The same, recording into the test module's `metrics` (each module's has its own clock)."""
    return create_app(settings, metrics=metrics).test_client()


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver, started once per test run (only when a test asks for them)."""
    with control_plane(tmp_path_factory.mktemp("controlplane")) as plane:
        yield plane
