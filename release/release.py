"""`make release VERSION=x.y.z`: a release from a clean tree, into dist/<version>/.

docs/development.md, "Releases", says what it makes and refuses; in short:

1. Refuses a tree with changes, a version that is not semantic, a version CHANGELOG.md has no entry
   for, and a tag of the version on another commit.
2. Sets the version (hooks/__init__.py, the chart's `version` and `appVersion`) and dates the
   changelog's entry, then commits that as `release <version>` (the subject every release has),
   and tags the commit `v<version>`.
3. Packages the chart (`helm package`, without provenance) beside its sha256; builds the image
   (image/build.sh: its OCI labels say the version, the commit, the source and the commit's time)
   and writes it as an OCI archive (skopeo), whose manifest digest is the image's digest; writes a
   CycloneDX SBOM of the image (syft: the base's Debian packages and the service's Python
   packages) and one of the wheelhouse (cyclonedx-py, from the hashed locks).
4. Prints the image's digest, to pin with the chart's `image.digest`.

Nothing is pushed.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
VERSION_LINE = re.compile(r'^__version__ = "[^"]*"$', re.M)
LOCKS = ("requirements.lock", "requirements-build.lock")


class ReleaseError(Exception):
    """Why no release was made; said in one line."""


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def check(version: str) -> None:
    if not SEMVER.match(version):
        raise ReleaseError(f"{version!r} is not a version MAJOR.MINOR.PATCH")
    if git("status", "--porcelain"):
        raise ReleaseError("the tree has changes: commit or stash them, then release")
    if not changelog_entry(version).search((ROOT / "CHANGELOG.md").read_text()):
        raise ReleaseError(
            f"CHANGELOG.md has no entry for {version}: "
            f"add `## [{version}] - Unreleased` with its changes and upgrade notes"
        )
    tagged = git("tag", "--list", f"v{version}")
    if tagged and git("rev-list", "-n", "1", f"v{version}") != git("rev-parse", "HEAD"):
        raise ReleaseError(f"v{version} already tags another commit")


def release_subject(version: str) -> str:
    """Every release is a commit of this subject (its tag may not travel with a clone)."""
    return f"release {version}"


def latest_release(ref: str = "HEAD") -> tuple[str, str] | None:
    """The newest release in ref's history, as (version, commit); None before the first."""
    listed = git("log", "--format=%H %s", "--extended-regexp", "--grep=^release [0-9]", ref)
    for line in listed.splitlines():
        commit, _, subject = line.partition(" ")
        version = subject.removeprefix(release_subject(""))
        if SEMVER.match(version):
            return version, commit
    return None


def changelog_entry(version: str) -> re.Pattern[str]:
    return re.compile(rf"^## \[{re.escape(version)}\] - (Unreleased|\d{{4}}-\d\d-\d\d)$", re.M)


def set_version(version: str, today: datetime.date) -> None:
    """The version in its one place and the chart, the entry dated; committed and tagged."""
    init = ROOT / "hooks" / "__init__.py"
    init.write_text(VERSION_LINE.sub(f'__version__ = "{version}"', init.read_text(), count=1))
    chart = ROOT / "metacontroller" / "Chart.yaml"
    text = re.sub(r"^version: .*$", f"version: {version}", chart.read_text(), count=1, flags=re.M)
    chart.write_text(
        re.sub(r"^appVersion: .*$", f'appVersion: "{version}"', text, count=1, flags=re.M)
    )
    changelog = ROOT / "CHANGELOG.md"
    changelog.write_text(
        changelog.read_text().replace(
            f"## [{version}] - Unreleased", f"## [{version}] - {today.isoformat()}", 1
        )
    )
    if git("log", "-1", "--format=%s") != release_subject(version):
        git("commit", "--quiet", "--allow-empty", "--all", "--message", release_subject(version))
    if not git("tag", "--list", f"v{version}"):
        git("tag", f"v{version}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def run(*command: str, **env: str) -> None:
    subprocess.run(command, cwd=ROOT, check=True, env={**os.environ, **env})


def oci_archive(tag: str, archive: Path) -> str:
    """The image `tag` of the Docker engine as an OCI archive, its tag the reference's name; the
    manifest's digest, which a registry keeps when the archive is pushed as it is (skopeo)."""
    archive.unlink(missing_ok=True)
    saved = archive.with_name(f"{archive.name}.docker-save")
    run(os.environ.get("DOCKER", "docker"), "save", "--output", str(saved), tag)
    try:
        run(
            "skopeo", "copy", "--quiet", f"docker-archive:{saved}",
            f"oci-archive:{archive}:{tag.rpartition(':')[2]}",
        )  # fmt: skip
    finally:
        saved.unlink()
    with tarfile.open(archive) as layout:
        index = layout.extractfile("index.json")
        assert index is not None
        digest: str = json.load(index)["manifests"][0]["digest"]
    return digest


def build(version: str, base: str, dist: Path) -> str:
    """The release's files in dist; the image's digest."""
    dist.mkdir(parents=True, exist_ok=True)
    run("helm", "package", "metacontroller", "--destination", str(dist))
    chart = dist / f"gpuclass-hooks-{version}.tgz"
    Path(f"{chart}.sha256").write_text(f"{sha256_of(chart)}  {chart.name}\n")

    tag = f"gpuclass-hooks:{version}"
    run("bash", "image/build.sh", base, tag)
    archive = dist / f"gpuclass-hooks-{version}.oci.tar"
    digest = oci_archive(tag, archive)

    # syft would ask the network for a newer syft; file entries would bury the packages.
    run(
        "syft", "scan", f"oci-archive:{archive}", "--quiet",
        "--output", f"cyclonedx-json={dist / f'gpuclass-hooks-{version}.image.cdx.json'}",
        SYFT_CHECK_FOR_APP_UPDATE="false", SYFT_FILE_METADATA_SELECTION="none",
    )  # fmt: skip
    locks = "".join((ROOT / lock).read_text() for lock in LOCKS)
    subprocess.run(
        [
            "cyclonedx-py", "requirements", "--of", "JSON", "--output-reproducible",
            "--output-file", str(dist / f"gpuclass-hooks-{version}.wheelhouse.cdx.json"), "-",
        ],
        input=locks, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    (dist / "image-digest").write_text(f"{digest}\n")
    return digest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--base", required=True, help="the image's PYTHON_IMAGE")
    args = parser.parse_args(argv)
    try:
        check(args.version)
    except ReleaseError as error:
        print(f"release: {error}", file=sys.stderr)
        return 2
    dist = ROOT / "dist" / args.version
    try:
        set_version(args.version, datetime.datetime.now(datetime.UTC).date())
        digest = build(args.version, args.base, dist)
    except subprocess.CalledProcessError as error:
        said = (error.stderr or "").strip().splitlines()
        print(
            f"release: {' '.join(error.cmd[:2])} failed: {said[-1] if said else error.returncode}",
            file=sys.stderr,
        )
        return 1
    print(f"release {args.version}: {dist.relative_to(ROOT)}/ (commit {git('rev-parse', 'HEAD')})")
    print(f"image digest: {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
