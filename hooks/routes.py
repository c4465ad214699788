"""The table of hooks: every route the service answers with a hook, declared once.

Each entry says who calls it and how a body becomes an answer (decode, call the controller,
encode, and for a sync the outcome its metrics record). `create_app` serves the table, the bearer
token guards what Metacontroller calls, and the tests, the fuzzer and the chart's checks read the
same table, so a hook added here is served, guarded, fuzzed and checked without another list to
update.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import msgspec

from hooks.controllers import (
    budget,
    budget_report,
    license,
    resource_labels,
    status,
    tenant_namespaces,
)
from hooks.controllers.budget import BudgetInputs, BudgetOutcome
from hooks.controllers.license import LicenseOutcome
from hooks.controllers.status import ClassComputation, StatusOutcome
from hooks.rules.budget.usage import PoolUse
from hooks.rules.permitted_devices import KubeVirtView
from hooks.settings import Settings
from hooks.wire.admission import AdmissionRequest, decode_review, review_response
from hooks.wire.metacontroller import (
    CompositeSyncResponse,
    CustomizeRequest,
    CustomizeResponse,
    DecoratorSyncResponse,
    LabelsResponse,
    TargetPod,
    check_report_target,
    decode_class_index_sync,
    decode_composite_sync,
    decode_decorator_sync,
    decode_envelope,
    decode_namespace,
    decode_report_sync,
    decode_resource_target_sync,
    decode_tenant_namespace_sync,
    encode,
)
from hooks.wire.names import namespaced_key
from hooks.wire.problems import BadRequest


# --- what a hook's handler gives back, wherever it ran ---------------------------------------
@dataclass(frozen=True)
class LicenseCopiesObserved:
    """A license sync as the metrics see it: the copies it keeps, or None for a class that holds
    no license (its series goes)."""

    class_name: str
    copies: int | None


@dataclass(frozen=True)
class BudgetReviewObserved:
    """A budget review as the metrics see it: allowed, denied by the budget rules, or denied
    because an input could not be read (the webhook fails closed)."""

    verdict: Literal["allowed", "denied", "failed_closed"]


@dataclass(frozen=True)
class BudgetUsageObserved:
    """A report target's sync as the metrics see it: the namespaces whose pools it decided, and
    the pools it found among them (a namespace without one has none, or no longer)."""

    namespaces: tuple[str, ...]
    pools: tuple[PoolUse, ...]


@dataclass(frozen=True)
class InstanceTypesObserved:
    """The class index's sync as the metrics see it: the instance types that attach GPUs but
    that the webhook's match conditions do not name."""

    unnamed: tuple[str, ...]


Observation = (
    ClassComputation
    | LicenseCopiesObserved
    | BudgetReviewObserved
    | BudgetUsageObserved
    | InstanceTypesObserved
)


@dataclass(frozen=True)
class Answer:
    """What a hook answers: the payload, the fields of its log line, the objects it skipped
    because they did not decode (named in one warning, with `about` saying where), and for a sync
    what its metrics record."""

    payload: bytes
    facts: dict[str, Any]
    skipped: Sequence[str] = ()
    about: dict[str, str] = field(default_factory=dict)
    observation: Observation | None = None


class FailedElsewhere(Exception):
    """An unexpected error where its traceback cannot follow (in another process): its type and
    last frames, which is all the serving process logs of any unexpected error."""

    def __init__(self, error_type: str, frames: list[str]) -> None:
        super().__init__(error_type)
        self.error_type = error_type
        self.frames = frames


# --- the table ---------------------------------------------------------------------------------

# Metacontroller sends the hooks' bearer token; the API server calls admission webhooks over
# HTTPS only and sends no token, so its routes refuse plain HTTP instead.
Caller = Literal["metacontroller", "apiserver"]


@dataclass(frozen=True)
class HookInputs:
    """What the hooks read besides the request: settings, the edges, the clock."""

    settings: Settings
    kubevirt: Callable[[], KubeVirtView]
    budgets: BudgetInputs
    clock: Callable[[], datetime]


Handler = Callable[[HookInputs, bytes], Answer]


@dataclass(frozen=True)
class Envelope:
    """The keys of a hook's 200 answer: those it always sends, and those it sends when they apply.
    Metacontroller's v2 strict mode fails on any other."""

    always: frozenset[str]
    sometimes: frozenset[str] = frozenset()

    @classmethod
    def of(cls, response: type[msgspec.Struct]) -> Envelope:
        """The envelope a response type encodes to: its fields with no default always (each such
        type omits its defaults)."""
        fields = msgspec.structs.fields(response)
        return cls(
            frozenset(f.encode_name for f in fields if f.required),
            frozenset(f.encode_name for f in fields if not f.required),
        )


CUSTOMIZED = Envelope.of(CustomizeResponse)
COMPOSITE_SYNCED = Envelope.of(CompositeSyncResponse)
DECORATOR_SYNCED = Envelope.of(DecoratorSyncResponse)
LABELS_SYNCED = Envelope.of(LabelsResponse)
REVIEWED = Envelope(frozenset(review_response("", True, "")))


@dataclass(frozen=True)
class Hook:
    """A route, who calls it (which says how it is authenticated: `needs_token`, `https_only`),
    its handler, and the envelope of its answers. A hook that may be computed `apart` reads
    nothing but its body, the settings, the clock and the KubeVirt view (never GPU budgets, never
    the metrics): its large calls are computed in a process of their own
    (`hooks.serving.apart`)."""

    path: str
    caller: Caller
    handle: Handler
    answers: Envelope
    apart: bool = False

    @property
    def needs_token(self) -> bool:
        return self.caller == "metacontroller"

    @property
    def https_only(self) -> bool:
        return self.caller == "apiserver"

    @property
    def sheddable(self) -> bool:
        """Refused with 429 when the threads are too far behind; never a customize call: it is
        cheap, and Metacontroller skips the related events of a parent whose customize call
        failed until its next relist."""
        return not self.path.endswith("/customize")


def _sync_answer(outcome: StatusOutcome | LicenseOutcome) -> Answer:
    """A sync's answer: its log line names the class, and so does the warning of what it skipped;
    its metrics are recorded from its observation when it is sent."""
    return Answer(
        encode(outcome.response),
        {"class": outcome.class_name, "outcome": outcome.outcome, **outcome.counts},
        skipped=[f"{o.kind} {o.name}: {o.reason}" for o in outcome.invalid],
        about={"class": outcome.class_name},
        observation=_observed(outcome),
    )


def _observed(outcome: StatusOutcome | LicenseOutcome) -> Observation | None:
    """What the metrics record of a sync: a class's status, or its license copies (none for a
    class that holds no license, nothing when the sync could not tell)."""
    if isinstance(outcome, StatusOutcome):
        return outcome.computation
    if outcome.plan is not None:
        return LicenseCopiesObserved(outcome.class_name, len(outcome.plan.copies))
    if outcome.outcome in ("unlicensed", "disabled"):
        return LicenseCopiesObserved(outcome.class_name, None)
    return None


def status_customize(inputs: HookInputs, body: bytes) -> Answer:
    answer = status.customize(decode_envelope(body, CustomizeRequest), inputs.settings)
    return Answer(encode(answer), {"outcome": "ok", "rules": len(answer.related_resources)})


def status_sync(inputs: HookInputs, body: bytes) -> Answer:
    outcome = status.sync(
        decode_composite_sync(body), inputs.settings, inputs.kubevirt, inputs.clock()
    )
    return _sync_answer(outcome)


def license_customize(inputs: HookInputs, body: bytes) -> Answer:
    answer = license.customize(decode_envelope(body, CustomizeRequest), inputs.settings)
    return Answer(encode(answer), {"outcome": "ok", "rules": len(answer.related_resources)})


def license_sync(inputs: HookInputs, body: bytes) -> Answer:
    outcome = license.sync(decode_decorator_sync(body), inputs.settings)
    return _sync_answer(outcome)


def tenant_namespace_customize(inputs: HookInputs, body: bytes) -> Answer:
    parent = decode_namespace(decode_envelope(body, CustomizeRequest).parent, "parent")
    answer = tenant_namespaces.customize(parent.metadata.name)
    return Answer(encode(answer), {"outcome": "ok", "rules": len(answer.related_resources)})


def tenant_namespace_sync(inputs: HookInputs, body: bytes) -> Answer:
    request = decode_tenant_namespace_sync(body)
    outcome = tenant_namespaces.sync(request, inputs.settings.platform_values_secret)
    return Answer(
        encode(outcome.response),
        {"namespace": request.namespace, "outcome": outcome.outcome, **outcome.counts},
        skipped=[f"{o.kind} {o.name}: {o.reason}" for o in outcome.invalid],
        about={"controller": "gpuclass-tenant-namespaces", "namespace": request.namespace},
    )


def resource_labels_sync(inputs: HookInputs, body: bytes) -> Answer:
    target = decode_resource_target_sync(body)
    outcome = resource_labels.sync(target, inputs.settings)
    metadata = target.metadata
    where = (
        namespaced_key(metadata.namespace, metadata.name) if metadata.namespace else metadata.name
    )
    kind = "pod" if isinstance(target, TargetPod) else "node"
    return Answer(
        encode(outcome.response),
        {kind: where, "outcome": "ok", **outcome.counts},
        about={"controller": "gpuclass-resource-labels", kind: where},
    )


def report_customize(inputs: HookInputs, body: bytes) -> Answer:
    parent = decode_namespace(decode_envelope(body, CustomizeRequest).parent, "parent")
    answer = budget_report.customize(parent.metadata.name, inputs.settings.budget_classes_namespace)
    return Answer(encode(answer), {"outcome": "ok", "rules": len(answer.related_resources)})


def report_sync(inputs: HookInputs, body: bytes) -> Answer:
    """A report target's reports: its log line counts what it found, and its metrics are the
    pools' figures (none recorded when the sync could not tell)."""
    request = decode_report_sync(body)
    settings = inputs.settings
    outcome = budget_report.sync(
        request, settings.platform_values_secret, settings.budget_classes_namespace
    )
    namespace = request.target.metadata.name
    observed = (
        BudgetUsageObserved(outcome.reported, outcome.pools) if outcome.pools is not None else None
    )
    return Answer(
        encode(outcome.response),
        {"namespace": namespace, "outcome": outcome.outcome, **outcome.counts},
        skipped=[f"{o.kind} {o.name}: {o.reason}" for o in outcome.invalid],
        about={"controller": "gpuclass-budget-pools", "namespace": namespace},
        observation=observed,
    )


def class_index_customize(inputs: HookInputs, body: bytes) -> Answer:
    parent = decode_envelope(body, CustomizeRequest).parent
    check_report_target(parent, "parent")
    answer = budget_report.index_customize()
    return Answer(encode(answer), {"outcome": "ok", "rules": len(answer.related_resources)})


def class_index_sync(inputs: HookInputs, body: bytes) -> Answer:
    """The class index the pools' reports read, attached to the release's ClusterRole; its
    metrics name the instance types that attach GPUs unknown to the webhook's match
    conditions."""
    request = decode_class_index_sync(body)
    settings = inputs.settings
    outcome = budget_report.index_sync(request, settings.budget_classes_namespace)
    classes, index = request.classes, outcome.index
    unnamed = (
        budget_report.unnamed_gpu_instance_types(index, settings.gpu_instance_types)
        if index is not None
        else None
    )
    facts: dict[str, object] = {
        "outcome": "ok" if index is not None else "stale_related",
        "classes": len(classes.objects) if classes else 0,
        "gpu_instance_types": len(index.instance_types) if index is not None else 0,
    }
    if unnamed:
        facts["unnamed_gpu_instance_types"] = ",".join(unnamed)
    return Answer(
        encode(outcome.response),
        facts,
        skipped=[
            *(f"GPUClass {name}: does not decode" for name in (classes.invalid if classes else [])),
            *(
                f"VirtualMachineClusterInstancetype {name}: {problem}"
                for name, problem in (index.undecodable_instance_types.items() if index else ())
            ),
        ],
        observation=InstanceTypesObserved(unnamed) if unnamed is not None else None,
    )


Review = Callable[[AdmissionRequest, BudgetInputs], BudgetOutcome]


def review_budget(review: Review, inputs: HookInputs, body: bytes) -> Answer:
    """An AdmissionReview answered by a budget review; a review that is readable but whose object
    is not is answered (denied, saying why), so that the API server shows the reason."""
    request = decode_review(body)
    try:
        outcome = review(request, inputs.budgets)
    except BadRequest as error:
        denial = review_response(request.uid, False, str(error))
        return Answer(msgspec.json.encode(denial), {"outcome": "denied", "allowed": False})
    verdict = outcome.verdict
    response = review_response(request.uid, verdict.allowed, verdict.message)
    observed = BudgetReviewObserved(
        "allowed" if verdict.allowed else "failed_closed" if outcome.failed_closed else "denied"
    )
    facts = {
        "outcome": "allowed" if verdict.allowed else "denied",
        "allowed": verdict.allowed,
        "kind": outcome.kind,
        "namespace": outcome.namespace,
        "name": outcome.name,
        "operation": outcome.operation,
        "read_inputs": outcome.read_inputs,
    }
    return Answer(
        msgspec.json.encode(response), facts, skipped=verdict.skipped, observation=observed
    )


# Module-level functions, not closures made when this table is built: what runs for a call is
# then looked up when the call comes, which is also what lets mutation testing reach it.
def app_budget(inputs: HookInputs, body: bytes) -> Answer:
    return review_budget(budget.review_app, inputs, body)


def tenant_budget(inputs: HookInputs, body: bytes) -> Answer:
    return review_budget(budget.review_tenant, inputs, body)


# A new route goes at the end (docs/development.md, "A hook").
HOOKS: tuple[Hook, ...] = (
    Hook("/admit/gpu-budget", "apiserver", app_budget, REVIEWED),
    Hook("/admit/tenant-gpu-keys", "apiserver", tenant_budget, REVIEWED),
    Hook("/status/customize", "metacontroller", status_customize, CUSTOMIZED, apart=True),
    Hook("/status/sync", "metacontroller", status_sync, COMPOSITE_SYNCED, apart=True),
    Hook("/license/customize", "metacontroller", license_customize, CUSTOMIZED, apart=True),
    Hook("/license/sync", "metacontroller", license_sync, DECORATOR_SYNCED, apart=True),
    Hook(
        "/tenant-namespaces/customize",
        "metacontroller",
        tenant_namespace_customize,
        CUSTOMIZED,
        apart=True,
    ),
    Hook(
        "/tenant-namespaces/sync",
        "metacontroller",
        tenant_namespace_sync,
        LABELS_SYNCED,
        apart=True,
    ),
    Hook(
        "/resource-labels/sync", "metacontroller", resource_labels_sync, LABELS_SYNCED, apart=True
    ),
    Hook("/budget-pools/customize", "metacontroller", report_customize, CUSTOMIZED, apart=True),
    Hook("/budget-pools/sync", "metacontroller", report_sync, DECORATOR_SYNCED, apart=True),
    # The class index: served at the path of the report it replaced, kept for upgrades (the
    # per-tenant report moved to /budget-pools/*; the README's routes table).
    Hook(
        "/budget-report/customize", "metacontroller", class_index_customize, CUSTOMIZED, apart=True
    ),
    Hook("/budget-report/sync", "metacontroller", class_index_sync, DECORATOR_SYNCED, apart=True),
)
