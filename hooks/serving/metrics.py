"""Prometheus metrics: per-class capacity and use, and the hooks' own traffic.

Class series come from a custom collector over the latest computation of each class, so that a
series can disappear: series older than three status resync periods
(`GPUCLASS_STATUS_RESYNC_SECONDS`, which the chart passes) are dropped at scrape, and a class
missing from a sync's full class list is forgotten at once. That is also why the service runs one
process with threads: prometheus-client's multiprocess mode cannot remove a series.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hooks.controllers.status import ClassComputation
from hooks.kubeapi.kubevirt import ReadOutcome
from hooks.routes import (
    BudgetUsageObserved,
    InstanceTypesObserved,
    LicenseCopiesObserved,
    Observation,
)
from hooks.rules.budget.usage import PoolUse
from hooks.serving import logs
from hooks.serving.credentials import CredentialWatch
from hooks.serving.edge import DROP_REASONS, TLS_FAILURE_REASONS, Allowance, Edge
from hooks.serving.memory import MemoryBudget

BODY_BUCKETS = tuple(float(2**n) for n in range(10, 31, 2))  # powers of 4, 2**10 .. 2**30 bytes
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60)


@dataclass(frozen=True)
class ClassSample:
    """One class's last computation, and when it was recorded."""

    computation: ClassComputation
    computed_at: float


@dataclass(frozen=True)
class LicenseSample:
    copies: int
    computed_at: float


class ClassCollector(Collector):
    """Thread-safe store of the latest sample per class, exported at scrape time."""

    def __init__(self, stale_after_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self._stale_after = stale_after_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._classes: dict[str, ClassSample] = {}
        self._licenses: dict[str, LicenseSample] = {}

    def record(self, name: str, sample: ClassSample) -> None:
        with self._lock:
            self._classes[name] = sample

    def record_license(self, name: str, copies: int) -> None:
        with self._lock:
            self._licenses[name] = LicenseSample(copies, self._clock())

    def forget_license(self, name: str) -> None:
        with self._lock:
            self._licenses.pop(name, None)

    def retain_only(self, names: Iterable[str]) -> None:
        """Forget every class not in the full class list a sync just saw (deleted classes)."""
        keep = set(names)
        with self._lock:
            for store in (self._classes, self._licenses):
                for name in [n for n in store if n not in keep]:
                    del store[name]

    def now(self) -> float:
        return self._clock()

    def _fresh(self) -> tuple[dict[str, ClassSample], dict[str, LicenseSample]]:
        oldest = self._clock() - self._stale_after
        with self._lock:
            for store in (self._classes, self._licenses):
                for name in [n for n, s in store.items() if s.computed_at < oldest]:
                    del store[name]
            return dict(self._classes), dict(self._licenses)

    def collect(self) -> Iterator[Metric]:
        classes, licenses = self._fresh()
        labels = ["class", "resource", "eligible"]
        capacity = GaugeMetricFamily(
            "cozystack_gpu_class_capacity_units",
            "Allocatable units of the class's resource, over eligible nodes and over the other "
            "nodes that advertise it",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "cozystack_gpu_class_used_units",
            "Effective requested units of the class's resource, split like capacity",
            labels=labels,
        )
        free = GaugeMetricFamily(
            "cozystack_gpu_class_free_units", "The class's status.free", labels=["class"]
        )
        max_free = GaugeMetricFamily(
            "cozystack_gpu_class_max_free_per_node_units",
            "The class's status.maxFreePerNode",
            labels=["class"],
        )
        condition = GaugeMetricFamily(
            "cozystack_gpu_class_condition",
            "1 per class and condition type, labelled with its current status and reason",
            labels=["class", "type", "status", "reason"],
        )
        last_sync = GaugeMetricFamily(
            "cozystack_gpu_class_last_sync_timestamp_seconds",
            "When this replica last computed the class's status",
            labels=["class"],
        )
        copies = GaugeMetricFamily(
            "cozystack_gpu_class_license_copies",
            "Entitled namespaces holding a license copy of the class",
            labels=["class"],
        )
        for name, sample in sorted(classes.items()):
            last_sync.add_metric([name], sample.computed_at)
            computed, resource = sample.computation, sample.computation.resource
            for item in computed.conditions:
                condition.add_metric([name, item.type, item.status, item.reason], 1.0)
            # a conflicting class reports zero and exports no inventory
            if computed.capacity is None or resource is None or not computed.exports_inventory:
                continue
            free.add_metric([name], computed.free)
            max_free.add_metric([name], computed.max_free_per_node)
            for eligible in (True, False):
                total, use = computed.capacity.totals(eligible=eligible)
                flag = "true" if eligible else "false"
                capacity.add_metric([name, resource, flag], total)
                used.add_metric([name, resource, flag], use)
        for name, license_sample in sorted(licenses.items()):
            copies.add_metric([name], license_sample.copies)
        yield from (capacity, used, free, max_free, condition, last_sync, copies)

    def describe(self) -> Iterator[Metric]:
        return iter(())


class BudgetCollector(Collector):
    """The pool reports this replica computed, exported at scrape time: one series per bounded
    tenant and key it declares, each pool as its last report left it and stamped with when, gone
    three report resync periods after that report or at once when a sync that decides its
    namespace finds no pool there."""

    def __init__(self, stale_after_seconds: float, clock: Callable[[], float]) -> None:
        self._stale_after = stale_after_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._pools: dict[str, tuple[PoolUse, float]] = {}

    def record(self, namespaces: Iterable[str], pools: Iterable[PoolUse]) -> None:
        """What one sync decided: each pool it found, and no pool in its other namespaces."""
        now = self._clock()
        with self._lock:
            for namespace in namespaces:
                self._pools.pop(namespace, None)
            for pool in pools:
                self._pools[pool.namespace] = (pool, now)

    def _current(self) -> list[tuple[PoolUse, float]]:
        """The pools reported within the staleness window, with when (older ones forgotten)."""
        oldest = self._clock() - self._stale_after
        with self._lock:
            for namespace in [n for n, (_, at) in self._pools.items() if at < oldest]:
                del self._pools[namespace]
            return [reported for _, reported in sorted(self._pools.items())]

    def collect(self) -> Iterator[Metric]:
        pools = self._current()
        labels = ["namespace", "tenant", "key"]
        families = {
            field: GaugeMetricFamily(name, about, labels=labels)
            for field, name, about in (
                ("budget", "cozystack_gpu_budget_units", "The pool's budget for the key"),
                (
                    "carved_out",
                    "cozystack_gpu_budget_carved_out_units",
                    "What the bounded tenants in the pool carve out of the key",
                ),
                (
                    "reserved",
                    "cozystack_gpu_budget_reserved_units",
                    "What the apps of the pool's members reserve of the key",
                ),
                (
                    "left",
                    "cozystack_gpu_budget_left_units",
                    "Budget less carve-outs less reservations; below 0 the pool is over budget",
                ),
            )
        }
        unreadable = GaugeMetricFamily(
            "cozystack_gpu_budget_pool_unreadable",
            "1 per pool whose figures cannot be known: its arithmetic reads an object that does "
            "not decode",
            labels=["namespace", "tenant"],
        )
        stamp = GaugeMetricFamily(
            "cozystack_gpu_budget_report_timestamp_seconds",
            "When this replica last computed the pool's report",
            labels=["namespace", "tenant"],
        )
        for pool, computed_at in pools:
            stamp.add_metric([pool.namespace, pool.tenant], computed_at)
            if pool.unreadable is not None:
                unreadable.add_metric([pool.namespace, pool.tenant], 1.0)
            for use in pool.keys:
                for field, family in families.items():
                    family.add_metric([pool.namespace, pool.tenant, use.key], getattr(use, field))
        yield from (*families.values(), unreadable, stamp)

    def describe(self) -> Iterator[Metric]:
        return iter(())


# The ports whose connections the edge keeps (`hooks.serving.edge`).
LISTENERS = ("hooks", "admission", "health", "metrics")


class ConnectionCollector(Collector):
    """Open connections of each listener by state, and the bytes they hold outside a call, read
    from its edge when scraped."""

    def __init__(self) -> None:
        self._edges: dict[str, Edge] = {}

    def watch(self, listener: str, edge: Edge) -> None:
        self._edges[listener] = edge

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "cozystack_gpu_hook_connections",
            "Open connections by listener and state (handshaking, reading_headers, "
            "reading_body, idle, in_call, closing)",
            labels=["listener", "state"],
        )
        held = GaugeMetricFamily(
            "cozystack_gpu_hook_connection_held_bytes",
            "What a listener's connections outside a call hold (their buffers and heads), as "
            "counted against its bound",
            labels=["listener"],
        )
        for listener, edge in sorted(self._edges.items()):
            for state, count in edge.counts().items():
                family.add_metric([listener, state], count)
            held.add_metric([listener], edge.held_bytes)
        yield family
        yield held

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("cozystack_gpu_hook_connections", "", labels=["listener", "state"])
        yield GaugeMetricFamily("cozystack_gpu_hook_connection_held_bytes", "", labels=["listener"])


# The kernel's count of connections its listen queues could not take, for the pod's network
# namespace (every port of the pod): TcpExt's ListenOverflows in /proc/net/netstat.
NETSTAT = Path("/proc/net/netstat")


def listen_overflows(netstat: Path = NETSTAT) -> int | None:
    """ListenOverflows from a netstat file; None where it cannot be read (not Linux)."""
    try:
        lines = netstat.read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            value = table.get("ListenOverflows")
            return int(value) if value is not None and value.isdigit() else None
    return None


class ListenOverflowCollector(Collector):
    """The kernel's listen overflows, read when scraped."""

    def __init__(self, netstat: Path = NETSTAT) -> None:
        self._netstat = netstat

    def collect(self) -> Iterator[Metric]:
        count = listen_overflows(self._netstat)
        if count is not None:
            yield CounterMetricFamily(
                "cozystack_gpu_hook_listen_overflows",
                "Connections the kernel refused because a listen queue of the pod was full "
                "(TcpExt ListenOverflows of the pod's network namespace, every port included)",
                value=count,
            )

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily("cozystack_gpu_hook_listen_overflows", "", value=0)


class CredentialCollector(Collector):
    """Each credential file's state (`hooks.serving.credentials`), read when scraped."""

    def __init__(self) -> None:
        self._watch: CredentialWatch | None = None

    def watch(self, watch: CredentialWatch) -> None:
        self._watch = watch

    def collect(self) -> Iterator[Metric]:
        valid = GaugeMetricFamily(
            "cozystack_gpu_hook_credential_valid",
            "1 while a credential file (token, serving_pair) reads valid; 0 while it is missing, "
            "unreadable, empty or does not load (the last good material is kept, or no token)",
            labels=["kind"],
        )
        since = GaugeMetricFamily(
            "cozystack_gpu_hook_credential_changed_timestamp_seconds",
            "When a credential file last became valid or invalid (Unix time)",
            labels=["kind"],
        )
        for item in self._watch.watched if self._watch else ():
            valid.add_metric([item.kind], 1.0 if item.valid else 0.0)
            since.add_metric([item.kind], item.since)
        yield valid
        yield since

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("cozystack_gpu_hook_credential_valid", "", labels=["kind"])
        yield GaugeMetricFamily(
            "cozystack_gpu_hook_credential_changed_timestamp_seconds", "", labels=["kind"]
        )


class LogCollector(Collector):
    """Log lines this process dropped because stderr was not read in time (`hooks.serving.logs`),
    read when scraped."""

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "cozystack_gpu_log_lines_dropped",
            "Log lines dropped because stderr was not read in time (a stalled log pipeline); "
            "serving never waits for it",
            value=logs.dropped_lines(),
        )

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily("cozystack_gpu_log_lines_dropped", "", value=0)


class Metrics:
    """Everything the service exports, in its own registry (one per app, so tests are isolated).
    Class series older than `stale_after_seconds` are dropped at scrape, pool series older than
    `budget_stale_after_seconds` (the same unless given)."""

    def __init__(
        self,
        stale_after_seconds: float,
        clock: Callable[[], float] = time.time,
        budget_stale_after_seconds: float | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.classes = ClassCollector(stale_after_seconds, clock)
        self.registry.register(self.classes)
        budget_stale = budget_stale_after_seconds or stale_after_seconds
        self.budgets = BudgetCollector(budget_stale, clock)
        self.registry.register(self.budgets)
        self.requests = Counter(
            "cozystack_gpu_hook_requests_total",
            "Hook calls by route template and HTTP code",
            ["route", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "cozystack_gpu_hook_request_duration_seconds",
            "Time to answer a hook call, by route template, from when the edge took it (its wait "
            "for a thread included)",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.body_bytes = Histogram(
            "cozystack_gpu_hook_request_body_bytes",
            "Size of hook request bodies, by route template",
            ["route"],
            buckets=BODY_BUCKETS,
            registry=self.registry,
        )
        self.kubevirt_reads = Counter(
            "cozystack_gpu_kubevirt_reads_total",
            "Reads of the KubeVirt CR by outcome (found, absent, unreadable)",
            ["outcome"],
            registry=self.registry,
        )
        self.budget_reviews = Counter(
            "cozystack_gpu_budget_reviews_total",
            "Budget reviews answered, by verdict: allowed, denied, or failed_closed (denied "
            "because an input could not be read)",
            ["verdict"],
            registry=self.registry,
        )
        # Every known label value from the start: a counter's first increase is then a rate
        # like any other, not a series appearing (which rate() and the alerts cannot see).
        for verdict in ("allowed", "denied", "failed_closed"):
            self.budget_reviews.labels(verdict=verdict)
        self.unnamed_instance_types = Gauge(
            "cozystack_gpu_budget_instance_type_unnamed",
            "1 per cluster instance type that attaches GPUs but that the webhook's match "
            "conditions do not name (admission.gpuInstanceTypes): a VM naming it and listing no "
            "gpus entries is admitted without a budget check",
            ["instance_type"],
            registry=self.registry,
        )

        self.calls_in_progress = Gauge(
            "cozystack_gpu_hook_calls_in_progress",
            "Hook calls being answered, each holding one of the worker's threads",
            registry=self.registry,
        )
        self.calls_queued = Gauge(
            "cozystack_gpu_hook_calls_queued",
            "Connections with a request waiting for a free thread of the worker",
            registry=self.registry,
        )
        self.threads = Gauge(
            "cozystack_gpu_hook_threads",
            "Threads the worker answers hook calls with",
            registry=self.registry,
        )
        self.apart_calls = Counter(
            "cozystack_gpu_hook_apart_calls_total",
            "Large calls computed in a process of their own, by outcome (answered, bad_request, "
            "not_read, ChildDied, DeadlineExceeded, StartTimedOut, ...)",
            ["outcome"],
            registry=self.registry,
        )

        self.connections_dropped = Counter(
            "cozystack_gpu_hook_connections_dropped_total",
            "Connections closed before their request was served, by listener (hooks, "
            "admission, health, metrics) and reason (" + ", ".join(DROP_REASONS) + ")",
            ["listener", "reason"],
            registry=self.registry,
        )
        for listener in LISTENERS:
            for reason in DROP_REASONS:
                self.connections_dropped.labels(listener=listener, reason=reason)
        self.tls_handshake_failures = Counter(
            "cozystack_gpu_hook_tls_handshake_failures_total",
            "TLS handshakes that failed, by listener (hooks, admission, metrics) and reason "
            "(certificate_rejected, client_certificate, plain_http, protocol, other)",
            ["listener", "reason"],
            registry=self.registry,
        )
        self.certificate_expiry = Gauge(
            "cozystack_gpu_hook_certificate_expiry_timestamp_seconds",
            "When the certificate each TLS listener serves ends (Unix time); it is read again "
            "on the first connection after its files change",
            ["listener"],
            registry=self.registry,
        )
        self._connections = ConnectionCollector()
        self.registry.register(self._connections)
        self.registry.register(ListenOverflowCollector())
        self.registry.register(LogCollector())
        self._credentials = CredentialCollector()
        self.registry.register(self._credentials)

        self.admission_memory = Gauge(
            "cozystack_gpu_hook_admission_memory_bytes",
            "The admission port's share of memory: bytes of review bodies held at once",
            registry=self.registry,
        )
        self.admission_memory_held = Gauge(
            "cozystack_gpu_hook_admission_memory_held_bytes",
            "Bytes of review bodies the admission port holds now (received, or being judged) and "
            "of its connections reading them",
            registry=self.registry,
        )
        self.memory_budget = Gauge(
            "cozystack_gpu_hook_memory_budget_bytes",
            "The memory budget for request bodies in flight (0: none)",
            registry=self.registry,
        )
        self.memory_reserved = Gauge(
            "cozystack_gpu_hook_memory_reserved_bytes",
            "Budget reserved by calls in flight (their expanded body sizes)",
            registry=self.registry,
        )
        self.memory_waiting = Gauge(
            "cozystack_gpu_hook_memory_waiting_calls",
            "Calls waiting for the memory budget",
            registry=self.registry,
        )
        self.memory_refused = Counter(
            "cozystack_gpu_hook_memory_refused_total",
            "Calls refused by the memory budget: 429 (waited too long) or 413 (can never fit)",
            ["code"],
            registry=self.registry,
        )
        for code in ("429", "413"):
            self.memory_refused.labels(code=code)
        self.memory_wait = Histogram(
            "cozystack_gpu_hook_memory_wait_seconds",
            "Time calls waited for the memory budget before they were admitted or refused",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.thread_wait = Histogram(
            "cozystack_gpu_hook_thread_wait_seconds",
            "Time calls waited for a thread of the worker, from when the edge handed them over "
            "(the head whole; a review's body whole)",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.calls_refused_busy = Counter(
            "cozystack_gpu_hook_calls_refused_busy_total",
            "Calls answered 429 because the calls ahead of them would not let them be answered "
            "in time",
            registry=self.registry,
        )

    def exposition(self) -> tuple[bytes, str]:
        """What a scrape gets: every series in the text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def watch_credentials(self, watch: CredentialWatch) -> None:
        self._credentials.watch(watch)

    def watch_threads(self, threads: int, queued: Callable[[], int]) -> None:
        """Export the worker's thread count, and read its queue of waiting calls at each scrape."""
        self.threads.set(threads)
        self.calls_queued.set_function(queued)

    def watch_connections(self, listener: str, edge: Edge) -> None:
        """Read a listener's open connections by state, and what they hold, at each scrape."""
        self._connections.watch(listener, edge)

    def watch_admission_memory(self, allowance: Allowance) -> None:
        """The admission port's share of memory, and what its reviews hold of it now."""
        self.admission_memory.set(allowance.limit_bytes)
        self.admission_memory_held.set_function(lambda: allowance.used_bytes)

    def watch_client_certificates(self, not_after: Callable[[], float]) -> None:
        """The hook port with client certificates required: when the last one presented ends.
        Exported only then: a series at 0 elsewhere would read as a certificate long ended."""
        Gauge(
            "cozystack_gpu_hook_client_certificate_expiry_timestamp_seconds",
            "When the client certificate last presented on the hook port ends (Unix time; "
            "with client certificates required)",
            registry=self.registry,
        ).set_function(not_after)

    def watch_tls(self, listener: str, not_after: Callable[[], float]) -> None:
        """A TLS listener: its handshake failures by reason (all at zero from the start), and
        the end of the certificate it serves, read at each scrape."""
        for reason in TLS_FAILURE_REASONS:
            self.tls_handshake_failures.labels(listener=listener, reason=reason)
        self.certificate_expiry.labels(listener=listener).set_function(not_after)

    def watch_memory(self, budget: MemoryBudget | None) -> None:
        """Export the budget, and read what is reserved and waiting at each scrape."""
        self.memory_budget.set(budget.budget_bytes if budget is not None else 0)
        if budget is not None:
            self.memory_reserved.set_function(lambda: budget.reserved_bytes)
            self.memory_waiting.set_function(lambda: budget.waiting)

    def record(self, observation: Observation) -> None:
        """A sync's observation, recorded where its answer is sent (so that a sync computed in
        another process is recorded all the same)."""
        if isinstance(observation, ClassComputation):
            self._record_status(observation)
        elif isinstance(observation, LicenseCopiesObserved):
            self._record_license(observation)
        elif isinstance(observation, BudgetUsageObserved):
            self.budgets.record(observation.namespaces, observation.pools)
        elif isinstance(observation, InstanceTypesObserved):
            self.unnamed_instance_types.clear()
            for name in observation.unnamed:
                self.unnamed_instance_types.labels(instance_type=name).set(1)
        else:
            self.budget_reviews.labels(verdict=observation.verdict).inc()

    def _record_status(self, computed: ClassComputation) -> None:
        """A status sync: forget deleted classes, and keep this class's computation."""
        if computed.known_classes is not None:
            self.classes.retain_only(computed.known_classes)
        if computed.conditions:
            self.classes.record(computed.class_name, ClassSample(computed, self.classes.now()))

    def _record_license(self, observed: LicenseCopiesObserved) -> None:
        """A license sync: its copies, or no series for a class that holds no license."""
        if observed.copies is None:
            self.classes.forget_license(observed.class_name)
        else:
            self.classes.record_license(observed.class_name, observed.copies)

    def record_kubevirt_read(self, outcome: ReadOutcome) -> None:
        self.kubevirt_reads.labels(outcome=outcome).inc()

    def observe_call(self, route: str, code: int, seconds: float, body_bytes: int) -> None:
        self.requests.labels(route=route, code=str(code)).inc()
        self.latency.labels(route=route).observe(seconds)
        self.body_bytes.labels(route=route).observe(body_bytes)
