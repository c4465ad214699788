import threading
import time
from pathlib import Path

from hooks.kubeapi.client import CALL_DEADLINE
from hooks.kubeapi.kubevirt import KubeVirtReader
from hooks.rules.permitted_devices import (
    KubeVirtAbsent,
    KubeVirtFound,
    KubeVirtUnreadable,
    KubeVirtView,
    permitted_resources,
)
from hooks.settings import Settings
from tests.builders import GPU
from tests.fake_apiserver import KUBEVIRT_PATH, FakeApiServer, kubevirt_cr


def test_reads_the_kubevirt_cr_with_the_service_account_token(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    view = KubeVirtReader(settings).view()
    assert isinstance(view, KubeVirtFound)
    assert permitted_resources(view.kubevirt) == {GPU}
    assert apiserver.requests == [(KUBEVIRT_PATH, "Bearer sa-token-1")]


def test_token_file_is_reread_when_it_rotates(
    settings: Settings, apiserver: FakeApiServer, token_file: Path
) -> None:
    reader = KubeVirtReader(settings)
    reader.view()
    token_file.write_text("sa-token-2")
    reader.view()
    assert [auth for _, auth in apiserver.requests] == ["Bearer sa-token-1", "Bearer sa-token-2"]


def test_404_means_kubevirt_absent(settings: Settings, apiserver: FakeApiServer) -> None:
    apiserver.serve(KUBEVIRT_PATH, 404, {"kind": "Status", "reason": "NotFound"})
    assert KubeVirtReader(settings).view() == KubeVirtAbsent("cozy-kubevirt/kubevirt")


def test_missing_kubevirt_api_is_a_404_too(settings: Settings, apiserver: FakeApiServer) -> None:
    del apiserver.routes[KUBEVIRT_PATH]
    assert KubeVirtReader(settings).view() == KubeVirtAbsent("cozy-kubevirt/kubevirt")


def test_server_errors_and_forbidden_are_unreadable(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    for code in (403, 500, 503):
        apiserver.serve(KUBEVIRT_PATH, code, {"kind": "Status"})
        assert KubeVirtReader(settings).view() == KubeVirtUnreadable(f"HTTP {code}")


def test_invalid_body_is_unreadable(settings: Settings, apiserver: FakeApiServer) -> None:
    apiserver.serve(KUBEVIRT_PATH, 200, b"{not json")
    assert KubeVirtReader(settings).view() == KubeVirtUnreadable(
        "the KubeVirt object is not valid: not valid JSON"
    )
    apiserver.serve(KUBEVIRT_PATH, 200, {"spec": {"configuration": []}})
    assert KubeVirtReader(settings).view() == KubeVirtUnreadable(
        "the KubeVirt object is not valid: spec.configuration: expected a map, got a list"
    )


def test_timeout_is_unreadable(settings: Settings, apiserver: FakeApiServer) -> None:
    apiserver.serve(KUBEVIRT_PATH, 200, kubevirt_cr(GPU), delay=1.0)
    fast = settings.model_copy(update={"kube_timeout_seconds": 0.2})
    assert KubeVirtReader(fast).view() == KubeVirtUnreadable("timed out")


def test_unreachable_api_is_unreadable(settings: Settings) -> None:
    gone = settings.model_copy(update={"kube_api": "http://127.0.0.1:9"})
    assert KubeVirtReader(gone).view() == KubeVirtUnreadable("request failed (ConnectionError)")


def test_no_api_configured_is_unreadable(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    view = KubeVirtReader(Settings(kube_token_file=tmp_path / "none")).view()
    assert view == KubeVirtUnreadable("no Kubernetes API configured (GPUCLASS_KUBE_API)")


def test_burst_of_syncs_makes_one_read_within_the_cache_period(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    now = [100.0]
    cached = settings.model_copy(update={"kubevirt_cache_seconds": 5.0})
    outcomes: list[str] = []
    reader = KubeVirtReader(cached, clock=lambda: now[0], observe=outcomes.append)
    for _ in range(5):
        reader.view()
    now[0] = 104.9
    reader.view()
    assert len(apiserver.requests) == 1
    now[0] = 105.0  # the five seconds are over
    reader.view()
    assert len(apiserver.requests) == 2
    assert outcomes == ["found", "found"]


def test_concurrent_syncs_share_one_read_in_flight(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    apiserver.serve(KUBEVIRT_PATH, delay=2.0)  # every caller starts while it is in flight
    reader = KubeVirtReader(settings.model_copy(update={"kubevirt_cache_seconds": 5.0}))
    views: list[KubeVirtView] = []
    threads = [threading.Thread(target=lambda: views.append(reader.view())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(apiserver.requests) == 1
    assert len(views) == 8 and all(isinstance(view, KubeVirtFound) for view in views)


def test_a_caller_waits_for_another_callers_read_only_within_its_own_deadline(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    """No lock across the read: a sync whose deadline is near gets KubeVirtUnreadable while the
    slow read goes on for the caller that made it."""
    apiserver.serve(KUBEVIRT_PATH, delay=2.0)
    reader = KubeVirtReader(settings.model_copy(update={"kube_timeout_seconds": 10}))
    slow: list[KubeVirtView] = []
    first = threading.Thread(target=lambda: slow.append(reader.view()))
    first.start()
    while not apiserver.requests:  # the read is in flight
        time.sleep(0.01)
    token = CALL_DEADLINE.set(time.monotonic() + 0.1)
    try:
        hurried = reader.view()
    finally:
        CALL_DEADLINE.reset(token)
    assert hurried == KubeVirtUnreadable(
        "the read in flight did not finish within this call's time"
    )
    assert not slow  # decided while the read was still in flight
    first.join(10)
    assert isinstance(slow[0], KubeVirtFound)


def test_after_the_api_recovers_the_next_sync_sees_it(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    """A failed read is not kept: recovery shows at once, not a cache period later."""
    now = [100.0]
    reader = KubeVirtReader(
        settings.model_copy(update={"kubevirt_cache_seconds": 5.0}), clock=lambda: now[0]
    )
    apiserver.serve(KUBEVIRT_PATH, 503, {"kind": "Status"})
    assert isinstance(reader.view(), KubeVirtUnreadable)
    apiserver.serve(KUBEVIRT_PATH)
    assert isinstance(reader.view(), KubeVirtFound)  # the same instant
