"""The distribution and the image recipe (no Docker engine here: the Dockerfile is read)."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

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


def test_chart_runs_the_image_as_the_dockerfile_user() -> None:
    from tests.chart import one, render

    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["containers"][0]["args"][0] == "serve"
