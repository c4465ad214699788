"""The image, built from the repository (`make image-test` builds it and passes `--image`), run as
the chart runs the pod: read-only, non-root, no capabilities, a memory limit. It must answer like
the service run from the venv, and its build must refuse a wheel that is not the one locked."""

from __future__ import annotations

import errno
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import trustme

from hooks.routes import HOOKS
from tests import cozystack
from tests.controlplane import ADMIN_TOKEN, ControlPlane
from tests.live import LiveServer, docker, live_server

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples"
MANIFESTS = ROOT / "tests" / "manifests"
# RFC 3339 times in answers (conditions' transition times, the time of a sync) differ by the
# moment each service answered.
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")
# The drain delay the tests run with (GPUCLASS_SHUTDOWN_DELAY_SECONDS), and the few seconds the
# worker may take after it to finish.
DRAIN_SECONDS = 2
EXIT_GRACE_SECONDS = 5


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> str:
    tag: str = request.config.getoption("--image")
    inspected = subprocess.run([docker(), "image", "inspect", tag], capture_output=True, timeout=60)
    assert inspected.returncode == 0, f"no image {tag}: `make image-test` builds it"
    return tag


@pytest.fixture(scope="module")
def service_files(tmp_path_factory: pytest.TempPathFactory, kube: ControlPlane) -> dict[str, str]:
    """Settings shared by the image and the venv service: HTTPS with a throwaway certificate, the
    bearer token, and the loopback API server the admission reviews read."""
    directory = tmp_path_factory.mktemp("image-service")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(directory / "ca.crt"))
    server.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
    server.private_key_pem.write_to_path(str(directory / "tls.key"))
    (directory / "accepted-tokens").write_text("hook-token\n")
    (directory / "kube-token").write_text(ADMIN_TOKEN)
    kube.apply(*cozystack.app_crds())
    return {
        "GPUCLASS_TLS_CERT_FILE": str(directory / "tls.crt"),
        "GPUCLASS_TLS_KEY_FILE": str(directory / "tls.key"),
        "GPUCLASS_AUTH_TOKEN_FILE": str(directory / "accepted-tokens"),
        "GPUCLASS_KUBE_API": kube.url,
        "GPUCLASS_KUBE_TOKEN_FILE": str(directory / "kube-token"),
        "GPUCLASS_KUBE_CA_FILE": str(kube.ca_file),
        "GPUCLASS_SHUTDOWN_DELAY_SECONDS": str(DRAIN_SECONDS),
    }


@pytest.fixture(scope="module")
def from_image(
    image: str, service_files: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    directory = tmp_path_factory.mktemp("from-image")
    with live_server(service_files, directory, scheme="https", image=image) as server:
        yield server


def ca_of(files: dict[str, str]) -> str:
    return str(Path(files["GPUCLASS_TLS_CERT_FILE"]).parent / "ca.crt")


def answers(server: LiveServer, files: dict[str, str]) -> dict[str, tuple[int, Any]]:
    """Every example request, posted to its route with the token: status and body, times aside."""
    found = {}
    for hook in HOOKS:
        example = EXAMPLES / f"{hook.path.strip('/').replace('/', '-')}.json"
        base = server.admission if hook.caller == "apiserver" else server.url
        response = requests.post(
            base + hook.path,
            data=example.read_bytes(),
            headers={"Authorization": "Bearer hook-token", "Content-Type": "application/json"},
            verify=ca_of(files),
            timeout=30,
        )
        found[hook.path] = (
            response.status_code,
            json.loads(TIMESTAMP.sub("<time>", response.text)),
        )
    return found


def test_image_answers_every_example_as_the_service_from_the_venv(
    from_image: LiveServer, service_files: dict[str, str], tmp_path: Path
) -> None:
    # named as tests.builders.example_of names them (a route's own dashes make the name one way)
    assert {h.path.strip("/").replace("/", "-") + ".json" for h in HOOKS} == {
        p.name for p in EXAMPLES.glob("*.json")
    }, "an example request per hook"
    with live_server(service_files, tmp_path, scheme="https") as from_venv:
        expected = answers(from_venv, service_files)
    found = answers(from_image, service_files)
    assert found == expected
    assert {code for code, _ in found.values()} == {200}
    reviews = [body for path, (_, body) in found.items() if path.startswith("/admit/")]
    assert reviews and all(r["kind"] == "AdmissionReview" for r in reviews)
    without_token = requests.post(
        from_image.url + "/status/customize",
        data=(EXAMPLES / "status-customize.json").read_bytes(),
        verify=ca_of(service_files),
        timeout=10,
    )
    assert without_token.status_code == 401


def test_image_serves_probes_and_metrics(
    from_image: LiveServer, service_files: dict[str, str]
) -> None:
    assert requests.get(f"{from_image.health}/healthz", timeout=5).status_code == 200
    assert requests.get(f"{from_image.health}/readyz", timeout=5).status_code == 200
    scraped = requests.get(f"{from_image.metrics}/metrics", verify=ca_of(service_files), timeout=5)
    assert scraped.status_code == 200
    assert "# TYPE cozystack_gpu_class_capacity_units gauge" in scraped.text


def test_image_runs_every_process_as_a_non_root_user(from_image: LiveServer) -> None:
    assert from_image.container
    listed = subprocess.run(
        [docker(), "top", from_image.container, "-eo", "pid,uid,args"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.splitlines()[1:]
    # gunicorn's arbiter, its worker, the fork server and multiprocessing's resource tracker
    assert len(listed) >= 4, listed
    assert all(line.split()[1] == "10001" for line in listed), listed


def test_image_root_filesystem_is_not_writable(from_image: LiveServer) -> None:
    assert from_image.container
    probe = (
        "import errno, sys\n"
        "codes = []\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        open(path, 'w')\n"
        "        codes.append(0)\n"
        "    except OSError as error:\n"
        "        codes.append(error.errno)\n"
        "print(*codes)\n"
    )
    paths = ["/probe", "/opt/hooks/probe", "/opt/hooks/bin/gpuclass-hooks", "/tmp/probe"]
    result = subprocess.run(
        [docker(), "exec", from_image.container, "python3", "-c", probe, *paths],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    codes = [int(code) for code in result.stdout.split()]
    assert codes == [errno.EROFS, errno.EROFS, errno.EROFS, 0]  # only the tmpfs takes writes


def test_image_plan_prints_what_the_venv_prints(image: str) -> None:
    arguments = ["plan", "-o", "json", "/examples/cluster.yaml"]
    in_image = subprocess.run(
        [
            *(docker(), "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL"),
            *("--volume", f"{EXAMPLES}:/examples:ro", image, *arguments),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    in_venv = subprocess.run(
        [sys.executable, "-m", "hooks.cli", *arguments[:-1], str(EXAMPLES / "cluster.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert in_image.returncode == in_venv.returncode == 0, in_image.stderr
    assert json.loads(TIMESTAMP.sub("<time>", in_image.stdout)) == json.loads(
        TIMESTAMP.sub("<time>", in_venv.stdout)
    )


def test_image_exits_0_on_sigterm_after_the_drain_delay(
    image: str, service_files: dict[str, str], tmp_path: Path
) -> None:
    with live_server(service_files, tmp_path, scheme="https", image=image) as server:
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)  # `docker run` hands it to the container
        code = server.process.wait(timeout=DRAIN_SECONDS + EXIT_GRACE_SECONDS + 10)
        took = time.monotonic() - started
    assert code == 0, server.logs()
    assert DRAIN_SECONDS <= took <= DRAIN_SECONDS + EXIT_GRACE_SECONDS


# --- the build -------------------------------------------------------------------------------


def build_context(tmp_path: Path) -> tuple[Path, str]:
    """A copy of what the build reads, with the wheelhouse `make image` filled for this base."""
    [wheels] = [p for p in (ROOT / ".wheelhouse").iterdir() if p.is_dir()]
    context = tmp_path / "context"
    context.mkdir()
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, context / name)
    for name in ("requirements.lock", "requirements-build.lock"):
        shutil.copy(ROOT / name, context / name)
    shutil.copytree(ROOT / "hooks", context / "hooks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(wheels, context / ".wheelhouse" / wheels.name)
    return context, wheels.name


def build(context: Path, wheels: str, base: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(docker(), "build", "--network", "none", "--no-cache", "--progress", "plain"),
            *("--build-arg", f"PYTHON_IMAGE={base}", "--build-arg", f"WHEELS={wheels}"),
            *("--tag", "gpuclass-hooks:tampered", str(context)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin:/usr/local/bin"},
    )


@pytest.mark.parametrize("tampered", ["wheel", "hash"])
def test_build_refuses_a_wheel_that_is_not_the_locked_one(
    request: pytest.FixtureRequest, image: str, tampered: str, tmp_path: Path
) -> None:
    context, wheels = build_context(tmp_path)
    wheel = sorted((context / ".wheelhouse" / wheels).glob("requests-*.whl"))[0]
    if tampered == "wheel":
        with wheel.open("ab") as opened:
            opened.write(b"\0")
    else:
        lock = context / "requirements.lock"
        text = lock.read_text()
        pinned = re.search(r"^requests==\S+ \\\n(\s+--hash=sha256:[0-9a-f]{64}.*\n)+", text, re.M)
        assert pinned
        lock.write_text(text.replace(pinned[0], re.sub("[0-9a-f]{64}", "0" * 64, pinned[0])))
    result = build(context, wheels, request.config.getoption("--image-base"))
    assert result.returncode != 0
    assert "DO NOT MATCH THE HASHES" in result.stdout + result.stderr
