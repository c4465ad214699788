import re
from datetime import UTC, datetime

import pytest

from hooks.rules.class_status import ORDER, ready_condition, rfc3339, settle
from hooks.rules.conditions import DecidedCondition, advertised_condition, conflict_condition
from hooks.rules.permitted_devices import (
    KubeVirtAbsent,
    KubeVirtFound,
    KubeVirtUnreadable,
    permission_condition,
)
from hooks.wire.kube import Condition, KubeVirt
from tests import ROOT
from tests.builders import GPU, as_wire

NOW = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
EARLIER = "2026-11-01T08:00:00Z"


def kubevirt(pci: list[str] = (), mediated: list[str] = ()) -> KubeVirtFound:  # type: ignore[assignment]
    spec = {
        "configuration": {
            "permittedHostDevices": {
                "pciHostDevices": [
                    {"pciVendorSelector": "10DE:2236", "resourceName": r} for r in pci
                ],
                "mediatedDevices": [{"mdevNameSelector": "X", "resourceName": r} for r in mediated],
            }
        }
    }
    return KubeVirtFound(as_wire({"spec": spec}, KubeVirt), "cozy-kubevirt/kubevirt")


def condition(type_: str, status: str, reason: str = "R", generation: int = 1) -> Condition:
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message="m",
        last_transition_time=EARLIER,
        observed_generation=generation,
    )


def test_resource_name_not_permitted_false_when_listed_as_pci_or_mediated_device() -> None:
    for view in (kubevirt(pci=[GPU]), kubevirt(mediated=[GPU])):
        verdict = permission_condition(GPU, view, None, 1)
        assert (verdict.status, verdict.reason) == ("False", "Permitted")


def test_resource_name_not_permitted_true_when_not_in_permitted_host_devices() -> None:
    verdict = permission_condition(GPU, kubevirt(pci=["nvidia.com/OTHER"]), None, 1)
    assert (verdict.status, verdict.reason) == ("True", "NotInPermittedHostDevices")


def test_resource_name_not_permitted_true_when_kubevirt_not_found() -> None:
    verdict = permission_condition(GPU, KubeVirtAbsent("cozy-kubevirt/kubevirt"), None, 1)
    assert (verdict.status, verdict.reason) == ("True", "KubeVirtNotFound")


def test_kubevirt_unreadable_without_previous_condition_is_unknown() -> None:
    verdict = permission_condition(GPU, KubeVirtUnreadable("HTTP 503"), None, 1)
    assert (verdict.status, verdict.reason) == ("Unknown", "KubeVirtUnreadable")
    assert "HTTP 503" in verdict.message


def test_kubevirt_unreadable_keeps_previous_condition_of_current_generation_verbatim() -> None:
    previous = condition("ResourceNameNotPermitted", "False", "Permitted", generation=3)
    assert permission_condition(GPU, KubeVirtUnreadable("timed out"), previous, 3) is previous


def test_kubevirt_unreadable_ignores_previous_condition_of_older_generation() -> None:
    previous = condition("ResourceNameNotPermitted", "False", "Permitted", generation=2)
    verdict = permission_condition(GPU, KubeVirtUnreadable("timed out"), previous, 3)
    assert (verdict.status, verdict.reason) == ("Unknown", "KubeVirtUnreadable")


def test_resource_not_advertised() -> None:
    assert advertised_condition(GPU, False).reason == "NoNodeAdvertises"
    assert advertised_condition(GPU, True).status == "False"


def test_resource_name_conflict_message_names_the_older_class() -> None:
    verdict = conflict_condition(GPU, "older")
    assert (verdict.status, verdict.reason) == ("True", "OlderClassHasResource")
    assert "older" in verdict.message


@pytest.mark.parametrize(
    ("failing", "reason"),
    [
        (["ResourceNameConflict", "ResourceNameNotPermitted"], "ResourceNameConflict"),
        (["ResourceNameNotPermitted", "ResourceNotAdvertised"], "ResourceNameNotPermitted"),
        (["ResourceNotAdvertised", "LicenseSecretMissing"], "ResourceNotAdvertised"),
        (["LicenseSecretMissing"], "LicenseSecretMissing"),
    ],
)
def test_ready_false_with_first_failing_condition(failing: list[str], reason: str) -> None:
    verdicts = [
        DecidedCondition(t, "True" if t in failing else "False", "X", f"{t} says")
        for t in ORDER[:-1]
    ]
    ready = ready_condition(verdicts)
    assert (ready.status, ready.reason, ready.message) == ("False", reason, f"{reason} says")


def test_license_copy_conflict_never_affects_ready() -> None:
    verdicts = [DecidedCondition(t, "False", "X") for t in ORDER[:-1]]
    verdicts[-1] = DecidedCondition("LicenseCopyConflict", "True", "ForeignSecret")
    assert ready_condition(verdicts).status == "True"


def test_ready_unknown_when_only_kubevirt_is_unknown() -> None:
    verdicts = [
        DecidedCondition("ResourceNameNotPermitted", "Unknown", "KubeVirtUnreadable", "why")
    ]
    ready = ready_condition(verdicts)
    assert (ready.status, ready.reason) == ("Unknown", "KubeVirtUnreadable")


def test_ready_true_otherwise() -> None:
    ready = ready_condition([DecidedCondition(t, "False", "X") for t in ORDER[:-1]])
    assert (ready.status, ready.reason) == ("True", "Ready")


def test_new_transition_time_is_rfc3339_utc_with_seconds_and_z() -> None:
    assert rfc3339(NOW) == "2026-11-30T12:00:00Z"


def test_last_transition_time_kept_when_status_unchanged() -> None:
    previous = [condition("Ready", "True")]
    [settled] = settle(
        [DecidedCondition("Ready", "True", "Ready", "new message")], previous, 2, NOW
    )
    assert settled.last_transition_time == EARLIER
    assert (settled.message, settled.observed_generation) == ("new message", 2)


def test_last_transition_time_moves_when_status_changes() -> None:
    [settled] = settle(
        [DecidedCondition("Ready", "False", "X")], [condition("Ready", "True")], 1, NOW
    )
    assert settled.last_transition_time == "2026-11-30T12:00:00Z"


def test_conditions_carry_parent_generation_and_fixed_order() -> None:
    settled = settle([DecidedCondition(t, "False", "X") for t in reversed(ORDER)], [], 7, NOW)
    assert [c.type for c in settled] == list(ORDER)
    assert {c.observed_generation for c in settled} == {7}


# --- every condition word for word -------------------------------------------------------------


def test_conditions_word_for_word() -> None:
    from hooks.rules.conditions import (
        DecidedCondition,
        advertised_condition,
        conflict_condition,
        license_conflict_condition,
        license_secret_condition,
    )
    from hooks.rules.license import LicensePlan, SourceState

    assert conflict_condition(GPU, None) == DecidedCondition(
        "ResourceNameConflict", "False", "NoConflict", f"no older class has {GPU}"
    )
    assert advertised_condition(GPU, True) == DecidedCondition(
        "ResourceNotAdvertised", "False", "Advertised", f"nodes advertise {GPU}"
    )
    assert advertised_condition(GPU, False) == DecidedCondition(
        "ResourceNotAdvertised",
        "True",
        "NoNodeAdvertises",
        f"no node lists {GPU} in status.capacity",
    )
    found = SourceState(True, "SecretFound", "license Secret a/b holds a token")
    assert license_secret_condition(found) == DecidedCondition(
        "LicenseSecretMissing", "False", "SecretFound", "license Secret a/b holds a token"
    )

    def conflict(
        foreign: tuple[str, ...] = (), unmanaged: tuple[str, ...] = ()
    ) -> DecidedCondition:
        plan = LicensePlan(found, (), 0, foreign, unmanaged, (), ())
        return license_conflict_condition(plan, "gpuclass-l40s-license")

    assert conflict() == DecidedCondition(
        "LicenseCopyConflict",
        "False",
        "NoConflict",
        "no foreign Secret named gpuclass-l40s-license",
    )
    five = tuple(f"t{i}" for i in range(5))
    assert conflict(unmanaged=five) == DecidedCondition(
        "LicenseCopyConflict",
        "True",
        "UnmanagedCopy",
        "5 namespaces hold a copy gpuclass-l40s-license with our labels that no class manages "
        "(orphaned, or written by another controller); delete it to let the hook manage it: "
        "t0, t1, t2, t3, t4",
    )
    assert conflict(foreign=(*five, "t5")).message == (
        "6 entitled namespaces hold a Secret gpuclass-l40s-license that is not a managed copy "
        "and get no copy: t0, t1, t2, t3, t4, ..."
    )


def test_transition_times_are_utc_whatever_the_clock_zone() -> None:
    from datetime import datetime, timedelta, timezone

    kyiv = timezone(timedelta(hours=2))
    assert rfc3339(datetime(2026, 12, 1, 9, 30, tzinfo=kyiv)) == "2026-12-01T07:30:00Z"


def test_permission_and_ready_word_for_word() -> None:
    from hooks.rules.permitted_devices import KubeVirtAbsent, permission_condition

    permitted = permission_condition(GPU, kubevirt(pci=[GPU]), None, 1)
    assert permitted == DecidedCondition(
        "ResourceNameNotPermitted",
        "False",
        "Permitted",
        f"{GPU} is in the permittedHostDevices of KubeVirt cozy-kubevirt/kubevirt",
    )
    assert permission_condition(GPU, kubevirt(), None, 1) == DecidedCondition(
        "ResourceNameNotPermitted",
        "True",
        "NotInPermittedHostDevices",
        f"{GPU} is in neither pciHostDevices nor mediatedDevices of the permittedHostDevices of "
        "KubeVirt cozy-kubevirt/kubevirt",
    )
    assert permission_condition(GPU, KubeVirtAbsent("kv/kubevirt"), None, 1) == DecidedCondition(
        "ResourceNameNotPermitted",
        "True",
        "KubeVirtNotFound",
        "KubeVirt kv/kubevirt does not exist",
    )
    assert ready_condition([permitted]) == DecidedCondition(
        "Ready", "True", "Ready", "the class can serve VMs"
    )
    unknown = permission_condition(GPU, KubeVirtUnreadable("timed out"), None, 1)
    assert ready_condition([unknown]) == DecidedCondition(
        "Ready", "Unknown", "KubeVirtUnreadable", "KubeVirt could not be read: timed out"
    )


def test_transition_times_are_utc_on_a_host_in_another_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time
    from datetime import datetime, timedelta, timezone

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        moment = datetime(2026, 12, 1, 9, 30, tzinfo=timezone(timedelta(hours=2)))
        assert rfc3339(moment) == "2026-12-01T07:30:00Z"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_every_condition_of_the_registry_has_its_line_in_the_docs() -> None:
    """docs/gpuclass.md's Conditions table is where a hoster learns what a condition means."""
    page = (ROOT / "docs" / "gpuclass.md").read_text()
    documented = re.findall(r"^\| `(\w+)` \|", page.split("## Conditions", 1)[1], re.M)
    assert [kind for kind in ORDER if kind not in documented] == []
