"""The Settings object: what it reads from the environment, what it refuses and how it says so,
and what it derives. A bad setting must stop the service at start with one line naming the
variable, never half-start it; test_settings_sources.py checks that the docs and chart agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from hooks.settings import (
    Settings,
    describe_error,
    go_duration_seconds,
    readme_with_table,
    setting,
    settings_table,
)
from hooks.wire.metacontroller import LabelSelector, Requirement


def refusal(**values: Any) -> str:
    """The one line a service refusing these settings prints."""
    with pytest.raises(ValidationError) as refused:
        Settings(**values)
    return describe_error(refused.value)


# --- the environment -----------------------------------------------------------------------------


def test_settings_are_read_from_gpuclass_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCLASS_KUBEVIRT_NAMESPACE", "kubevirt")
    monkeypatch.setenv("GPUCLASS_ENABLED", "false")
    monkeypatch.setenv("GPUCLASS_HOOK_TIMEOUT", "1m")
    monkeypatch.setenv("KUBEVIRT_NAME", "not-ours")  # another prefix is not read
    settings = Settings()
    assert (settings.kubevirt_namespace, settings.enabled, settings.hook_timeout_seconds) == (
        "kubevirt",
        False,
        60.0,
    )
    assert settings.kubevirt_name == "kubevirt"


def test_an_unknown_gpuclass_variable_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCLASS_NO_SUCH_SETTING", "1")
    assert Settings() == Settings(_env_file=None)


def test_settings_cannot_change_once_read() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.enabled = False  # type: ignore[misc]


def test_license_namespaces_are_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCLASS_LICENSE_NAMESPACES", " gpu-a, ,gpu-b,,")
    settings = Settings()
    assert settings.license_namespaces == ("gpu-a", "gpu-b")


def test_license_namespaces_default_to_the_gpu_operators() -> None:
    assert Settings().license_namespaces == ("cozy-gpu-operator",)


# --- what is refused, and how it reads ------------------------------------------------------------


def test_a_refusal_names_the_variable_and_the_rule() -> None:
    assert refusal(kube_timeout_seconds=0) == (
        "invalid setting GPUCLASS_KUBE_TIMEOUT_SECONDS: Input should be greater than 0"
    )


def test_a_refusal_of_a_rule_of_ours_drops_pydantics_prefix() -> None:
    assert refusal(kube_api="ftp://api") == (
        "invalid setting GPUCLASS_KUBE_API: must be an http:// or https:// URL"
    )


def test_a_refusal_of_settings_together_names_no_one_variable() -> None:
    assert refusal(tls_cert_file=Path("/tls/tls.crt")) == (
        "invalid settings: GPUCLASS_TLS_CERT_FILE and GPUCLASS_TLS_KEY_FILE go together"
    )


def test_the_tls_key_without_its_certificate_is_refused() -> None:
    assert "go together" in refusal(tls_key_file=Path("/tls/tls.key"))


def test_a_client_ca_needs_the_servers_certificate() -> None:
    assert refusal(tls_client_ca_file=Path("/tls/ca.crt")) == (
        "invalid settings: GPUCLASS_TLS_CLIENT_CA_FILE needs GPUCLASS_TLS_CERT_FILE"
    )
    Settings(
        tls_cert_file=Path("/tls/tls.crt"),
        tls_key_file=Path("/tls/tls.key"),
        tls_client_ca_file=Path("/tls/ca.crt"),
    )


@pytest.mark.parametrize("field", ["node_selector", "pod_selector"])
def test_a_selector_that_does_not_parse_is_refused(field: str) -> None:
    assert refusal(**{field: "a=b,,"}) == (
        f"invalid setting GPUCLASS_{field.upper()}: cannot parse selector at ','"
    )


def test_selectors_are_parsed_into_label_selectors() -> None:
    settings = Settings(node_selector="gpu=yes", pod_selector="!spot")
    assert settings.node_label_selector == LabelSelector(match_labels={"gpu": "yes"})
    assert settings.pod_label_selector == LabelSelector(
        match_expressions=[Requirement(key="spot", operator="DoesNotExist")]
    )
    assert Settings().node_label_selector is None
    assert Settings().pod_label_selector is None


def test_the_hook_timeout_is_a_go_duration() -> None:
    assert refusal(hook_timeout="30") == (
        "invalid setting GPUCLASS_HOOK_TIMEOUT: must be a Go duration such as 30s or 1m30s"
    )
    assert Settings(hook_timeout="1m30s").hook_timeout_seconds == 90.0


def test_the_api_server_url_loses_its_trailing_slashes() -> None:
    assert Settings(kube_api="https://api:6443//").kube_api == "https://api:6443"
    assert Settings(kube_api="http://127.0.0.1:8001").kube_api == "http://127.0.0.1:8001"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "at least one namespace is required"),
        (",", "at least one namespace is required"),
        ("gpu,Bad_Namespace", "'Bad_Namespace' is not a namespace name"),
        ("a" * 64, f"'{'a' * 64}' is not a namespace name"),
    ],
)
def test_license_namespaces_must_be_namespace_names(value: str, message: str) -> None:
    assert refusal(license_namespaces=value) == (
        f"invalid setting GPUCLASS_LICENSE_NAMESPACES: {message}"
    )


# Each bound as the docs and the chart promise it: the value at the bound is taken, the first one
# past it is refused (pydantic's words name the bound, so a moved bound reads differently).
BOUNDS = [
    ("kube_timeout_seconds", 30, 30.5, "less than or equal to 30"),
    ("kube_timeout_seconds", 0.001, 0, "greater than 0"),
    ("kubevirt_cache_seconds", 60, 60.5, "less than or equal to 60"),
    ("kubevirt_cache_seconds", 0, -0.5, "greater than or equal to 0"),
    ("shutdown_delay_seconds", 60, 60.5, "less than or equal to 60"),
    ("shutdown_delay_seconds", 0, -0.5, "greater than or equal to 0"),
    ("admission_cache_seconds", 60, 60.5, "less than or equal to 60"),
    ("admission_cache_seconds", 0, -0.5, "greater than or equal to 0"),
    ("memory_wait_seconds", 60, 60.5, "less than or equal to 60"),
    ("memory_wait_seconds", 0.001, 0, "greater than 0"),
    ("body_timeout_seconds", 300, 300.5, "less than or equal to 300"),
    ("body_timeout_seconds", 0.001, 0, "greater than 0"),
    ("body_min_bytes_per_second", 1, 0, "greater than 0"),
    ("status_resync_seconds", 0.5, 0, "greater than 0"),
    ("max_body_bytes", 1024, 1023, "greater than or equal to 1024"),
    ("memory_budget_bytes", 0, -1, "greater than or equal to 0"),
    ("memory_limit_bytes", 1, 0, "greater than 0"),
    ("kubevirt_namespace", "a" * 63, "a" * 64, "at most 63 characters"),
    ("kubevirt_namespace", "a", "A", "should match pattern"),
    ("kubevirt_name", "a" * 253, "a" * 254, "at most 253 characters"),
    ("kubevirt_name", "a", "", "at least 1 character"),
    ("vgpu_namespace_label", "a" * 317, "a" * 318, "at most 317 characters"),
    ("vgpu_namespace_label", "a", "", "at least 1 character"),
]


@pytest.mark.parametrize(
    ("field", "taken", "refused", "words"), BOUNDS, ids=[f"{b[0]}-{b[3]}" for b in BOUNDS]
)
def test_each_bounded_setting_takes_its_bound_and_refuses_past_it(
    field: str, taken: object, refused: object, words: str
) -> None:
    assert getattr(Settings(**{field: taken}), field) == taken
    line = refusal(**{field: refused})
    assert line.startswith(f"invalid setting GPUCLASS_{field.upper()}: ")
    assert words in line


# --- what the settings derive ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("250ms", 0.25),
        ("1h2m3s4ms", 3723.004),
        ("2m", 120.0),
    ],
)
def test_go_durations_in_seconds(text: str, seconds: float) -> None:
    assert go_duration_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "30", "s", "1d", "-1s", "1 s", "1.s", "30s "])
def test_what_is_not_a_go_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^must be a Go duration such as 30s or 1m30s$"):
        go_duration_seconds(text)


@pytest.mark.parametrize("text", ["0s", "0m0s", "0ms"])
def test_a_go_duration_of_nothing_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^must be longer than zero$"):
        go_duration_seconds(text)


def test_a_body_may_take_the_body_timeout_plus_what_its_size_needs() -> None:
    settings = Settings(body_timeout_seconds=10, body_min_bytes_per_second=1000, hook_timeout="1m")
    assert settings.body_deadline_seconds(0) == 10.0
    assert settings.body_deadline_seconds(5000) == 15.0


def test_a_body_never_has_longer_than_the_hook_timeout() -> None:
    settings = Settings(body_timeout_seconds=10, body_min_bytes_per_second=1000, hook_timeout="12s")
    assert settings.body_deadline_seconds(5000) == 12.0
    assert settings.body_deadline_seconds(1000) == 11.0


def test_the_api_server_is_the_setting_when_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert Settings(kube_api="http://127.0.0.1:8001").api_base_url() == "http://127.0.0.1:8001"


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [
        ("10.96.0.1", "6443", "https://10.96.0.1:6443"),
        ("10.96.0.1", None, "https://10.96.0.1:443"),
        ("fd00::1", "443", "https://[fd00::1]:443"),
        (None, "443", None),
        ("", "443", None),
    ],
)
def test_in_a_pod_the_api_server_is_the_service_environments(
    monkeypatch: pytest.MonkeyPatch, host: str | None, port: str | None, url: str | None
) -> None:
    for name, value in (("KUBERNETES_SERVICE_HOST", host), ("KUBERNETES_SERVICE_PORT", port)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert Settings().api_base_url() == url


# --- how settings are declared and shown ----------------------------------------------------------


@pytest.mark.parametrize(
    "places", [{}, {"chart": "a.b", "not_in_chart": "because"}], ids=["neither", "both"]
)
def test_a_setting_names_its_chart_value_or_why_it_has_none(places: dict[str, str]) -> None:
    with pytest.raises(
        TypeError, match=r"^a setting names its chart value or says why it has none$"
    ):
        setting(1, "one", **places)


def test_the_settings_table_shows_each_default_as_the_docs_read_it() -> None:
    rows = {line.split(" | ")[0].strip("| `"): line for line in settings_table().splitlines()}
    assert settings_table().startswith("| variable | default | meaning |\n|---|---|---|\n")
    assert " | `true` | " in rows["GPUCLASS_ENABLED"]
    assert " | `false` | " in rows["GPUCLASS_METRICS_REQUIRE_AUTH"]
    assert " | `cozy-kubevirt` | " in rows["GPUCLASS_KUBEVIRT_NAMESPACE"]
    assert " | `60` | " in rows["GPUCLASS_STATUS_RESYNC_SECONDS"]
    assert " | `2.5` | " not in rows["GPUCLASS_KUBE_TIMEOUT_SECONDS"]
    assert " | `3` | " in rows["GPUCLASS_KUBE_TIMEOUT_SECONDS"]
    assert " | unset | " in rows["GPUCLASS_AUTH_TOKEN_FILE"]
    assert " | empty (all) | " in rows["GPUCLASS_NODE_SELECTOR"]
    assert " | `30s` | " in rows["GPUCLASS_HOOK_TIMEOUT"]


def test_a_readme_without_the_table_markers_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^the README has no <!-- settings table"):
        readme_with_table("# a README\n")
    with pytest.raises(ValueError, match="the README has no"):
        readme_with_table("<!-- settings table: make settings-table -->\nno end")


def test_the_readme_table_is_replaced_between_its_markers_only() -> None:
    readme = (
        "before\n<!-- settings table: make settings-table -->\nold rows\n"
        "<!-- end of settings table -->\nafter\n"
    )
    assert readme_with_table(readme) == (
        "before\n<!-- settings table: make settings-table -->\n"
        f"{settings_table()}<!-- end of settings table -->\nafter\n"
    )


def test_a_setting_carries_its_default_meaning_places_and_bounds() -> None:
    class Declared(BaseSettings):
        limit: int = setting(5, "how many", chart="a.limit", shown="`5` (five)", ge=1)
        reason: str = setting("d", "a letter", not_in_chart="nothing to tune")

    limit, reason = Declared.model_fields["limit"], Declared.model_fields["reason"]
    assert (limit.default, limit.description) == (5, "how many")
    assert limit.json_schema_extra == {
        "chart": "a.limit",
        "not_in_chart": None,
        "shown": "`5` (five)",
    }
    assert (reason.default, reason.description) == ("d", "a letter")
    assert reason.json_schema_extra == {
        "chart": None,
        "not_in_chart": "nothing to tune",
        "shown": None,
    }
    assert Declared(limit=1).limit == 1
    with pytest.raises(ValidationError):
        Declared(limit=0)
