"""Bearer authentication of the hook routes and the request body limit."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from hooks.routes import HOOKS
from hooks.serving.app import create_app
from hooks.serving.auth import TokenFile
from hooks.settings import Settings
from tests.builders import example_of, gpuclass, status_sync_request
from tests.volumes import MountedVolume

JSON = "application/json"


@pytest.fixture
def hook_tokens(tmp_path: Path) -> Path:
    path = tmp_path / "hook-tokens"
    path.write_text("first-token\n")
    return path


def client_for(settings: Settings, **update: object) -> FlaskClient:
    return create_app(settings.model_copy(update=update)).test_client()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


BODY = status_sync_request(gpuclass("a"))
METACONTROLLER_HOOKS = [hook.path for hook in HOOKS if hook.needs_token]


def test_only_the_admission_routes_go_without_the_token_and_only_over_https() -> None:
    """The API server sends no bearer token, and calls webhooks over HTTPS only: its routes, and
    only its, are the admission routes under `/admit/`. Any other route declared the API
    server's would be open to anyone."""
    admission = {hook.path for hook in HOOKS if hook.path.startswith("/admit/")}
    assert admission and {hook.path for hook in HOOKS if not hook.needs_token} == admission
    assert {hook.path for hook in HOOKS if hook.https_only} == admission


@pytest.mark.parametrize("route", METACONTROLLER_HOOKS)
def test_every_hook_route_requires_the_token(
    settings: Settings, hook_tokens: Path, route: str
) -> None:
    client = client_for(settings, auth_token_file=hook_tokens)
    body = example_of(route)

    def post(headers: dict[str, str]) -> int:
        return client.post(route, data=body, content_type=JSON, headers=headers).status_code

    missing = client.post(route, data=body, content_type=JSON)
    assert missing.status_code == 401
    assert missing.json == {"error": "missing or invalid bearer token"}
    assert post(bearer("wrong")) == 401
    assert post({"Authorization": "Basic Zmlyc3QtdG9rZW4="}) == 401
    assert post(bearer("first-token")) == 200


def test_token_is_checked_before_the_body_is_read(settings: Settings, hook_tokens: Path) -> None:
    client = client_for(settings, auth_token_file=hook_tokens)
    response = client.post("/status/sync", data=b"{not json at all", headers=bearer("wrong"))
    assert response.status_code == 401
    assert response.headers["Connection"] == "close"


def test_token_rotation_without_restart(settings: Settings, hook_tokens: Path) -> None:
    client = client_for(settings, auth_token_file=hook_tokens)
    assert client.post("/status/sync", json=BODY, headers=bearer("first-token")).status_code == 200
    hook_tokens.write_text("first-token\n  second-token  \n")
    assert client.post("/status/sync", json=BODY, headers=bearer("second-token")).status_code == 200
    assert client.post("/status/sync", json=BODY, headers=bearer("first-token")).status_code == 200
    hook_tokens.write_text("second-token\n")
    assert client.post("/status/sync", json=BODY, headers=bearer("first-token")).status_code == 401


def test_a_same_size_rewrite_in_place_is_picked_up(settings: Settings, hook_tokens: Path) -> None:
    """Same inode, same size: only the modification time tells (a rewrite a moment later)."""
    client = client_for(settings, auth_token_file=hook_tokens)
    assert client.post("/status/sync", json=BODY, headers=bearer("first-token")).status_code == 200
    before = os.stat(hook_tokens)
    with hook_tokens.open("r+") as rewritten:  # in place: the inode stays
        rewritten.write("third-token\n")
    os.utime(hook_tokens, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    after = os.stat(hook_tokens)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    assert client.post("/status/sync", json=BODY, headers=bearer("first-token")).status_code == 401
    assert client.post("/status/sync", json=BODY, headers=bearer("third-token")).status_code == 200


def test_deleting_the_token_file_revokes_every_token(settings: Settings, hook_tokens: Path) -> None:
    client = client_for(settings, auth_token_file=hook_tokens)
    assert client.post("/status/sync", json=BODY, headers=bearer("first-token")).status_code == 200
    hook_tokens.unlink()
    assert client.post("/status/sync", json=BODY, headers=bearer("first-token")).status_code == 401


def test_a_blank_line_in_the_token_file_accepts_no_empty_token(
    settings: Settings, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("first-token\n\n   \n")
    client = client_for(settings, auth_token_file=tokens)
    for header in ("Bearer ", "Bearer", "Bearer    ", "bearer \t"):
        refused = client.post("/status/sync", json=BODY, headers={"Authorization": header})
        assert refused.status_code == 401, header
    assert client.post("/status/sync", json=BODY, headers=bearer("first-token")).status_code == 200


def test_missing_token_file_refuses_everything(settings: Settings, tmp_path: Path) -> None:
    client = client_for(settings, auth_token_file=tmp_path / "absent")
    assert client.post("/status/sync", json=BODY, headers=bearer("")).status_code == 401


def test_the_bearer_scheme_is_case_insensitive(settings: Settings, hook_tokens: Path) -> None:
    # RFC 7235: the scheme is a case-insensitive token; the token itself is compared exactly.
    client = client_for(settings, auth_token_file=hook_tokens)
    for scheme in ("bearer", "BEARER", "BeArEr"):
        headers = {"Authorization": f"{scheme} first-token"}
        assert client.post("/status/sync", json=BODY, headers=headers).status_code == 200
    wrong_case = {"Authorization": "Bearer FIRST-TOKEN"}
    assert client.post("/status/sync", json=BODY, headers=wrong_case).status_code == 401


def test_a_body_exactly_at_the_limit_is_read(settings: Settings) -> None:
    body = json.dumps(BODY).encode()
    client = client_for(settings, max_body_bytes=len(body))
    assert client.post("/status/sync", data=body, content_type=JSON).status_code == 200
    one_more = body + b" "
    assert client.post("/status/sync", data=one_more, content_type=JSON).status_code == 413


def test_bodies_over_the_limit_get_413_without_being_read(settings: Settings) -> None:
    client = client_for(settings, max_body_bytes=2048)
    response = client.post("/status/sync", data=b"x" * 4096, content_type="application/json")
    assert response.status_code == 413
    assert set(response.json) == {"error"}
    assert response.headers["Connection"] == "close"
    assert client.post("/status/sync", json=BODY).status_code == 200


@pytest.mark.parametrize("route", [hook.path for hook in HOOKS])
def test_a_chunked_body_gets_411_on_every_hook_route_unread(settings: Settings, route: str) -> None:
    """Metacontroller and the API server always send Content-Length; a body of undeclared size
    could only be reserved for at the body limit, so it is refused before anything is read."""
    client = client_for(settings, max_body_bytes=2048)
    stream = io.BytesIO(b"x" * 10240)
    response = client.post(
        route,
        input_stream=stream,
        headers={"Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True, "wsgi.url_scheme": "https"},
    )
    assert response.status_code == 411
    assert response.json == {"error": "send Content-Length: hook bodies are read by their length"}
    assert stream.tell() == 0


def test_the_token_file_is_read_again_only_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every call checks the file's identity, size and time; only a change costs a read."""
    path = tmp_path / "tokens"
    path.write_text("first\n")
    reads: list[Path] = []
    read_bytes = Path.read_bytes

    def counted(self: Path) -> bytes:
        reads.append(self)
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", counted)
    tokens = TokenFile(path)
    assert all(tokens.accepts("Bearer first") for _ in range(5))
    assert len(reads) == 1
    path.write_text("second-token\n")
    assert tokens.accepts("Bearer second-token") and not tokens.accepts("Bearer first")
    assert len(reads) == 2


def test_a_token_mounted_from_a_secret_is_seen_when_the_kubelet_updates_the_volume(
    tmp_path: Path,
) -> None:
    """The token file is a link through `..data`, which the kubelet points at a new directory on
    a rotation: the link itself never changes, what it resolves to does. The same class reads
    the metrics port's tokens."""
    volume = MountedVolume(tmp_path / "auth", {"token": b"first-token\n"})
    tokens = TokenFile(volume.path("token"))
    assert tokens.accepts("Bearer first-token")
    volume.update({"token": b"first-token\nsecond-token\n"})
    assert tokens.accepts("Bearer second-token")
    volume.update({"token": b"third-token\n"})
    assert tokens.accepts("Bearer third-token") and not tokens.accepts("Bearer first-token")


def test_a_token_is_everything_after_the_scheme_and_its_space(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("two words\n")
    tokens = TokenFile(path)
    assert tokens.accepts("Bearer two words")
    assert tokens.accepts("Bearer   two words ")  # trimmed, as Metacontroller trims it
    assert not tokens.accepts("Bearer two")
    assert not tokens.accepts("Basic two words")
    assert not tokens.accepts("Bearertwo words")
