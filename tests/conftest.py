from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from hooks.settings import Settings
from tests import profiles  # noqa: F401 - registers the quick profile before it is loaded
from tests.controlplane import ControlPlane, control_plane
from tests.fake_apiserver import FakeApiServer, fake_apiserver


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--image",
        help="the image tests/image checks (`make image-test` builds it and passes its tag)",
    )
    parser.addoption("--image-base", help="the PYTHON_IMAGE the image was built on")
    parser.addoption(
        "--e2e-image", default="gpuclass-hooks:dev", help="the image `make e2e` built (docker)"
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


class RanTooLong(Exception):
    """A test under a mutant ran far past what it took unmutated."""


# mutmut stops a mutant's run only after CPU time, which a test that waits for ever (a mutant that
# never rings an alarm, never sets an event) does not use: such a worker would be lost for the
# rest of the run. A test may take this many times its unmutated duration, plus the margin.
MUTANT_TEST_FACTOR, MUTANT_TEST_MARGIN_SECONDS = 5, 15.0
MUTANT_TEST_LIMIT = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under mutation testing, a test that runs far too long fails, which kills its mutant."""
    limit = item.stash.get(MUTANT_TEST_LIMIT, None)
    if limit is None:
        yield
        return

    def ran_too_long(signum: int, frame: object) -> None:
        raise RanTooLong(f"{item.nodeid} ran past {limit:.0f} s under a mutant")

    previous = signal.signal(signal.SIGALRM, ran_too_long)
    signal.setitimer(signal.ITIMER_REAL, limit, 1.0)  # again each second, until the test ends
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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
    Under mutation testing, the tests run fastest first, each with its time limit."""
    here = Path(__file__).parent
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
    if os.environ.get("MUTANT_UNDER_TEST"):
        durations = measured_durations()
        fastest_first(items, durations)
        for item in items:
            if item.nodeid in durations:
                limit = MUTANT_TEST_FACTOR * durations[item.nodeid] + MUTANT_TEST_MARGIN_SECONDS
                item.stash[MUTANT_TEST_LIMIT] = limit


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
