"""The GPU budget webhook: AdmissionReview -> budget rules -> verdict.

The inputs come from a reader passed in (the Kubernetes API in production, plain values in
tests); the arithmetic is the `hooks.rules.budget` package. A review reads only what its verdict
needs: an app that cannot grow and a declaration that cannot matter are answered without reading
anything. The webhook fails closed: an input it cannot read denies the request, saying what could
not be read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import msgspec

from hooks.rules.budget.apps import AppCheck
from hooks.rules.budget.declarations import (
    check_declaration,
    declaration_needs_input,
    declaration_refused,
)
from hooks.rules.budget.keys import is_budget_key, quota_problem, tenant_declaration
from hooks.rules.budget.pools import Pools
from hooks.rules.budget.releases import app_groups
from hooks.rules.budget.reservations import Catalog, cannot_grow
from hooks.rules.budget.tenancy import (
    KUBERNETES,
    KUBERNETES_NODES,
    TENANT,
    VM_INSTANCE,
    App,
    Group,
    Tenancy,
    Tenant,
)
from hooks.rules.budget.verdicts import ALLOWED, FAILED_CLOSED, Verdict
from hooks.wire.admission import AdmissionRequest
from hooks.wire.cozystack import (
    TenantObject,
    decode_object_head,
    decode_tenant_object,
    object_sets_reservation,
)
from hooks.wire.kube import ObjectMeta, is_absent
from hooks.wire.problems import BadRequest, Undecodable, Unreadable


@dataclass(frozen=True)
class AppObject:
    """An app under review: its metadata, and the groups of VMs its spec runs."""

    metadata: ObjectMeta
    groups: tuple[Group, ...]


Reviewed = TypeVar("Reviewed", AppObject, TenantObject)
Decode = Callable[[msgspec.Raw, str], Reviewed | None]

# The apps whose VMs can attach GPUs.
APP_KINDS = (VM_INSTANCE, KUBERNETES_NODES, KUBERNETES)

APPS_GROUP = "apps.cozystack.io"
CHECKED_OPERATIONS = ("CREATE", "UPDATE")


class BudgetInputs(Protocol):
    """What the webhook reads; each method raises `Unreadable` when it cannot, with a message a
    tenant's denial can carry (the webhook fails closed)."""

    def catalog(self) -> Catalog:
        """The GPUClasses and what each cluster instance type attaches."""
        ...

    def tenancy(self, namespaces: Sequence[str], subtrees: Sequence[str] = ()) -> Tenancy:
        """Every tenant and app the verdicts about these namespaces read (at least), and every
        one of the namespaces below `subtrees` down to their bounded sub-tenants."""
        ...


@dataclass(frozen=True)
class BudgetOutcome:
    verdict: Verdict
    kind: str
    namespace: str
    name: str
    operation: str
    read_inputs: bool = False
    failed_closed: bool = False  # denied because an input could not be read


def _new_object(request: AdmissionRequest, decode: Decode[Reviewed]) -> Reviewed:
    new = decode(request.object, "object")
    if new is None:
        raise BadRequest("AdmissionReview request has no object")
    return new


def _old_object(request: AdmissionRequest, decode: Decode[Reviewed]) -> Reviewed | None:
    """The old object is only the baseline of growth: when it does not decode, growth counts from
    zero, as on a create. It never causes a denial by itself."""
    if request.operation != "UPDATE":
        return None
    try:
        return decode(request.old_object, "oldObject")
    except BadRequest:
        return None


def _name(request: AdmissionRequest, obj: AppObject | TenantObject) -> str:
    return obj.metadata.name or request.name


def _outcome(
    request: AdmissionRequest, verdict: Verdict, read: bool = False, failed_closed: bool = False
) -> BudgetOutcome:
    return BudgetOutcome(
        verdict,
        request.kind.kind,
        request.namespace,
        request.name,
        request.operation,
        read,
        failed_closed,
    )


def _checked(request: AdmissionRequest, decide: Callable[[], Verdict]) -> BudgetOutcome:
    try:
        return _outcome(request, decide(), read=True)
    except Unreadable as error:
        return _outcome(request, Verdict(False, f"{FAILED_CLOSED}{error}"), True, True)


def _ours(request: AdmissionRequest, kinds: tuple[str, ...]) -> bool:
    return (
        request.kind.group == APPS_GROUP
        and request.kind.kind in kinds
        and request.operation in CHECKED_OPERATIONS
    )


def _unless_no_pool_applies(
    request: AdmissionRequest, inputs: BudgetInputs, problem: BadRequest
) -> BudgetOutcome:
    """The object under review does not decode: denied, saying why, only when a budget pool
    applies to the namespace it is checked in (or could); otherwise nothing it says can exceed
    anything, and a legacy object stays editable."""

    def decide() -> Verdict:
        tenancy = inputs.tenancy((request.namespace,))
        if Pools(tenancy.tenants).may_apply(request.namespace):
            return Verdict(False, str(problem))
        return ALLOWED

    return _checked(request, decide)


def _object_under_review(
    request: AdmissionRequest, inputs: BudgetInputs, decode: Decode[Reviewed]
) -> Reviewed | BudgetOutcome:
    """The object under review; when it does not decode, the review's outcome. A create or
    update without its object is a malformed review (BadRequest)."""
    try:
        return _new_object(request, decode)
    except BadRequest as undecodable:
        if is_absent(request.object):
            raise
        return _unless_no_pool_applies(request, inputs, undecodable)


def review_app(request: AdmissionRequest, inputs: BudgetInputs) -> BudgetOutcome:
    """VMInstance, KubernetesNodes and Kubernetes create and update; anything else is not ours
    and passes."""
    if not _ours(request, APP_KINDS):
        return _outcome(request, ALLOWED)
    kind = request.kind.kind

    def decode(raw: msgspec.Raw, field: str) -> AppObject | None:
        head = decode_object_head(raw, field)
        if head is None:
            return None
        try:
            return AppObject(head.metadata, app_groups(head.spec, kind, "spec"))
        except Undecodable as error:
            raise BadRequest(f"{field} is not a valid app: {error}") from None

    new_obj = _object_under_review(request, inputs, decode)
    if isinstance(new_obj, BudgetOutcome):
        return new_obj
    old_obj = _old_object(request, decode)
    name = _name(request, new_obj)
    new = replace(
        App(request.namespace, kind, name, new_obj.groups),
        sized=object_sets_reservation(request.object, kind),
    )
    old = replace(new, groups=old_obj.groups) if old_obj else None
    if cannot_grow(new, old):
        return _outcome(request, ALLOWED)

    def decide() -> Verdict:
        tenancy = inputs.tenancy((request.namespace,))
        check = AppCheck(
            new=new,
            old=old,
            apps=tenancy.apps,
            tenants=tenancy.tenants,
            creating=request.operation == "CREATE",
        )
        # The catalog is read only once a pool applies: outside every pool a VM passes even
        # while GPUClasses or instance types cannot be listed.
        return check.verdict(inputs.catalog() if check.needs_catalog else Catalog())

    return _checked(request, decide)


def review_tenant(request: AdmissionRequest, inputs: BudgetInputs) -> BudgetOutcome:
    """The declaration gate for Tenant create and update."""
    if not _ours(request, (TENANT,)):
        return _outcome(request, ALLOWED)
    # (The pool a tenant carves out of is that of the namespace its release lives in.)
    try:
        new_obj = _new_object(request, decode_tenant_object)
    except BadRequest as undecodable:
        if is_absent(request.object):
            raise
        # Refused wherever it is declared, with or without a pool above: stored, no reader
        # could decode it, and the tenant's own pool would be unreadable (its growth locked).
        return _outcome(request, Verdict(False, str(undecodable)))
    old_obj = _old_object(request, decode_tenant_object)
    name = _name(request, new_obj)
    quotas = new_obj.spec.resource_quotas
    problem = quota_problem(quotas)
    if problem is not None:
        where = f"Tenant {request.namespace}/{name}"
        return _outcome(request, Verdict(False, f"{where}: spec.{problem}"))
    # A Tenant without a name yet (`generateName`) owns no namespace anyone can know.
    new = Tenant(request.namespace, name or None, tenant_declaration(quotas))
    # the old value is only the baseline of growth: the new tenant with the old quotas
    old = None
    if old_obj is not None:
        old = replace(new, declaration=tenant_declaration(old_obj.spec.resource_quotas))
    refused = declaration_refused(new)
    if refused is not None:
        return _outcome(request, Verdict(False, refused))
    if not declaration_needs_input(new, old):
        return _outcome(request, ALLOWED)

    def decide() -> Verdict:
        # the pool the tenant carves out of, the releases claiming its own namespace, and, for a
        # declaration with a budget key, all that is held inside it (its floor)
        own = new.owned_namespace or request.namespace
        budgeted = any(is_budget_key(key) for key in new.declaration)
        tenancy = inputs.tenancy((request.namespace, own), (own,) if budgeted else ())
        return check_declaration(
            new=new,
            old=old,
            apps=tenancy.apps,
            tenants=tenancy.tenants,
            catalog=inputs.catalog(),
            creating=request.operation == "CREATE",
        )

    return _checked(request, decide)
