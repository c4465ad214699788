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

ROOT = Path(__file__).parent.parent


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
    assert "hooks/app.py" in names
    assert not any(n.startswith("tests/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "gpuclass-hooks = hooks.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_dockerfile_is_multi_stage_slim_non_root_with_the_serve_entrypoint() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert len(stages) == 2
    assert all(s.startswith("python:3.11-slim") for s in stages)
    final = text[text.rindex("\nFROM ") :]
    assert re.search(r"^USER 10001", final, re.M)
    assert 'ENTRYPOINT ["gpuclass-hooks"]' in final
    assert 'CMD ["serve"]' in final
    assert "--no-cache-dir" in final
    assert not re.search(r"apt-get|gcc|build-essential|COPY hooks", final)


@pytest.mark.tools
def test_chart_runs_the_image_as_the_dockerfile_user() -> None:
    from tests.chart import one, render

    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["containers"][0]["args"][0] == "serve"


def _pins(lock: Path) -> dict[str, str]:
    """name -> version of every `name==version` line, each of which must carry a hash."""
    text = lock.read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n\s+--hash=sha256:", text, re.M))
    assert len(pins) == len(re.findall(r"^[A-Za-z0-9_.-]+==", text, re.M)), "a pin without hash"
    return {name.lower().replace("_", "-"): version for name, version in pins.items()}


def _declared(extra: str | None = None) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(text) for text in names]


@pytest.mark.parametrize(
    ("lock", "extras"),
    [("requirements.lock", [None]), ("requirements-test.lock", [None, "test"])],
)
def test_locks_pin_every_declared_dependency_within_its_range(
    lock: str, extras: list[str | None]
) -> None:
    pins = _pins(ROOT / lock)
    for extra in extras:
        for requirement in _declared(extra):
            name = requirement.name.lower().replace("_", "-")
            assert name in pins, f"{lock}: {name} is not pinned"
            assert requirement.specifier.contains(pins[name]), f"{lock}: {name}=={pins[name]}"


def test_the_image_and_the_suite_install_from_the_locks() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    installs = [
        line for line in dockerfile.splitlines() if re.match(r"RUN .*pip (wheel|install)", line)
    ]
    dependencies = [line for line in installs if "--no-deps" not in line.split("&&")[0]]
    assert dependencies, "the Dockerfile installs no dependencies"
    for line in dependencies:
        step = line.split("&&")[0]
        assert "--require-hashes" in step and re.search(r"-r /?requirements\.lock", step), step
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r requirements-test.lock" in makefile
