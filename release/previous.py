"""The previous release, built for `make e2e`'s upgrade scenario (docs/cluster.md).

    python -m release.previous --base PYTHON_IMAGE --into DIR

The newest release in HEAD's history (the commit `make release` made), checked out into DIR/tree;
its image built there by its own image/build.sh as `gpuclass-hooks:<version>`, from this
checkout's wheelhouse when it holds the wheels; DIR/release.json says which release, which image
and where its chart is. It runs before the cluster's network namespace is entered: a wheel the
wheelhouse lacks is fetched as `make image` fetches it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from release.release import ROOT, latest_release


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the image's PYTHON_IMAGE")
    parser.add_argument("--into", required=True, type=Path)
    args = parser.parse_args(argv)
    found = latest_release()
    if found is None:
        print("release.previous: no release in HEAD's history (make release)", file=sys.stderr)
        return 2
    version, commit = found
    tree = args.into / "tree"
    shutil.rmtree(args.into, ignore_errors=True)
    args.into.mkdir(parents=True)
    subprocess.run(
        ["git", "clone", "--quiet", "--shared", "--no-checkout", str(ROOT), str(tree)], check=True
    )
    subprocess.run(["git", "-C", str(tree), "checkout", "--quiet", commit], check=True)
    if (ROOT / ".wheelhouse").is_dir():
        shutil.copytree(ROOT / ".wheelhouse", tree / ".wheelhouse")
    image = f"gpuclass-hooks:{version}"
    subprocess.run(
        ["bash", "image/build.sh", args.base, image],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    described = {"version": version, "commit": commit, "image": image}
    (args.into / "release.json").write_text(
        json.dumps({**described, "chart": str(tree / "metacontroller")}, indent=2) + "\n"
    )
    print(f"the previous release: {version} ({commit[:12]}), image {image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
