"""Every alert rule evaluated by Prometheus' own rule tester (`promtool test rules`): for each
alert, series that make it fire once its `for:` has passed, with the labels and annotations
expected, and series that keep it quiet."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import one, render

# Renders the chart (helm) and runs promtool (`make tools` installs Prometheus).

JOB, NAMESPACE = "gpu-gpuclass-hooks", "cozy-gpu"  # the Service's name is the scrape job


@dataclass(frozen=True)
class Case:
    """One alert: the series of a state that must fire (quiet before `for:` has passed, firing
    after), and the series of a state that must stay quiet."""

    alert: str
    firing: list[tuple[str, str]]
    quiet: list[tuple[str, str]]
    quiet_until: str  # still pending (or not yet true) here
    fires_at: str
    labels: dict[str, str] = field(default_factory=dict)
    summary: str = ""


def condition(kind: str, status: str, reason: str) -> str:
    labels = f'class="l40s", type="{kind}", status="{status}", reason="{reason}", instance="a"'
    return f"cozystack_gpu_class_condition{{{labels}}}"


def requests_total(code: str, route: str = "/status/sync") -> str:
    return f'cozystack_gpu_hook_requests_total{{route="{route}", code="{code}", instance="a"}}'


def dropped(listener: str, reason: str) -> str:
    labels = f'listener="{listener}", reason="{reason}", instance="a"'
    return f"cozystack_gpu_hook_connections_dropped_total{{{labels}}}"


def expiry(listener: str) -> str:
    labels = f'listener="{listener}", instance="a"'
    return f"cozystack_gpu_hook_certificate_expiry_timestamp_seconds{{{labels}}}"


def client_expiry() -> str:
    return 'cozystack_gpu_hook_client_certificate_expiry_timestamp_seconds{instance="a"}'


def tls_failures(listener: str, reason: str) -> str:
    labels = f'listener="{listener}", reason="{reason}", instance="a"'
    return f"cozystack_gpu_hook_tls_handshake_failures_total{{{labels}}}"


def budget_left(tenant: str, namespace: str, instance: str) -> str:
    labels = f'tenant="{tenant}", namespace="{namespace}", key="gpuclass.cozystack.io/devices"'
    return f'cozystack_gpu_budget_left_units{{{labels}, instance="{instance}"}}'


def report_stamp(tenant: str, namespace: str, instance: str) -> str:
    labels = f'namespace="{namespace}", tenant="{tenant}"'
    return f'cozystack_gpu_budget_report_timestamp_seconds{{{labels}, instance="{instance}"}}'


CASES = [
    Case(
        "GPUClassNotReady",
        firing=[(condition("Ready", "False", "NoEligibleNodes"), "1x40")],
        quiet=[(condition("Ready", "True", "Ready"), "1x40")],
        quiet_until="14m",
        fires_at="16m",
        labels={"class": "l40s", "reason": "NoEligibleNodes"},
        summary="GPU class l40s is not Ready (NoEligibleNodes)",
    ),
    Case(
        "GPUClassLicenseSecretMissing",
        firing=[(condition("LicenseSecretMissing", "True", "SecretNotFound"), "1x40")],
        quiet=[(condition("LicenseSecretMissing", "False", "SecretFound"), "1x40")],
        quiet_until="9m",
        fires_at="11m",
        labels={"class": "l40s", "reason": "SecretNotFound"},
        summary="The license token of GPU class l40s cannot be copied (SecretNotFound)",
    ),
    Case(
        "GPUClassLicenseCopyConflict",
        firing=[(condition("LicenseCopyConflict", "True", "ForeignSecret"), "1x40")],
        quiet=[(condition("LicenseCopyConflict", "False", "NoConflict"), "1x40")],
        quiet_until="14m",
        fires_at="16m",
        labels={"class": "l40s", "reason": "ForeignSecret"},
        summary="Some namespaces get no license copy of GPU class l40s (ForeignSecret)",
    ),
    Case(
        "GPUClassNoFreeUnits",
        firing=[
            (
                'cozystack_gpu_class_capacity_units{class="l40s", eligible="true", instance="a"}',
                "4x90",
            ),
            ('cozystack_gpu_class_free_units{class="l40s", instance="a"}', "0x90"),
        ],
        quiet=[
            (
                'cozystack_gpu_class_capacity_units{class="l40s", eligible="true", instance="a"}',
                "4x90",
            ),
            ('cozystack_gpu_class_free_units{class="l40s", instance="a"}', "1x90"),
            # no capacity at all is another alert's business
            (
                'cozystack_gpu_class_capacity_units{class="h100", eligible="true", instance="a"}',
                "0x90",
            ),
            ('cozystack_gpu_class_free_units{class="h100", instance="a"}', "0x90"),
        ],
        quiet_until="59m",
        fires_at="61m",
        labels={"class": "l40s"},
        summary="GPU class l40s has had no free units for an hour",
    ),
    Case(
        "GPUClassResourceNotAdvertised",
        firing=[(condition("ResourceNotAdvertised", "True", "NoNodeAdvertises"), "1x40")],
        quiet=[(condition("ResourceNotAdvertised", "False", "Advertised"), "1x40")],
        quiet_until="14m",
        fires_at="16m",
        labels={"class": "l40s"},
        summary="No node advertises the resource of GPU class l40s",
    ),
    Case(
        # the last computation at 4m (t=240 s): more than 300 s ago from 10m on, then 1m pending
        "GPUClassStatusNotSynced",
        firing=[('cozystack_gpu_class_last_sync_timestamp_seconds{class="l40s"}', "0+60x4")],
        quiet=[('cozystack_gpu_class_last_sync_timestamp_seconds{class="l40s"}', "0+60x40")],
        quiet_until="10m",
        fires_at="12m",
        summary="GPU class status has not been computed for 5 minutes",
    ),
    Case(
        "GPUClassHookServerErrors",
        firing=[(requests_total("500"), "0+1x40"), (requests_total("200"), "0+10x40")],
        quiet=[(requests_total("500"), "3x40"), (requests_total("200"), "0+10x40")],
        quiet_until="5m",
        fires_at="7m",
        labels={"route": "/status/sync"},
        summary="The gpuclass hook /status/sync answers 5xx",
    ),
    Case(
        "GPUClassHookClientErrors",
        firing=[(requests_total("401"), "0+1x40"), (requests_total("200"), "0+10x40")],
        quiet=[(requests_total("401"), "0+1x40"), (requests_total("200"), "0+100x40")],
        quiet_until="15m",
        fires_at="17m",
        labels={"route": "/status/sync"},
        summary="The gpuclass hook /status/sync refuses more than 5% of calls",
    ),
    Case(
        # one replica down and none up fires; one up of two keeps it quiet; none scraped at all
        # fires too (test_hooks_down_fires_when_no_target_is_scraped)
        "GPUClassHooksDown",
        firing=[(f'up{{job="{JOB}", namespace="{NAMESPACE}", instance="a"}}', "0x50")],
        quiet=[
            (f'up{{job="{JOB}", namespace="{NAMESPACE}", instance="a"}}', "0x50"),
            (f'up{{job="{JOB}", namespace="{NAMESPACE}", instance="b"}}', "1x50"),
        ],
        quiet_until="4m",
        fires_at="6m",
        labels={"job": JOB, "namespace": NAMESPACE},
        summary="No gpuclass hooks replica has been scraped for 5 minutes",
    ),
    Case(
        "GPUClassBudgetReviewsFailingClosed",
        firing=[('cozystack_gpu_budget_reviews_total{verdict="failed_closed"}', "0+1x40")],
        quiet=[
            ('cozystack_gpu_budget_reviews_total{verdict="failed_closed"}', "5x40"),
            ('cozystack_gpu_budget_reviews_total{verdict="denied"}', "0+3x40"),
        ],
        quiet_until="10m",
        fires_at="12m",
        summary="GPU budget reviews are denied because their inputs cannot be read",
    ),
    Case(
        "GPUBudgetPoolOverBudget",
        # replica b reported on acme's pool last: its figures count, a's older over-budget ones
        # do not; another pool's report, later on a, changes nothing for acme
        firing=[
            (budget_left("acme", "tenant-acme", "b"), "-2x40"),
            (report_stamp("acme", "tenant-acme", "b"), "0+60x40"),
            (budget_left("acme", "tenant-acme", "a"), "0x40"),
            (report_stamp("acme", "tenant-acme", "a"), "0+59x40"),
            (budget_left("lab", "tenant-acme-lab", "a"), "1x40"),
            (report_stamp("lab", "tenant-acme-lab", "a"), "0+61x40"),
        ],
        quiet=[
            (budget_left("acme", "tenant-acme", "a"), "-2x40"),
            (report_stamp("acme", "tenant-acme", "a"), "0+59x40"),
            (budget_left("acme", "tenant-acme", "b"), "0x40"),
            (report_stamp("acme", "tenant-acme", "b"), "0+60x40"),
            (budget_left("lab", "tenant-acme-lab", "b"), "1x40"),
            (report_stamp("lab", "tenant-acme-lab", "b"), "0+60x40"),
        ],
        quiet_until="14m",
        fires_at="16m",
        labels={
            "tenant": "acme",
            "namespace": "tenant-acme",
            "key": "gpuclass.cozystack.io/devices",
        },
        summary="The GPU budget pool of tenant acme (tenant-acme) is over its "
        "gpuclass.cozystack.io/devices budget",
    ),
    Case(
        "GPUInstanceTypeNotInWebhook",
        firing=[
            ('cozystack_gpu_budget_instance_type_unnamed{instance_type="a10.xlarge"}', "1x40"),
        ],
        quiet=[],
        quiet_until="14m",
        fires_at="16m",
        labels={"instance_type": "a10.xlarge"},
        summary="Instance type a10.xlarge attaches GPUs but the budget webhook does not see VMs "
        "that name it",
    ),
    Case(
        # rate() over 10m of a counter that starts in the window passes one a minute at 6m
        "GPUClassHookMemoryBudgetRefusals",
        firing=[('cozystack_gpu_hook_memory_refused_total{code="429"}', "0+2x40")],
        quiet=[
            ('cozystack_gpu_hook_memory_refused_total{code="429"}', "0+0.5x40"),
            ('cozystack_gpu_hook_memory_refused_total{code="413"}', "0+5x40"),
        ],
        quiet_until="20m",
        fires_at="22m",
        summary="The hooks refuse more than one call a minute for want of memory (429)",
    ),
    Case(
        "GPUClassHookCredentialInvalid",
        firing=[('cozystack_gpu_hook_credential_valid{kind="token", instance="a"}', "0x40")],
        quiet=[
            ('cozystack_gpu_hook_credential_valid{kind="token", instance="a"}', "1x40"),
            ('cozystack_gpu_hook_credential_valid{kind="serving_pair", instance="a"}', "1x40"),
        ],
        quiet_until="1m",
        fires_at="3m",
        labels={"kind": "token", "instance": "a"},
        summary="A replica's token file is invalid",
    ),
    Case(
        "GPUClassHooksQueueing",
        firing=[
            ('cozystack_gpu_hook_thread_wait_seconds_sum{instance="a"}', "0+60x40"),
            ('cozystack_gpu_hook_thread_wait_seconds_count{instance="a"}', "0+60x40"),
        ],
        quiet=[
            ('cozystack_gpu_hook_thread_wait_seconds_sum{instance="a"}', "0+6x40"),
            ('cozystack_gpu_hook_thread_wait_seconds_count{instance="a"}', "0+60x40"),
            ('cozystack_gpu_hook_calls_refused_busy_total{instance="a"}', "0+0.5x40"),
        ],
        quiet_until="14m",
        fires_at="22m",
        summary=(
            "Hook calls wait for a thread (half a second on average, or more than one refused a "
            "minute)"
        ),
    ),
    Case(
        "GPUClassHookStalledBodies",
        firing=[(requests_total("408"), "0+2x40")],
        quiet=[(requests_total("408"), "0+0.5x40"), (requests_total("401"), "0+5x40")],
        quiet_until="20m",
        fires_at="22m",
        summary="More than one call a minute sends its body too slowly (408)",
    ),
    Case(
        "GPUClassHookConnectionsDropped",
        firing=[(dropped("hooks", "head_deadline"), "0+20x40")],
        quiet=[(dropped("hooks", "head_deadline"), "0+5x40"), (requests_total("401"), "0+50x40")],
        quiet_until="14m",
        fires_at="22m",
        labels={"listener": "hooks", "reason": "head_deadline"},
        summary="The hooks port drops more than ten connections a minute (head_deadline)",
    ),
    Case(
        "GPUClassHookListenOverflows",
        firing=[('cozystack_gpu_hook_listen_overflows_total{pod="p", namespace="n"}', "0+30x40")],
        quiet=[('cozystack_gpu_hook_listen_overflows_total{pod="p", namespace="n"}', "0+0.5x40")],
        quiet_until="9m",
        fires_at="17m",
        labels={"pod": "p", "namespace": "n"},
        summary="The kernel refuses connections to hook pod p: its listen queues overflow",
    ),
    Case(
        "GPUClassHookCertificateExpiresSoon",
        # promtool's clock starts at 0: a certificate ending at day 13 against one at day 60
        firing=[(expiry("hooks"), f"{13 * 86400}x120")],
        quiet=[(expiry("hooks"), f"{60 * 86400}x120")],
        quiet_until="50m",
        fires_at="70m",
        labels={"listener": "hooks"},
        summary="A hook replica serves a certificate on its hooks port that ends within 14 days",
    ),
    Case(
        "GPUClassHookClientCertificateExpiresSoon",
        firing=[(client_expiry(), f"{13 * 86400}x120")],
        quiet=[(client_expiry(), f"{60 * 86400}x120")],
        quiet_until="50m",
        fires_at="70m",
        summary=(
            "Metacontroller presents a client certificate to the hooks that ends within 14 days"
        ),
    ),
    Case(
        "GPUClassHookTLSHandshakeFailures",
        firing=[(tls_failures("hooks", "certificate_rejected"), "0+5x40")],
        quiet=[(tls_failures("hooks", "certificate_rejected"), "0+0x40")],
        quiet_until="8m",
        fires_at="22m",
        labels={"listener": "hooks", "reason": "certificate_rejected"},
        summary=(
            "TLS handshakes on the hooks port fail more than once a minute (certificate_rejected)"
        ),
    ),
]


@pytest.fixture(scope="module")
def rules() -> dict[str, dict[str, Any]]:
    documents = render("monitoring.prometheusRule.enabled=true", namespace=NAMESPACE)
    groups = one(documents, "PrometheusRule")["spec"]["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def expanded(template: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus renders it for these labels (the rules use only $labels)."""
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)


def promtool_test(case: Case, rule: dict[str, Any]) -> dict[str, Any]:
    labels = {**case.labels, **rule["labels"]}
    annotations = {key: expanded(value, labels) for key, value in rule["annotations"].items()}
    assert annotations["summary"] == case.summary
    series = [{"series": s, "values": v} for s, v in case.firing]
    quiet = [{"series": s, "values": v} for s, v in case.quiet]
    check = {"alertname": case.alert}
    return {
        "tests": [
            {
                "name": f"{case.alert} fires",
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {**check, "eval_time": case.quiet_until, "exp_alerts": []},
                    {
                        **check,
                        "eval_time": case.fires_at,
                        "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
                    },
                ],
            },
            {
                "name": f"{case.alert} stays quiet",
                "interval": "1m",
                "input_series": quiet,
                "alert_rule_test": [
                    {**check, "eval_time": t, "exp_alerts": []}
                    for t in (case.quiet_until, case.fires_at, "40m")
                ],
            },
        ]
    }


def test_every_alert_has_a_firing_and_a_quiet_case(rules: dict[str, dict[str, Any]]) -> None:
    assert sorted(c.alert for c in CASES) == sorted(rules)


@pytest.mark.parametrize("case", CASES, ids=[c.alert for c in CASES])
def test_alert_fires_after_its_for_and_stays_quiet_otherwise(
    case: Case, rules: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: `make tools` installs it (make test does this)")
    rule = rules[case.alert]
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "under-test", "rules": [rule]}]})
    )
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", **promtool_test(case, rule)}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hooks_down_fires_when_no_target_is_scraped(
    rules: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    rule = rules["GPUClassHooksDown"]
    case = next(c for c in CASES if c.alert == rule["alert"])
    nothing = Case(
        case.alert,
        firing=[('up{job="something-else", instance="x"}', "1x50")],
        quiet=case.quiet,
        quiet_until=case.quiet_until,
        fires_at=case.fires_at,
        labels=case.labels,
        summary=case.summary,
    )
    test_alert_fires_after_its_for_and_stays_quiet_otherwise(nothing, rules, tmp_path)
