"""The distribution and the image recipe (no Docker engine here: the Dockerfile is read)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import ROOT


def test_wheel_holds_the_package_and_the_console_script(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",  # no download: the suite must not depend on the network
            "--wheel-dir",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("cozystack_gpuclass_hooks-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hooks/serving/app.py" in names
    assert not any(n.startswith("tests/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "gpuclass-hooks = hooks.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_dockerfile_builds_on_the_base_argument_offline_non_root_with_the_serve_entrypoint() -> (
    None
):
    """tests/image builds and runs the image; this reads the recipe for what a build cannot show:
    where it may reach out, and what the final stage is made of."""
    text = (ROOT / "Dockerfile").read_text()
    assert not text.startswith("# syntax"), "a syntax line makes BuildKit pull a frontend image"
    assert re.search(r"^ARG PYTHON_IMAGE=python:3.11-slim$", text, re.M)
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    build, final = text.split("\nFROM ${PYTHON_IMAGE}\n")
    assert "--no-build-isolation" in build
    assert re.search(r"^USER 10001", final, re.M)
    assert 'ENTRYPOINT ["gpuclass-hooks"]' in final
    assert 'CMD ["serve"]' in final
    assert not re.search(r"apt-get|pip|COPY hooks|/wheels", final)


@pytest.mark.tools
def test_chart_runs_the_image_as_the_dockerfile_user() -> None:
    from tests.chart import one, render

    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["containers"][0]["args"][0] == "serve"


def pins(lock: Path) -> dict[str, str]:
    """Canonical name -> version of every `name==version` line, each of which must carry a
    hash."""
    text = lock.read_text()
    pinned = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n\s+--hash=sha256:", text, re.M))
    assert len(pinned) == len(re.findall(r"^[A-Za-z0-9_.-]+==", text, re.M)), "a pin without hash"
    return {canonicalize_name(name): version for name, version in pinned.items()}


def _declared(extra: str | None = None) -> list[Requirement]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    if extra == "build-system":
        return [Requirement(text) for text in pyproject["build-system"]["requires"]]
    project = pyproject["project"]
    names = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(text) for text in names]


@pytest.mark.parametrize(
    ("lock", "extras"),
    [
        ("requirements.lock", [None]),
        ("requirements-test.lock", [None, "test"]),
        ("requirements-build.lock", ["build-system"]),
    ],
)
def test_locks_pin_every_declared_dependency_within_its_range(
    lock: str, extras: list[str | None]
) -> None:
    pinned = pins(ROOT / lock)
    for extra in extras:
        for requirement in _declared(extra):
            name = canonicalize_name(requirement.name)
            assert name in pinned, f"{lock}: {name} is not pinned"
            assert requirement.specifier.contains(pinned[name]), f"{lock}: {name}=={pinned[name]}"


def test_the_image_and_the_suite_install_from_the_locks() -> None:
    """Every pip step of the build that installs dependencies reads them from the wheelhouse and
    checks each against a lock's hash; only the project's own wheel goes in without."""
    dockerfile = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    steps = [s for s in re.split(r"&&|\n", dockerfile) if re.search(r"pip .*(wheel|install) ", s)]
    dependencies = [s for s in steps if "--no-deps" not in s]
    locks = {m[1] for s in dependencies if (m := re.search(r" -r (\S+)", s))}
    assert locks == {"requirements.lock", "requirements-build.lock"}, steps
    for step in dependencies:
        assert "--require-hashes" in step, step
    for step in steps:
        assert "--no-index" in step, step
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r requirements-test.lock" in makefile
