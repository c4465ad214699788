"""One deadline per call (docs/operating.md, "How long a caller can be held"): set from when the
edge took the call, derived from what its caller waits, spent by every step; and a call that
cannot start in time refused at once, 429 with Retry-After."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from hooks.kubeapi.client import CALL_DEADLINE
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import Tenancy
from hooks.serving import edge, http
from hooks.serving.app import create_app
from hooks.serving.guard import Backlog, Guard, HeadChecks, Refusal
from hooks.serving.metrics import Metrics
from hooks.settings import Settings
from tests.builders import GPU, admission_review, example_of, gpus
from tests.fake_apiserver import FakeApiServer, Route

NOW = 1000.0
HTTPS = "https://localhost"  # the admission routes answer HTTPS only


class Recording:
    """Budget inputs that note how long the review had left when it read them."""

    def __init__(self) -> None:
        self.left: list[float] = []

    def catalog(self) -> Catalog:
        return Catalog()

    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        deadline = CALL_DEADLINE.get()
        assert deadline is not None
        self.left.append(deadline - http.now())
        return Tenancy()


def review() -> dict[str, Any]:
    return admission_review("VMInstance", "tenant-a", "v", {"gpus": gpus(GPU)})


def test_answer_within_is_what_the_caller_waits_less_a_margin() -> None:
    settings = Settings(admission_timeout_seconds=10, hook_timeout="30s")
    assert settings.answer_within_seconds("apiserver") == 9.0
    assert settings.answer_within_seconds("metacontroller") == 29.0
    short = Settings(admission_timeout_seconds=2, hook_timeout="5s")
    assert short.answer_within_seconds("apiserver") == pytest.approx(1.8)
    assert short.answer_within_seconds("metacontroller") == pytest.approx(4.5)


def test_a_review_reads_the_api_within_the_webhooks_timeout_less_its_margin(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline is set when the edge took the call: a review that waited 2 s for a thread
    has 7 s left of the default 9, less the moment its answer takes to write."""
    monkeypatch.setattr(http, "now", lambda: NOW)
    inputs = Recording()
    client = create_app(settings, budgets=inputs).test_client()  # type: ignore[arg-type]
    assert client.post("/admit/gpu-budget", json=review(), base_url=HTTPS).status_code == 200
    response = client.post(
        "/admit/gpu-budget",
        json=review(),
        base_url=HTTPS,
        environ_overrides={http.ACCEPTED_AT: NOW - 2.0},
    )
    assert response.status_code == 200
    reserve = http.ANSWER_RESERVE_SECONDS
    assert inputs.left == [9.0 - reserve, 7.0 - reserve]


def test_a_review_whose_read_does_not_finish_in_time_fails_closed_naming_it(
    settings: Settings, apiserver: FakeApiServer
) -> None:
    """The API server answers slower than the review may wait: a denial naming the read, given
    before the API server itself gives up on the webhook."""
    apiserver.routes["/apis/helm.toolkit.fluxcd.io/v2/helmreleases"] = Route(
        200, {"kind": "List", "items": []}, delay=20
    )
    slow = settings.model_copy(update={"admission_timeout_seconds": 3, "kube_timeout_seconds": 30})
    client = create_app(slow).test_client()
    answer = client.post("/admit/gpu-budget", json=review(), base_url=HTTPS).get_json()["response"]
    assert answer["allowed"] is False
    assert answer["status"]["message"] == (
        "GPU budget check failed closed: could not list HelmReleases (timed out)"
    )


def test_a_call_that_waited_half_its_time_for_a_thread_is_refused_at_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "now", lambda: NOW)
    metrics = Metrics(180.0)
    client = create_app(settings, metrics=metrics).test_client()
    late = client.post(
        "/status/customize",
        data=example_of("/status/customize"),
        environ_overrides={http.ACCEPTED_AT: NOW - 15.0},  # of 29 s
    )
    assert late.status_code == 429
    assert (late.headers["Retry-After"], late.headers["Connection"]) == ("1", "close")
    assert "waited 15.0 s for a thread" in late.get_json()["error"]
    in_time = client.post(
        "/status/customize",
        data=example_of("/status/customize"),
        environ_overrides={http.ACCEPTED_AT: NOW - 14.0},
    )
    assert in_time.status_code == 200
    assert metrics.calls_refused_busy._value.get() == 1.0


def test_latency_counts_from_when_the_edge_took_the_call(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The histogram callers' waits are compared with: the thread wait included, and observed
    on its own too."""
    monkeypatch.setattr(http, "now", lambda: NOW)
    metrics = Metrics(180.0)
    client = create_app(settings, metrics=metrics).test_client()
    client.post(
        "/status/customize",
        data=example_of("/status/customize"),
        environ_overrides={http.ACCEPTED_AT: NOW - 3.0},
    )
    latency = metrics.latency.labels(route="/status/customize")
    assert latency._sum.get() == 3.0
    assert metrics.thread_wait._sum.get() == 3.0


def test_the_backlog_expects_a_wait_only_past_the_threads() -> None:
    backlog = Backlog(threads=4)
    for _ in range(4):
        backlog.handed()
    assert backlog.expected_wait() == 0.0  # a thread is free for the first four
    backlog.answered(2.0)  # one took 2 s
    for _ in range(8):
        backlog.handed()
    # 11 in hand: the next waits for 8 ahead of it over 4 threads at 2 s each
    assert backlog.expected_wait() == 8 * 2.0 / 4
    backlog.answered(0.0)
    assert backlog.per_call == pytest.approx(1.6)  # the average moves a fifth of the way


def head_checks(settings: Settings, callers: str, threads: int = 2) -> HeadChecks:
    return HeadChecks(
        Guard(settings, None),
        settings,
        Metrics(180.0),
        callers=frozenset({callers}),
        secure=True,
        backlog=Backlog(threads),
        elsewhere="elsewhere",
    )


def test_the_edge_refuses_at_once_a_call_that_would_wait_past_half_its_time(
    settings: Settings,
) -> None:
    """Decided in the event loop, before a thread is taken: 429 with Retry-After."""
    checks = head_checks(settings, "metacontroller")
    head = edge.parse_head(b"POST /status/sync HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head is not None
    checks.backlog.per_call = 10.0
    checks.backlog.busy = 2  # both threads taken: the next call is 5 s away, of its 29
    assert checks.refusal(head) is None
    checks.backlog.busy = 3  # one more ahead of it: 10 s away
    assert checks.refusal(head) is None
    checks.backlog.busy = 4  # 15 s away, past half of 29
    assert checks.refusal(head) == Refusal(
        429, "the service is busy: a thread is 15.0 s away; retry later", {"Retry-After": "1"}
    )
    # a customize call is never shed: refused, its parent would lose its related events
    customize = edge.parse_head(b"POST /status/customize HTTP/1.1\r\nHost: x\r\n\r\n")
    assert customize is not None and checks.refusal(customize) is None
    reviews = head_checks(settings, "apiserver")
    review = edge.parse_head(b"POST /admit/gpu-budget HTTP/1.1\r\nHost: x\r\n\r\n")
    assert review is not None
    reviews.backlog.per_call, reviews.backlog.busy = 10.0, 2  # 5 s away: past half of its 9
    refusal = reviews.refusal(review)
    assert refusal is not None and refusal.code == 429


def test_a_call_the_edge_refuses_is_counted_under_its_route_or_unmatched(
    settings: Settings,
) -> None:
    """Every scanner path its own series would explode the metrics: a path that is no hook is
    counted as `unmatched`, as the app counts it."""
    checks = head_checks(settings, "metacontroller")
    for path in (b"/wp-admin/setup.php", b"/status/customize"):
        head = edge.parse_head(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head is not None
        refusal = checks.refusal(head)
        assert refusal is not None
        checks.refused(head, refusal, since=http.now())
    routes = {
        sample.labels["route"]
        for family in checks._metrics.registry.collect()
        if family.name == "cozystack_gpu_hook_requests"
        for sample in family.samples
    }
    assert routes == {"unmatched", "/status/customize"}


def test_each_port_refuses_the_routes_of_the_other_naming_where_they_are_served(
    settings: Settings,
) -> None:
    """A review sent to the hook port, or a hook to the admission port: 404 at the head, never
    a thread, with where to call instead."""
    hooks, reviews = head_checks(settings, "metacontroller"), head_checks(settings, "apiserver")
    review = edge.parse_head(b"POST /admit/gpu-budget HTTP/1.1\r\nContent-Length: 2\r\n\r\n")
    sync = edge.parse_head(b"POST /status/sync HTTP/1.1\r\nContent-Length: 2\r\n\r\n")
    assert review is not None and sync is not None
    assert hooks.refusal(review) == Refusal(
        404, "/admit/gpu-budget is not served on this port: elsewhere"
    )
    assert reviews.refusal(sync) == Refusal(
        404, "/status/sync is not served on this port: elsewhere"
    )
    assert hooks.refusal(sync) is None and reviews.refusal(review) is None


def test_a_refusal_is_timed_from_its_own_head_not_from_the_connections_accept(
    settings: Settings,
) -> None:
    """A 405 on a kept-alive connection that idled for seconds before it took no seconds: its
    duration (log line, histogram) counts from when its head began."""
    checks = head_checks(settings, "metacontroller")
    timed_from: list[float] = []
    refused = checks.refused

    def refused_since(head: edge.Head, refusal: Refusal, since: float) -> bytes:
        timed_from.append(since)
        return refused(head, refusal, since)

    checks.refused = refused_since  # type: ignore[method-assign]
    kept_alive = edge.Connection(
        sock=None,  # type: ignore[arg-type]
        address=None,
        state=edge.State.READING_HEADERS,
        deadline=0.0,
        accepted_at=100.0,
        head_started=103.0,
    )
    answered: list[bytes] = []

    class Answering:
        def respond(self, connection: edge.Connection, data: bytes) -> None:
            answered.append(data)

    head = b"GET /status/customize HTTP/1.1\r\nHost: x\r\n\r\n"
    assert checks.passed(Answering(), kept_alive, head) is None  # type: ignore[arg-type]
    assert answered[0].startswith(b"HTTP/1.1 405 ")
    assert timed_from == [103.0]


def test_the_wait_for_a_thread_counts_from_the_hand_off_not_from_the_first_byte(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review whose body took 5 s to arrive, handed to an idle thread at once, waited for
    nothing: it is judged, within what is left of its deadline (counted from its head)."""
    monkeypatch.setattr(http, "now", lambda: NOW)
    inputs = Recording()
    metrics = Metrics(180.0)
    client = create_app(settings, budgets=inputs, metrics=metrics).test_client()  # type: ignore[arg-type]
    response = client.post(
        "/admit/gpu-budget",
        json=review(),
        base_url=HTTPS,
        environ_overrides={http.ACCEPTED_AT: NOW - 5.0, http.HANDED_AT: NOW},
    )
    assert response.status_code == 200
    assert metrics.thread_wait._sum.get() == 0.0
    assert inputs.left == [9.0 - 5.0 - http.ANSWER_RESERVE_SECONDS]
