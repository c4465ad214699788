"""Reading the budget inputs from a local API server that serves the list endpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from hooks.budgets import GPUCLASSES, HELMRELEASES, BudgetReader
from hooks.rules.budget import TOTAL_KEY, InputUnreadable, class_key
from hooks.settings import Settings
from tests.apiserver import FakeApiServer, list_of
from tests.builders import GPU, gpuclass, gpus, helmrelease


@pytest.fixture
def budget_api(apiserver: FakeApiServer) -> FakeApiServer:
    apiserver.serve(GPUCLASSES, 200, list_of([gpuclass("l40s"), gpuclass("broken", resource=None)]))
    apiserver.serve(
        HELMRELEASES,
        200,
        list_of(
            [
                helmrelease(
                    "Tenant",
                    "tenant-root",
                    "a",
                    {"resourceQuotas": {TOTAL_KEY: "4", "requests.cpu": "500m"}},
                ),
                helmrelease("Tenant", "tenant-root", "b", {"host": "b.example.org"}),
                helmrelease("VMInstance", "tenant-a", "vm1", {"gpus": gpus(GPU), "running": False}),
                helmrelease(
                    "KubernetesNodes", "tenant-a", "pool", {"gpus": gpus(GPU), "maxReplicas": 3}
                ),
                helmrelease("KubernetesNodes", "tenant-a", "pool2", {"gpus": gpus(GPU)}),
            ]
        ),
    )
    return apiserver


def reader(settings: Settings, now: list[float] | None = None) -> BudgetReader:
    clock = now or [0.0]
    return BudgetReader(
        settings.model_copy(update={"admission_cache_seconds": 5}), clock=lambda: clock[0]
    )


def test_reads_classes_tenants_and_apps_by_label_across_pages(
    settings: Settings, budget_api: FakeApiServer
) -> None:
    budgets = reader(settings)
    assert [(c.name, c.resource_name) for c in budgets.classes()] == [
        ("l40s", GPU),
        ("broken", None),
    ]
    tenants = {t.name: t for t in budgets.tenants()}
    assert tenants["a"].declaration == {TOTAL_KEY: 4, "requests.cpu": 0}
    assert tenants["a"].namespace == "tenant-a" and not tenants["b"].bounded
    apps = {a.name: a for a in budgets.apps()}
    assert set(apps) == {"vm1", "pool", "pool2"}
    assert (apps["pool"].kind, apps["pool"].max_replicas, apps["pool2"].max_replicas) == (
        "KubernetesNodes",
        3,
        None,
    )
    queries = [path for path, _ in budget_api.requests]
    assert any("labelSelector=apps.cozystack.io%2Fapplication.kind%3DTenant" in q for q in queries)
    assert any("continue=2" in q for q in queries)
    assert all(auth == "Bearer sa-token-1" for _, auth in budget_api.requests)


def test_classes_and_tenants_are_cached_briefly_reservations_never(
    settings: Settings, budget_api: FakeApiServer
) -> None:
    now = [0.0]
    budgets = reader(settings, now)

    def reads(path: str) -> int:
        return sum(1 for p, _ in budget_api.requests if p.startswith(path) and "continue" not in p)

    budgets.classes(), budgets.tenants(), budgets.apps()
    budgets.classes(), budgets.tenants(), budgets.apps()
    assert reads(GPUCLASSES) == 1
    assert reads(HELMRELEASES) == 3  # tenants once, apps twice
    now[0] = 6.0
    budgets.classes()
    assert reads(GPUCLASSES) == 2


@pytest.mark.parametrize("code", [403, 500])
def test_unreadable_lists_fail_closed_with_what_could_not_be_read(
    settings: Settings, apiserver: FakeApiServer, code: int
) -> None:
    apiserver.serve(HELMRELEASES, code, {"kind": "Status"})
    with pytest.raises(InputUnreadable, match=f"could not list HelmReleases .*HTTP {code}"):
        reader(settings).apps()
    with pytest.raises(InputUnreadable, match="could not list GPUClasses"):
        reader(settings).classes()  # not served at all: 404


def test_malformed_quota_fails_closed(settings: Settings, apiserver: FakeApiServer) -> None:
    apiserver.serve(
        HELMRELEASES,
        200,
        list_of(
            [
                helmrelease(
                    "Tenant", "tenant-root", "a", {"resourceQuotas": {class_key("l40s"): "1.5"}}
                )
            ]
        ),
    )
    with pytest.raises(InputUnreadable, match="Tenant tenant-root/a: resourceQuotas"):
        reader(settings).tenants()


def test_timeout_fails_closed(settings: Settings, apiserver: FakeApiServer) -> None:
    apiserver.serve(HELMRELEASES, 200, list_of([]), delay=1.0)
    fast = settings.model_copy(update={"kube_timeout_seconds": 0.2})
    with pytest.raises(InputUnreadable, match="timed out"):
        BudgetReader(fast).apps()


def test_no_api_configured_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(InputUnreadable, match="no Kubernetes API configured"):
        BudgetReader(Settings(kube_token_file=tmp_path / "none")).apps()
