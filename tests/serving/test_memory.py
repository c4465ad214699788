"""The memory budget for request bodies in flight: its accounting, order and bounds, and how the
routes use it. Not timed: speed and memory under load are measured by `make bench-load`."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from hooks.serving.app import create_app
from hooks.serving.http import RETRY_AFTER_SECONDS
from hooks.serving.memory import (
    LARGE_BODY_BYTES,
    MIB,
    PER_CALL_BYTES,
    Admitted,
    MemoryBudget,
    NeverFits,
    TimedOut,
    budget_for_limit,
    configured_budget,
    container_memory_limit,
    memory_budget,
)
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from tests.builders import gpuclass, node, status_sync_request

KIB = 1024


def budget(total: int = 100 * KIB, wait: float = 0.3, bypass: int = KIB) -> MemoryBudget:
    return MemoryBudget(
        total, max_wait_seconds=wait, expansion=1.5, per_call_bytes=0, bypass_below_bytes=bypass
    )


# --- the budget itself ------------------------------------------------------------------------


def test_a_call_reserves_its_expanded_share_and_gives_it_back() -> None:
    memory = budget()
    reservation = memory.reserve(10 * KIB)
    assert isinstance(reservation, Admitted) and reservation.share == 15 * KIB
    assert memory.reserved_bytes == 15 * KIB
    reservation.release()
    reservation.release()  # once, however often
    assert memory.reserved_bytes == 0


def test_a_large_call_also_reserves_what_it_costs_besides_its_body() -> None:
    memory = MemoryBudget(1024 * MIB, max_wait_seconds=1)
    assert memory.share(100 * MIB) == 150 * MIB + PER_CALL_BYTES
    reservation = memory.reserve(LARGE_BODY_BYTES - 1)  # bypasses: no share at all
    assert isinstance(reservation, Admitted) and reservation.share == 0


def test_small_bodies_bypass_the_budget_even_when_it_is_full() -> None:
    memory = budget()
    held = memory.reserve(60 * KIB)  # 90 KiB of 100
    assert isinstance(held, Admitted)
    small = memory.reserve(KIB - 1)
    assert isinstance(small, Admitted) and small.share == 0 and small.waited == 0
    assert memory.reserved_bytes == 90 * KIB


def test_a_share_larger_than_the_whole_budget_never_fits() -> None:
    assert memory_never_fits(budget().reserve(67 * KIB))  # 100.5 KiB > 100 KiB


def memory_never_fits(reservation: object) -> bool:
    return isinstance(reservation, NeverFits)


def test_the_wait_is_bounded() -> None:
    memory = budget(wait=0.2)
    held = memory.reserve(50 * KIB)
    started = time.monotonic()
    refused = memory.reserve(30 * KIB)
    waited = time.monotonic() - started
    assert isinstance(refused, TimedOut) and 0.2 <= waited < 1.0
    assert memory.waiting == 0 and memory.reserved_bytes == 75 * KIB
    assert isinstance(held, Admitted)


def test_a_waiting_call_is_admitted_when_the_budget_frees() -> None:
    memory = budget(wait=5)
    held = memory.reserve(50 * KIB)
    assert isinstance(held, Admitted)
    threading.Timer(0.1, held.release).start()
    later = memory.reserve(50 * KIB)
    assert isinstance(later, Admitted) and 0.05 < later.waited < 5


def test_first_come_first_served() -> None:
    memory = budget(total=30 * KIB, wait=5)
    held = memory.reserve(13 * KIB)  # 19.5 KiB of 30
    assert isinstance(held, Admitted)
    order: list[str] = []

    def call(name: str, size: int) -> None:
        reservation = memory.reserve(size)
        assert isinstance(reservation, Admitted)
        order.append(name)
        reservation.release()

    threads = []
    # "first" (15 KiB) does not fit now; "second" (3 KiB) would, but it arrived later.
    for name, size in (("first", 10 * KIB), ("second", 2 * KIB)):
        thread = threading.Thread(target=call, args=(name, size))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 5
        while memory.waiting < len(threads):  # queued in this order
            assert time.monotonic() < deadline
            time.sleep(0.005)
    time.sleep(0.05)
    assert order == []  # the smaller, later call waits its turn
    held.release()
    for thread in threads:
        thread.join(5)
    assert order == ["first", "second"]


def test_when_the_head_of_the_line_gives_up_the_next_is_admitted_at_once() -> None:
    """The head's timeout wakes the next in line, which fits: it is admitted then, not left to
    time out itself."""
    memory = budget(total=30 * KIB, wait=0.6)
    held = memory.reserve(13 * KIB)  # 19.5 KiB of 30
    assert isinstance(held, Admitted)
    outcomes: dict[str, object] = {}

    def call(name: str, size: int) -> None:
        outcomes[name] = memory.reserve(size)

    head = threading.Thread(target=call, args=("head", 10 * KIB))  # 15 KiB: does not fit
    head.start()
    deadline = time.monotonic() + 5
    while memory.waiting < 1:
        assert time.monotonic() < deadline, "the head of the line never waited"
        time.sleep(0.005)
    time.sleep(0.2)
    nxt = threading.Thread(target=call, args=("next", 2 * KIB))  # 3 KiB: fits, waits its turn
    nxt.start()
    head.join(5)
    nxt.join(5)
    assert isinstance(outcomes["head"], TimedOut)
    admitted = outcomes["next"]
    assert isinstance(admitted, Admitted)
    assert admitted.waited < 0.55  # woken when the head left, at about 0.4 s of its 0.6 s
    admitted.release()
    held.release()


# --- how much, by default ----------------------------------------------------------------------


def test_the_default_budget_is_the_limit_less_what_the_process_keeps() -> None:
    assert budget_for_limit(2048 * MIB) == 1792 * MIB
    assert budget_for_limit(300 * MIB) == 150 * MIB  # small limits keep half
    assert budget_for_limit(300 * MIB + 1) == 150 * MIB + 1  # whole bytes: the process keeps less
    assert configured_budget(None, 2048 * MIB) == 1792 * MIB
    assert configured_budget(5 * MIB, 2048 * MIB) == 5 * MIB  # the setting wins
    assert configured_budget(0, 2048 * MIB) is None  # 0 turns it off
    assert configured_budget(None, None, read_limit=lambda: 1024 * MIB) == 768 * MIB
    assert configured_budget(None, None, read_limit=lambda: None) is None  # no limit, no budget


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"memory.max": "2147483648\n"}, 2147483648),
        ({"memory.max": "max\n"}, None),
        ({"memory/memory.limit_in_bytes": "1073741824\n"}, 1073741824),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),
        ({"memory.max": "garbage"}, None),
        ({}, None),
    ],
)
def test_the_container_limit_from_cgroup_v2_or_v1(
    tmp_path: Path, files: dict[str, str], limit: int | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert container_memory_limit(tmp_path) == limit


def exported_budget(settings: Settings) -> float:
    exported = Metrics(180.0)
    create_app(settings, metrics=exported)
    [line] = [
        line
        for line in exported.exposition()[0].decode().splitlines()
        if line.startswith("cozystack_gpu_hook_memory_budget_bytes ")
    ]
    return float(line.split()[1])


def test_settings_give_the_budget_to_the_app_less_the_admission_and_api_read_shares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Derived from the limit: the limit less the process's reserve, less what the admission
    port holds apart (`GPUCLASS_ADMISSION_MEMORY_BYTES`) and what API reads may hold
    (`GPUCLASS_KUBE_READ_MAX_BYTES`); a budget set is the hooks' whole."""
    monkeypatch.setenv("GPUCLASS_MEMORY_LIMIT_BYTES", str(2048 * MIB))
    assert exported_budget(Settings()) == (1792 - 32 - 64) * MIB
    monkeypatch.setenv("GPUCLASS_KUBE_READ_MAX_BYTES", str(128 * MIB))
    assert exported_budget(Settings()) == (1792 - 32 - 128) * MIB
    monkeypatch.setenv("GPUCLASS_MEMORY_BUDGET_BYTES", str(1000 * MIB))
    assert exported_budget(Settings()) == 1000 * MIB
    monkeypatch.setenv("GPUCLASS_MEMORY_BUDGET_BYTES", "0")
    exported = Metrics(180.0)
    create_app(Settings(), metrics=exported)
    assert "cozystack_gpu_hook_memory_budget_bytes 0.0" in exported.exposition()[0].decode()


# --- the routes ----------------------------------------------------------------------------------


@pytest.fixture
def memory() -> MemoryBudget:
    return budget(total=400 * KIB, wait=0.3)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(180.0)


def client_of(
    settings: Settings,
    memory: MemoryBudget,
    apart_from_bytes: int | None,
    metrics: Metrics | None = None,
) -> FlaskClient:
    small = settings.model_copy(update={"max_body_bytes": 200 * KIB})
    app = create_app(small, memory=memory, metrics=metrics, apart_from_bytes=apart_from_bytes)
    return app.test_client()


@pytest.fixture(params=[None, 0], ids=["in-thread", "apart"])
def budgeted_client(
    settings: Settings, memory: MemoryBudget, metrics: Metrics, request: pytest.FixtureRequest
) -> FlaskClient:
    """Every call computed in its thread, or every call computed in a process of its own."""
    return client_of(settings, memory, request.param, metrics)


@pytest.fixture
def thread_client(settings: Settings, memory: MemoryBudget) -> FlaskClient:
    """Calls computed in their thread, where a test can patch the controllers."""
    return client_of(settings, memory, None)


def sync_body(nodes: int = 40) -> bytes:
    request = status_sync_request(gpuclass("a"), nodes=[node(f"gpu-{i}") for i in range(nodes)])
    body = json.dumps(request).encode()
    assert KIB < len(body) < 200 * KIB
    return body


def test_released_after_an_answer(budgeted_client: FlaskClient, memory: MemoryBudget) -> None:
    assert budgeted_client.post("/status/sync", data=sync_body()).status_code == 200
    assert memory.reserved_bytes == 0


def test_released_after_a_400(budgeted_client: FlaskClient, memory: MemoryBudget) -> None:
    assert budgeted_client.post("/status/sync", data=b"{" * 4096).status_code == 400
    assert memory.reserved_bytes == 0


def test_released_after_a_413(budgeted_client: FlaskClient, memory: MemoryBudget) -> None:
    response = budgeted_client.post("/status/sync", data=b" " * (201 * KIB))
    assert response.status_code == 413
    assert memory.reserved_bytes == 0


def test_released_after_a_500(
    thread_client: FlaskClient, memory: MemoryBudget, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Computed apart: tests/serving/test_apart.py, where the child fails, dies or runs out of time.
    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("hooks.controllers.status.sync", broken)
    assert thread_client.post("/status/sync", data=sync_body()).status_code == 500
    assert memory.reserved_bytes == 0


def test_released_when_the_client_goes_away_mid_body(
    budgeted_client: FlaskClient, memory: MemoryBudget
) -> None:
    body = sync_body()
    response = budgeted_client.post(
        "/status/sync",
        input_stream=io.BytesIO(body[: len(body) // 2]),
        headers={"Content-Length": str(len(body)), "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert memory.reserved_bytes == 0


def test_held_while_the_call_runs(
    thread_client: FlaskClient, memory: MemoryBudget, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hooks.controllers import status

    seen: list[int] = []
    real = status.sync

    def observing(*args: object, **kwargs: object) -> object:
        seen.append(memory.reserved_bytes)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("hooks.controllers.status.sync", observing)
    body = sync_body()
    assert thread_client.post("/status/sync", data=body).status_code == 200
    assert seen == [memory.share(len(body))]


def test_a_call_that_waits_too_long_gets_429_with_retry_after(
    budgeted_client: FlaskClient, memory: MemoryBudget, metrics: Metrics
) -> None:
    held = memory.reserve(260 * KIB)  # 390 KiB of 400: no body larger than 6 KiB fits
    response = budgeted_client.post("/status/sync", data=sync_body())
    assert response.status_code == 429
    assert response.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert response.json == {"error": "the service is at its memory budget: retry later"}
    assert isinstance(held, Admitted)
    held.release()
    text = metrics.exposition()[0].decode()
    assert 'cozystack_gpu_hook_memory_refused_total{code="429"} 1.0' in text
    assert "cozystack_gpu_hook_memory_wait_seconds_count 1.0" in text


def test_a_call_that_can_never_fit_gets_413_naming_the_setting(
    settings: Settings,
) -> None:
    memory = budget(total=100 * KIB)
    metrics = Metrics(180.0)
    budgeted_client = create_app(settings, memory=memory, metrics=metrics).test_client()
    body = sync_body(200)
    assert memory.share(len(body)) > memory.budget_bytes
    response = budgeted_client.post("/status/sync", data=body)
    assert response.status_code == 413
    assert response.json["error"] == (
        f"a body of {len(body)} bytes needs {memory.share(len(body))} bytes of the memory budget "
        f"({memory.budget_bytes} bytes) and can never fit: raise GPUCLASS_MEMORY_BUDGET_BYTES or "
        "the memory limit, or shrink requests with GPUCLASS_POD_SELECTOR and "
        "GPUCLASS_NODE_SELECTOR"
    )
    text = metrics.exposition()[0].decode()
    assert 'cozystack_gpu_hook_memory_refused_total{code="413"} 1.0' in text
    assert 'cozystack_gpu_hook_memory_refused_total{code="429"} 0.0' in text


def test_a_chunked_body_that_could_exceed_the_budget_must_say_its_length(
    settings: Settings,
) -> None:
    budgeted_client = create_app(settings, memory=budget(total=100 * KIB)).test_client()
    response = budgeted_client.post(
        "/status/sync",
        input_stream=io.BytesIO(sync_body()),
        headers={"Transfer-Encoding": "chunked", "Content-Type": "application/json"},
    )
    assert response.status_code == 411


def test_small_calls_are_never_stuck_behind_a_waiting_sync(
    settings: Settings, memory: MemoryBudget
) -> None:
    app = create_app(settings, memory=memory)
    held = memory.reserve(260 * KIB)
    waiting = threading.Thread(
        target=lambda: app.test_client().post("/status/sync", data=sync_body())
    )
    waiting.start()
    deadline = time.monotonic() + 5
    while memory.waiting == 0:
        assert time.monotonic() < deadline, "the large call never waited"
        time.sleep(0.005)
    customize = {"controller": {}, "parent": gpuclass("a")}
    assert app.test_client().post("/status/customize", json=customize).status_code == 200
    assert memory.waiting == 1  # answered while the large call still waits
    waiting.join(5)
    assert isinstance(held, Admitted)
    held.release()


def test_unauthenticated_callers_never_hold_the_budget(
    settings: Settings, memory: MemoryBudget, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("right\n")
    budgeted_client = create_app(
        settings.model_copy(update={"auth_token_file": tokens}), memory=memory
    ).test_client()
    held = memory.reserve(260 * KIB)
    response = budgeted_client.post("/status/sync", data=sync_body())
    assert response.status_code == 401  # at once: it never queued
    assert memory.waiting == 0
    assert isinstance(held, Admitted)


def exact(total: int, wait: float = 0.05) -> MemoryBudget:
    """A budget whose share of a body is the body itself, bypassed below 10 bytes."""
    return MemoryBudget(
        total, max_wait_seconds=wait, expansion=1.0, per_call_bytes=0, bypass_below_bytes=10
    )


def test_a_body_just_below_the_bypass_reserves_nothing_and_one_at_it_reserves() -> None:
    memory = exact(100)
    below, at = memory.reserve(9), memory.reserve(10)
    assert isinstance(below, Admitted) and below.share == 0
    assert isinstance(at, Admitted) and at.share == 10
    assert memory.reserved_bytes == 10


def test_a_share_of_exactly_the_whole_budget_fits_and_one_byte_more_never_does() -> None:
    memory = exact(100)
    whole = memory.reserve(100)
    assert isinstance(whole, Admitted) and memory.reserved_bytes == 100
    whole.release()
    assert memory.reserve(101) == NeverFits(101)


def test_a_call_fits_beside_others_up_to_the_last_byte() -> None:
    memory = exact(100)
    first = memory.reserve(60)
    second = memory.reserve(40)
    assert isinstance(first, Admitted) and isinstance(second, Admitted)
    assert memory.reserved_bytes == 100


def test_a_call_that_waited_its_whole_time_says_its_share_and_how_long() -> None:
    now = [1000.0]

    def clock() -> float:
        now[0] += 0.5  # each look at the clock, half a second later
        return now[0]

    memory = MemoryBudget(
        100,
        max_wait_seconds=1.0,
        expansion=1.0,
        per_call_bytes=0,
        bypass_below_bytes=10,
        clock=clock,
    )
    held = memory.reserve(80)
    assert isinstance(held, Admitted)
    refused = memory.reserve(30)
    assert isinstance(refused, TimedOut)
    # started at 1000.5; 0.5 s left at 1001.0, none at 1001.5: refused then, told 1.5 s
    assert (refused.share, refused.waited) == (30, 1.5)


def test_the_services_budget_waits_as_long_as_the_settings_say() -> None:
    memory = memory_budget(Settings(memory_budget_bytes=100 * MIB, memory_wait_seconds=7))
    assert memory is not None
    assert (memory.budget_bytes, memory.max_wait_seconds) == (100 * MIB, 7)


@pytest.mark.parametrize(("value", "limit"), [(2**62 - 1, 2**62 - 1), (2**62, None)])
def test_a_cgroup_v1_limit_from_two_to_the_62_is_no_limit(
    tmp_path: Path, value: int, limit: int | None
) -> None:
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{value}\n")
    assert container_memory_limit(tmp_path) == limit
