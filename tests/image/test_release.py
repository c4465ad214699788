"""`make release VERSION=0.2.0` in a copy of the checkout, as a maintainer runs it on a clean clone
(docs/development.md, "Releases"): the version set, committed and tagged; the chart package and
its sha256; the image with its OCI labels as an OCI archive whose digest is printed; and two
CycloneDX SBOMs that list every locked package at its locked version (CI's SBOM check)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.utils import canonicalize_name

from tests import ROOT
from tests.live import docker
from tests.repo.test_packaging import pins
from tests.repo.test_release import IDENTITY, committed_copy

VERSION = "0.2.0"
ENTRY = f"## [{VERSION}] - Unreleased\n\n### Added\n\n- The release test's entry.\n\n"
SOURCE = "https://github.com/cozystack/gpuclass-hooks"


@dataclass(frozen=True)
class Released:
    copy: Path
    dist: Path
    stdout: str


def git(copy: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=copy, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Released:
    copy = committed_copy(tmp_path_factory.mktemp("release"))
    # The wheels `make image` fetched: the release builds from them without the network.
    shutil.copytree(ROOT / ".wheelhouse", copy / ".wheelhouse")
    changelog = copy / "CHANGELOG.md"
    text = changelog.read_text()
    first_entry = text.index("\n## [") + 1
    changelog.write_text(text[:first_entry] + ENTRY + text[first_entry:])
    git(copy, "commit", "--quiet", "--all", "-m", f"changelog: {VERSION}")
    done = subprocess.run(
        [
            *(sys.executable, "release/release.py", "--version", VERSION),
            *("--base", pytestconfig.getoption("--image-base")),
        ],
        cwd=copy,
        env={**os.environ, **IDENTITY},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return Released(copy, copy / "dist" / VERSION, done.stdout)


def test_a_release_commits_and_tags_its_version_everywhere_it_is_written(
    released: Released,
) -> None:
    copy = released.copy
    assert git(copy, "log", "-1", "--format=%s") == f"release {VERSION}"
    assert git(copy, "rev-parse", f"v{VERSION}^{{commit}}") == git(copy, "rev-parse", "HEAD")
    assert git(copy, "status", "--porcelain") == ""
    assert f'__version__ = "{VERSION}"' in (copy / "hooks" / "__init__.py").read_text()
    chart = yaml.safe_load((copy / "metacontroller" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION
    dated = re.search(
        rf"^## \[{VERSION}\] - (\d{{4}}-\d\d-\d\d)$", (copy / "CHANGELOG.md").read_text(), re.M
    )
    assert dated is not None


def test_the_chart_package_carries_the_version_and_its_sha256(released: Released) -> None:
    package = released.dist / f"gpuclass-hooks-{VERSION}.tgz"
    digest = hashlib.sha256(package.read_bytes()).hexdigest()
    assert (released.dist / f"{package.name}.sha256").read_text() == f"{digest}  {package.name}\n"
    with tarfile.open(package) as archive:
        names = archive.getnames()
        chart_file = archive.extractfile("gpuclass-hooks/Chart.yaml")
        assert chart_file is not None
        chart = yaml.safe_load(chart_file)
    assert chart["version"] == chart["appVersion"] == VERSION
    assert not [name for name in names if name.endswith(".prov")]


def test_the_image_says_its_version_commit_source_and_the_commits_time(
    released: Released,
) -> None:
    inspected = subprocess.run(
        [docker(), "image", "inspect", f"gpuclass-hooks:{VERSION}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    labels = json.loads(inspected.stdout)[0]["Config"]["Labels"]
    commit_time = git(
        released.copy, "log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ"
    )
    prefix = "org.opencontainers.image."
    assert {key: labels[prefix + key] for key in ("version", "revision", "source", "created")} == {
        "version": VERSION,
        "revision": git(released.copy, "rev-parse", "HEAD"),
        "source": SOURCE,
        "created": commit_time,
    }


def test_the_printed_digest_is_the_oci_archives_manifest(released: Released) -> None:
    with tarfile.open(released.dist / f"gpuclass-hooks-{VERSION}.oci.tar") as archive:
        index_file = archive.extractfile("index.json")
        assert index_file is not None
        (manifest,) = json.load(index_file)["manifests"]
        blob = archive.extractfile(f"blobs/sha256/{manifest['digest'].removeprefix('sha256:')}")
        assert blob is not None
        assert "sha256:" + hashlib.sha256(blob.read()).hexdigest() == manifest["digest"]
    assert f"image digest: {manifest['digest']}\n" in released.stdout
    assert (released.dist / "image-digest").read_text() == f"{manifest['digest']}\n"
    assert manifest["annotations"]["org.opencontainers.image.ref.name"] == VERSION


def locked(*locks: str) -> dict[str, str]:
    """Every package of these locks, by its canonical name, at its locked version."""
    return {name: version for lock in locks for name, version in pins(ROOT / lock).items()}


def python_components(sbom: dict[str, Any]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for component in sbom["components"]:
        if component.get("purl", "").startswith("pkg:pypi/"):
            found.setdefault(canonicalize_name(component["name"]), set()).add(component["version"])
    return found


@pytest.mark.parametrize(
    ("sbom", "locks"),
    [
        ("image", ("requirements.lock",)),
        ("wheelhouse", ("requirements.lock", "requirements-build.lock")),
    ],
)
def test_each_sbom_lists_every_locked_package_at_its_locked_version(
    released: Released, sbom: str, locks: tuple[str, ...]
) -> None:
    document = json.loads((released.dist / f"gpuclass-hooks-{VERSION}.{sbom}.cdx.json").read_text())
    assert document["bomFormat"] == "CycloneDX"
    listed = python_components(document)
    assert {name: {version} for name, version in locked(*locks).items()} == {
        name: listed.get(name) for name in locked(*locks)
    }


def test_the_image_sbom_lists_the_bases_debian_packages_and_the_service(released: Released) -> None:
    document = json.loads((released.dist / f"gpuclass-hooks-{VERSION}.image.cdx.json").read_text())
    purls = [component.get("purl", "") for component in document["components"]]
    assert any(purl.startswith("pkg:deb/debian/python3") for purl in purls)
    assert python_components(document)["cozystack-gpuclass-hooks"] == {VERSION}
