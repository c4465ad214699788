"""Credentials said out loud (`hooks.serving.credentials`): a token file or serving pair that
breaks at run time is logged naming the file and what is wrong (never its content), exported per
kind, and a process that never read it valid is not ready; what the files do meanwhile is what
they always did (no token accepted; the last good pair served)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trustme

from hooks.serving import listeners, server
from hooks.serving.auth import TokenFile
from hooks.serving.credentials import CHECKS_TO_REPORT, CredentialWatch, Watched
from hooks.serving.edge import TlsSource
from hooks.serving.metrics import Metrics
from tests.volumes import MountedVolume, tls_files

SECRET = "s3cr3t-token-value"


def events(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [
        {"event": r.getMessage(), **r.fields}  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage().startswith("credential file")
    ]


def checked(watch: CredentialWatch, times: int = CHECKS_TO_REPORT) -> None:
    for _ in range(times):
        watch.check()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "empty: no token in it"),
        ("\n  \n", "empty: no token in it"),
        (None, "missing"),
        ("tok\x00en\n", "a line holds characters no bearer token has"),
    ],
    ids=["emptied", "blank", "deleted", "garbage"],
)
def test_a_broken_token_file_is_said_at_once_naming_the_file_never_its_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str | None, problem: str
) -> None:
    path = tmp_path / "tokens"
    path.write_text(SECRET + "\n")
    tokens = TokenFile(path)
    watch = CredentialWatch([Watched("token", str(path), tokens.problem)], clock=lambda: 1000.0)
    metrics = Metrics(180.0)
    metrics.watch_credentials(watch)
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        checked(watch)
        if content is None:
            path.unlink()
        else:
            path.write_text(content)
        checked(watch)
    assert events(caplog) == [
        {"event": "credential file valid", "kind": "token", "file": str(path)},
        {
            "event": "credential file invalid",
            "kind": "token",
            "file": str(path),
            "problem": problem,
        },
    ]
    assert SECRET not in caplog.text
    assert not tokens.accepts(f"Bearer {SECRET}")  # what the file does: no token accepted
    scrape = metrics.exposition()[0].decode()
    assert 'cozystack_gpu_hook_credential_valid{kind="token"} 0.0' in scrape
    assert watch.unready() == []  # it was valid once: the process stays ready, the alert fires


def test_the_report_waits_for_a_problem_that_lasts_and_says_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A serving pair caught mid-swap fails to load for a moment: reported only if it lasts
    two checks, and a lasting problem is said once, not at every check."""
    answers = iter([None, "does not load", None, "does not load", "does not load", "x", "x", "x"])
    watch = CredentialWatch([Watched("serving_pair", "/tls.crt", lambda: next(answers))])
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        checked(watch, 8)
    assert [(e["event"], e.get("problem")) for e in events(caplog)] == [
        ("credential file valid", None),
        ("credential file invalid", "does not load"),
        ("credential file invalid", "x"),
    ]


def test_a_process_that_never_read_a_valid_token_is_not_ready_and_says_why(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens"
    path.write_text("")
    state = listeners.ServiceState()
    watch = server.credential_watch(TokenFile(path), None)
    state.unready = watch.unready
    checked(watch)
    readyz = listeners.health_routes(state)["/readyz"]({})
    assert readyz.code == 503
    assert f"the token file {path} has never been valid: empty: no token in it".encode() in (
        readyz.body
    )
    path.write_text(SECRET + "\n")
    checked(watch)
    assert listeners.health_routes(state)["/readyz"]({}).code == 200


def test_a_serving_pair_that_does_not_load_is_said_and_the_last_good_one_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    other = ca.issue_cert("127.0.0.1")
    mounted = MountedVolume(tmp_path / "tls", tls_files(leaf))
    source = TlsSource(mounted.path("tls.crt"), mounted.path("tls.key"))
    first = source.context()
    watch = server.credential_watch(None, source)
    with caplog.at_level(logging.INFO, logger="gpuclass_hooks"):
        checked(watch)
        # another leaf's key beside the certificate: the pair does not match
        mounted.update(
            {
                "tls.crt": leaf.cert_chain_pems[0].bytes(),
                "tls.key": other.private_key_pem.bytes(),
            }
        )
        checked(watch)
    [invalid] = [e for e in events(caplog) if e["event"] == "credential file invalid"]
    assert invalid["kind"] == "serving_pair" and invalid["file"] == str(mounted.path("tls.crt"))
    assert "KEY_VALUES_MISMATCH" in str(invalid["problem"])
    assert source.context() is first  # the last good pair is still served
