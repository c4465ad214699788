"""The declaration gate (`hooks.rules.budget.declarations`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hooks.rules.budget.declarations import check_declaration, declaration_needs_input
from hooks.rules.budget.keys import TOTAL_KEY, class_key, in_gpu_domain
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import (
    VM_INSTANCE,
    App,
    Tenant,
)
from hooks.rules.budget.verdicts import FAILED_CLOSED, Verdict
from hooks.rules.classes import ClassIdentity
from tests import ROOT
from tests.builders import tenant
from tests.rules.budget import (
    A10,
    CATALOG,
    CLASSES,
    H100,
    L40S,
    L40S_KEY,
    UNREADABLE_VM,
    admit,
    broken_tenant,
    check_app,
    gate,
    pool,
    release_of,
    root,
    vm,
)


def test_declaration_gate_refuses_a_non_budget_key_in_the_gpu_domain() -> None:
    allowed, message = gate(
        tenant("tenant-root", "a", {"l40s.gpuclass.cozystack.io/memory": 1}), []
    )
    assert not allowed and message.startswith(
        "l40s.gpuclass.cozystack.io/memory: not a GPU budget key"
    )
    assert gate(tenant("tenant-root", "a", {L40S_KEY: 1, TOTAL_KEY: 2, "requests.cpu": 4}), [])[0]


def test_declaration_gate_child_within_its_pool_less_carve_outs_and_reservations() -> None:
    parent = tenant("tenant-root", "a", {TOTAL_KEY: 10})
    sibling = tenant("tenant-a", "b", {TOTAL_KEY: 3})
    apps = [
        vm("tenant-a", "v", L40S, L40S),
        vm("tenant-a-c", "mine", L40S),
        vm("tenant-a-b", "theirs", L40S),
    ]
    assert gate(tenant("tenant-a", "c", {TOTAL_KEY: 5}), [parent, sibling], apps)[0]
    allowed, message = gate(tenant("tenant-a", "c", {TOTAL_KEY: 6}), [parent, sibling], apps)
    assert not allowed
    assert message == (
        f"{TOTAL_KEY}: tenant c declares 6, the pool of tenant a (tenant-a) can give 5 "
        "(budget 10, 3 carved out for other sub-tenants, 2 reserved by apps)"
    )


def test_declaration_gate_only_checks_growth() -> None:
    parent = tenant("tenant-root", "a", {TOTAL_KEY: 2})
    old = tenant("tenant-a", "c", {TOTAL_KEY: 5})
    assert gate(tenant("tenant-a", "c", {TOTAL_KEY: 4}), [parent, old], old=old)[0]
    assert not gate(tenant("tenant-a", "c", {TOTAL_KEY: 6}), [parent, old], old=old)[0]


def test_becoming_bounded_in_a_gpu_pool_must_declare_its_gpu_keys() -> None:
    parent = tenant("tenant-root", "a", {TOTAL_KEY: 4, L40S_KEY: 2, "requests.cpu": 8})
    allowed, message = gate(tenant("tenant-a", "c", {"requests.cpu": 2}), [parent])
    assert not allowed
    assert f"declare {TOTAL_KEY}, {L40S_KEY} too" in message
    assert gate(tenant("tenant-a", "c", {"requests.cpu": 2, TOTAL_KEY: 0, L40S_KEY: 0}), [parent])[
        0
    ]
    assert gate(tenant("tenant-a", "c"), [parent])[0]  # staying unbounded is fine


def test_declaration_gate_root_tenant_is_never_its_own_sub_tenant() -> None:
    # root (10) with one child of 6 can give a new child 4; its own declaration is no carve-out
    root_tenant = tenant("tenant-root", "root", {TOTAL_KEY: 10})
    tenants = [root_tenant, tenant("tenant-root", "b", {TOTAL_KEY: 6})]
    assert gate(tenant("tenant-root", "c", {TOTAL_KEY: 4}), tenants)[0]
    allowed, message = gate(tenant("tenant-root", "c", {TOTAL_KEY: 5}), tenants)
    assert not allowed
    assert message == (
        f"{TOTAL_KEY}: tenant c declares 5, the pool of tenant root (tenant-root) can give 4 "
        "(budget 10, 6 carved out for other sub-tenants, 0 reserved by apps)"
    )
    # and the root tenant itself carves out of nothing: only its own sub-tree bounds it
    assert gate(tenant("tenant-root", "root", {TOTAL_KEY: 11}), tenants, old=root_tenant)[0]


def test_declaration_gate_limit_is_the_pool_through_unbounded_intermediates() -> None:
    a = tenant("tenant-root", "a", {TOTAL_KEY: 4})
    u = tenant("tenant-a", "u")  # unbounded: a member of a's pool
    allowed, message = gate(tenant("tenant-a-u", "w", {TOTAL_KEY: 1000}), [a, u])
    assert not allowed
    assert "the pool of tenant a (tenant-a) can give 4" in message
    w = tenant("tenant-a-u", "w", {TOTAL_KEY: 3})
    assert gate(w, [a, u])[0]
    # a direct child of a can no longer take all 4 while w carves out 3
    allowed, message = gate(tenant("tenant-a", "d", {TOTAL_KEY: 4}), [a, u, w])
    assert not allowed
    assert "can give 1 (budget 4, 3 carved out for other sub-tenants" in message
    assert gate(tenant("tenant-a", "d", {TOTAL_KEY: 1}), [a, u, w])[0]


def test_declaration_gate_refuses_typos_of_budget_keys() -> None:
    for typo in (
        "l40sgpuclass.cozystack.io/devices",
        "L40S.GPUCLASS.cozystack.io/devices",
        "gpuclass.cozystack.io/device",
        "l40s.gpuclass.cozystack.io/devices/",
    ):
        allowed, message = gate(tenant("tenant-root", "a", {typo: 1}), [])
        assert not allowed and message.startswith(f"{typo}: not a GPU budget key"), typo
    assert in_gpu_domain("l40sgpuclass.cozystack.io/devices")


def test_must_declare_applies_only_when_a_tenant_becomes_bounded() -> None:
    parent = tenant("tenant-root", "a", {TOTAL_KEY: 4})
    old = tenant("tenant-a", "c", {"requests.cpu": 4})  # bounded before a had GPU keys
    lowered = tenant("tenant-a", "c", {"requests.cpu": 2})
    assert gate(lowered, [parent, old], old=old)[0]
    assert not declaration_needs_input(lowered, old)
    becoming = tenant("tenant-a", "c", {"requests.cpu": 2})
    assert not gate(becoming, [parent], old=tenant("tenant-a", "c"))[0]


def test_a_bounded_tenant_may_not_drop_a_budget_key_its_pool_declares() -> None:
    parent = tenant("tenant-root", "a", {TOTAL_KEY: 4})
    old = tenant("tenant-a", "c", {TOTAL_KEY: 1, "requests.cpu": 2})
    allowed, message = gate(tenant("tenant-a", "c", {"requests.cpu": 2}), [parent, old], old=old)
    assert not allowed and message.startswith(f"{TOTAL_KEY}: tenant c keeps a quota")
    # becoming unbounded altogether returns its sub-tree to the pool: allowed
    assert gate(tenant("tenant-a", "c"), [parent, old], old=old)[0]


def test_declaration_floor_what_is_held_inside_a_tenant_must_fit_its_declaration() -> None:
    parent = tenant("tenant-root", "a", {TOTAL_KEY: 10})
    apps = [vm("tenant-a-c", "v", L40S, L40S, L40S)]
    # becoming bounded over 3 reserved devices with a budget of 1 would free 2 in use
    allowed, message = gate(tenant("tenant-a", "c", {TOTAL_KEY: 1}), [parent], apps)
    assert not allowed
    assert message == (
        f"{TOTAL_KEY}: tenant c declares 1, but 3 are held inside it already "
        "(0 carved out for its sub-tenants, 3 reserved by apps): release those first"
    )
    old = tenant("tenant-a", "c", {TOTAL_KEY: 5})
    assert not gate(tenant("tenant-a", "c", {TOTAL_KEY: 2}), [parent, old], apps, old=old)[0]
    assert gate(tenant("tenant-a", "c", {TOTAL_KEY: 3}), [parent, old], apps, old=old)[0]


def test_malformed_quota_denies_only_the_verdicts_that_read_it() -> None:
    tenants = [
        tenant("tenant-root", "a", {TOTAL_KEY: 4}),
        broken_tenant("tenant-root", "x"),
        tenant("tenant-x", "y", {TOTAL_KEY: 1}),
    ]
    verdict = check_app(
        new=vm("tenant-a", "v", L40S), old=None, apps=[], tenants=tenants, catalog=CATALOG
    )
    assert verdict.allowed
    assert verdict.skipped == (tenants[1].unreadable,)
    # its own pool reads it; a bounded sub-tenant's pool is bounded by that sub-tenant alone
    allowed, message = admit(vm("tenant-x", "v", L40S), [], tenants)
    assert not allowed
    assert message == FAILED_CLOSED + str(tenants[1].unreadable)
    assert admit(vm("tenant-x-y", "v", L40S), [], tenants)[0]
    # a tenant carving out of its pool
    assert not gate(tenant("tenant-x", "z", {TOTAL_KEY: 1}), tenants)[0]


def test_malformed_stored_quota_of_the_tenant_under_review_is_correctable() -> None:
    stored = broken_tenant("tenant-root", "a", L40S_KEY)
    root_tenant = tenant("tenant-root", "root", {L40S_KEY: 8})
    old = Tenant("tenant-root", "a", {L40S_KEY: None})  # "1500m" counts as 0
    assert gate(tenant("tenant-root", "a", {L40S_KEY: 2}), [root_tenant, stored], old=old)[0]
    removed = tenant("tenant-root", "a", {"requests.cpu": 1})
    assert gate(
        removed,
        [root_tenant, stored],
        old=Tenant("tenant-root", "a", {L40S_KEY: None, "requests.cpu": 0}),
    )[0]


def test_declarations_that_cannot_matter_need_no_input() -> None:
    assert not declaration_needs_input(tenant("tenant-root", "a"), None)
    assert not declaration_needs_input(
        tenant("tenant-root", "a"), tenant("tenant-root", "a", {TOTAL_KEY: 1})
    )
    assert declaration_needs_input(tenant("tenant-root", "a", {"requests.cpu": 1}), None)
    assert declaration_needs_input(tenant("tenant-root", "a", {TOTAL_KEY: 1}), None)
    assert declaration_needs_input(
        tenant("tenant-root", "a", {"requests.cpu": 1}),
        tenant("tenant-root", "a", {"requests.cpu": 1, TOTAL_KEY: 1}),
    )


def test_documented_denials_are_what_the_rules_say() -> None:
    """The worked example of docs/gpu-budgets.md (tenant acme), replayed: every message it shows
    is exact."""
    documented = (ROOT / "docs" / "gpu-budgets.md").read_text()
    l40s, h100 = class_key("l40s-24q"), class_key("h100")
    classes = (
        ClassIdentity("l40s-24q", "2026-01-01T00:00:00Z", False, L40S),
        ClassIdentity("h100", "2026-01-01T00:00:00Z", False, H100),
    )
    acme = tenant("tenant-root", "acme", {TOTAL_KEY: 4, l40s: 2})
    lab = tenant("tenant-acme", "lab", {TOTAL_KEY: 1, l40s: 0})
    lab_with_cpu = tenant("tenant-acme", "lab", {TOTAL_KEY: 1, l40s: 0, "requests.cpu": 2})
    tenants = [tenant("tenant-root", "root"), acme, lab, tenant("tenant-acme", "team")]
    render = vm("tenant-acme", "render", L40S, L40S)
    legacy = App(
        "tenant-acme",
        VM_INSTANCE,
        "legacy",
        unreadable="HelmRelease tenant-acme/vm-instance-legacy: spec.values.gpus: expected a "
        "list, got null",
    )

    def app(
        new: App,
        apps: list[App] = [render],  # noqa: B006
        claims: list[Tenant] = tenants,
        old: App | None = None,
    ) -> Verdict:
        return check_app(new=new, old=old, apps=apps, tenants=claims, catalog=Catalog(classes))

    def declare(
        new: Tenant,
        old: Tenant | None = None,
        others: list[Tenant] = tenants,
        apps: list[App] = [render],  # noqa: B006
    ) -> Verdict:
        return check_declaration(
            new=new, old=old, apps=apps, tenants=others, catalog=Catalog(classes)
        )

    unbudgeted = tenant("tenant-root", "acme", {"requests.cpu": 4})
    unclassed = vm("tenant-acme", "old", *["nvidia.com/A10"] * 3)

    denials = [
        app(vm("tenant-acme", "more", L40S)),
        app(pool("tenant-acme", "workers", H100)),
        app(vm("tenant-acme", "odd", "nvidia.com/A100")),
        app(vm("tenant-acme", "more", H100), [render, legacy]),
        declare(tenant("tenant-acme", "dev", {"requests.cpu": 4})),
        declare(tenant("tenant-acme", "dev", {TOTAL_KEY: 2, l40s: 0})),
        declare(tenant("tenant-acme-team", "dev", {TOTAL_KEY: 2, l40s: 0})),
        declare(tenant("tenant-root", "acme", {TOTAL_KEY: 1, l40s: 2}), acme),
        declare(
            tenant("tenant-acme", "lab", {"requests.cpu": 2}),
            lab_with_cpu,
            [*tenants[:2], lab_with_cpu, tenants[3]],
        ),
        declare(tenant("tenant-root", "acme", {TOTAL_KEY: 4, l40s: 2, h100: 2}), acme),
        declare(tenant("tenant-root", "acme", {"l40s-24qgpuclass.cozystack.io/devices": 2})),
        declare(
            tenant("tenant-root", "acme", {TOTAL_KEY: 1}),
            unbudgeted,
            [tenant("tenant-root", "root"), unbudgeted],
            [unclassed],
        ),
        check_declaration(
            new=lab,
            old=None,
            apps=[],
            tenants=[*tenants[:2], replace(lab, release="lab-old")],
            catalog=Catalog(classes),
            creating=True,
        ),
        app(
            vm("tenant-acme-lab", "v", L40S),
            [render],
            [
                acme,
                *tenants[::3],
                replace(lab, release="lab-old"),
                replace(lab, release="tenant-lab"),
            ],
        ),
    ]
    for verdict in denials:
        assert not verdict.allowed
        assert f"denied: `{verdict.message}`" in documented, verdict.message
    assert app(vm("tenant-acme-team", "x", H100)).allowed
    assert app(vm("tenant-acme", "render", L40S), old=render).allowed


def test_unreadable_objects_a_denial_did_not_need_are_reported_for_the_log() -> None:
    broken = broken_tenant("tenant-root", "x")
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 1}), broken]
    verdict = check_app(
        new=vm("tenant-a", "v", L40S, L40S), old=None, apps=[], tenants=tenants, catalog=CATALOG
    )
    assert not verdict.allowed and "needs 2" in verdict.message
    assert verdict.skipped == (broken.unreadable,)
    declared = check_declaration(
        new=tenant("tenant-a", "c", {TOTAL_KEY: 5}),
        old=None,
        apps=[],
        tenants=tenants,
        catalog=CATALOG,
    )
    assert not declared.allowed and declared.skipped == (broken.unreadable,)


def test_messages_list_every_unmapped_entry_and_every_stray_key() -> None:
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 8})]
    allowed, message = admit(vm("tenant-a", "v", "nvidia.com/X", "nvidia.com/Y"), [], tenants)
    assert not allowed and message.startswith("devices nvidia.com/X, nvidia.com/Y map to no")
    refused = check_declaration(
        new=tenant(
            "tenant-root",
            "a",
            {"xgpuclass.cozystack.io/devices": 1, "ygpuclass.cozystack.io/devices": 1},
        ),
        old=None,
        apps=[],
        tenants=[],
        catalog=CATALOG,
    )
    assert refused.allowed is False
    assert refused.message.startswith(
        "xgpuclass.cozystack.io/devices, ygpuclass.cozystack.io/devices: not a GPU budget key"
    )


def test_verdicts_are_booleans() -> None:
    broken = broken_tenant("tenant-root", "a")
    verdict = check_app(
        new=vm("tenant-a", "v", L40S), old=None, apps=[], tenants=[broken], catalog=CATALOG
    )
    assert verdict.allowed is False and verdict.message.startswith(
        "GPU budget check failed closed: "
    )
    typo = check_declaration(
        new=tenant("tenant-root", "a", {"l40sgpuclass.cozystack.io/devices": 1}),
        old=None,
        apps=[],
        tenants=[],
        catalog=CATALOG,
    )
    assert typo.allowed is False


def test_declaration_gate_says_when_the_pool_can_give_nothing() -> None:
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 2}), tenant("tenant-a", "b")]
    verdict = check_declaration(
        new=tenant("tenant-a", "c", {TOTAL_KEY: 1}),
        old=None,
        apps=[vm("tenant-a", "v", L40S, L40S)],
        tenants=tenants,
        catalog=CATALOG,
    )
    assert verdict.allowed is False
    assert verdict.message == (
        f"{TOTAL_KEY}: tenant c declares 1, the pool of tenant a (tenant-a) can give 0 "
        "(budget 2, 0 carved out for other sub-tenants, 2 reserved by apps)"
    )


def test_declaration_gate_checks_only_keys_that_grow() -> None:
    # a's pool holds 3 of its total of 2; b lowers its class key and keeps its total: it passes
    tenants = [
        tenant("tenant-root", "a", {TOTAL_KEY: 2}),
        tenant("tenant-a", "b", {TOTAL_KEY: 1, L40S_KEY: 1}),
    ]
    apps = [vm("tenant-a", "v", L40S, L40S)]
    verdict = check_declaration(
        new=tenant("tenant-a", "b", {TOTAL_KEY: 1, L40S_KEY: 0}),
        old=tenants[1],
        apps=apps,
        tenants=tenants,
        catalog=CATALOG,
    )
    assert verdict.allowed is True, verdict.message


def test_declaration_refused_names_the_first_value_that_does_not_parse() -> None:
    verdict = check_declaration(
        new=Tenant("tenant-root", "a", {TOTAL_KEY: None, L40S_KEY: None}),
        old=None,
        apps=[],
        tenants=[],
        catalog=CATALOG,
    )
    assert verdict.allowed is False
    assert verdict.message == (
        f"resourceQuotas.{TOTAL_KEY}: not a whole, non-negative number of devices"
    )


def test_the_floor_fails_closed_only_when_a_declaration_is_new_or_lowered() -> None:
    unreadable = App("tenant-a", VM_INSTANCE, "legacy", unreadable="HelmRelease x: broken")
    a = tenant("tenant-root", "a", {TOTAL_KEY: 4, "requests.cpu": 1})
    tenants = [a]

    def declare(declaration: dict[str, int]) -> Verdict:
        new = tenant("tenant-root", "a", declaration)
        return check_declaration(
            new=new, old=a, apps=[unreadable], tenants=tenants, catalog=CATALOG
        )

    lowered = declare({TOTAL_KEY: 3, "requests.cpu": 1})
    assert lowered.allowed is False and lowered.message.startswith("GPU budget check failed closed")
    assert declare({TOTAL_KEY: 5, "requests.cpu": 1}).allowed is True  # growth reads no floor
    assert declare({TOTAL_KEY: 4, "requests.cpu": 2}).allowed is True  # unchanged: no floor


def test_bounding_a_key_is_refused_while_a_bounded_sub_tenant_leaves_it_out() -> None:
    before = tenant("tenant-root", "a", {TOTAL_KEY: 4})
    tenants = [root(), before, tenant("tenant-a", "b", {TOTAL_KEY: 1})]
    verdict = check_declaration(
        new=tenant("tenant-root", "a", {TOTAL_KEY: 4, L40S_KEY: 2}),
        old=before,
        apps=[],
        tenants=tenants,
        catalog=CATALOG,
    )
    assert verdict == Verdict(
        False,
        f"{L40S_KEY}: tenant a declares this key, but its sub-tenant b (tenant-a-b) does not and "
        "would escape it: declare it there first (0 is allowed)",
    )


def test_a_sub_tenant_that_declares_the_key_does_not_hold_its_parent_back() -> None:
    tenants = [
        tenant("tenant-root", "a", {"requests.cpu": 1}),
        tenant("tenant-a", "b", {L40S_KEY: 1}),
    ]
    verdict = check_declaration(
        new=tenant("tenant-root", "a", {"requests.cpu": 1, L40S_KEY: 2}),
        old=tenants[0],
        apps=[],
        tenants=tenants,
        catalog=CATALOG,
    )
    assert verdict.allowed is True, verdict.message


def test_a_declaration_fails_closed_while_an_unplaced_release_could_own_its_namespace() -> None:
    """tenant-a has no placed owner, and a release in tenant-root says not which tenant it is:
    it could be tenant a, bounded, and so the pool b carves out of."""
    legacy = Tenant("tenant-root", None, {}, unreadable="HelmRelease tenant-root/legacy: no name")
    new = tenant("tenant-a", "b", {TOTAL_KEY: 1})
    assert gate(new, [root(), legacy]) == (
        False,
        "GPU budget check failed closed: HelmRelease tenant-root/legacy: no name",
    )
    assert gate(new, [root(), tenant("tenant-root", "a"), legacy]) == (True, "")  # a is placed


@pytest.mark.parametrize(
    ("declared_in", "unplaced_in"),
    [
        ("tenant-a-b", "tenant-a"),  # could own tenant-a-b, two levels below the pool's root
        ("tenant-a-b", "tenant-root"),  # could own tenant-a, on the way up from tenant-a-b
        ("tenant-a", ""),  # a release that says not even where it lives could be anywhere
    ],
)
def test_every_unplaced_release_that_could_own_a_namespace_on_the_way_to_the_pool_fails_closed(
    declared_in: str, unplaced_in: str
) -> None:
    unplaced = Tenant(unplaced_in, None, {}, unreadable="HelmRelease ?/legacy: no name")
    new = tenant(declared_in, "c", {TOTAL_KEY: 1})
    assert gate(new, [root(), unplaced]) == (
        False,
        "GPU budget check failed closed: HelmRelease ?/legacy: no name",
    )


def test_three_releases_claiming_one_tenant_fail_closed_naming_the_first_two() -> None:
    claims = [
        Tenant("tenant-root", "x", {TOTAL_KEY: 1}, release=release)
        for release in ("tenant-x", "x-old", "x-copy")
    ]
    tenants = [root(gpuclass__cozystack__io__devices=4), *claims]
    failed = (
        False,
        "GPU budget check failed closed: HelmRelease tenant-root/tenant-x and "
        "HelmRelease tenant-root/x-copy both claim tenant namespace tenant-x",
    )
    edit = tenant("tenant-root", "x", {TOTAL_KEY: 1})
    assert gate(tenant("tenant-root", "x", {TOTAL_KEY: 2}), tenants, old=edit) == failed
    assert admit(vm("tenant-x", "v", L40S), [], tenants) == failed


def test_a_new_gpu_bound_is_refused_while_its_namespaces_hold_devices_no_class_names() -> None:
    """Three unclassed devices under a bound of 1 would count 3 of 1 once a class names them."""
    held = [vm("tenant-a", "old", A10, A10, A10), release_of(vm("tenant-a-b", "w", A10), "w")]
    tenants = [root(), tenant("tenant-root", "a"), tenant("tenant-a", "b")]
    bound = tenant("tenant-root", "a", {TOTAL_KEY: 1})
    allowed, message = gate(bound, tenants, held, old=tenant("tenant-root", "a"))
    assert (allowed, message) == (
        False,
        f"tenant a declares a GPU budget, but its namespaces hold devices of {A10}, which no "
        "GPUClass names (VMInstance tenant-a-b/w and 1 more): they would escape the budget. "
        "Remove those gpus entries, or create their GPUClass first",
    )
    assert gate(bound, tenants, held[:0], old=tenant("tenant-root", "a")) == (True, "")
    # once classed, they count like any other device: the floor holds them
    a10 = ClassIdentity("a10", "2026-03-01T00:00:00Z", False, A10)
    classed = check_declaration(
        new=bound, old=tenant("tenant-root", "a"), apps=held, tenants=tenants,
        catalog=Catalog((*CLASSES, a10)),
    )  # fmt: skip
    assert not classed.allowed and "4 are held inside it already" in classed.message


def test_a_bound_that_already_had_a_gpu_key_is_not_held_to_unclassed_devices_again() -> None:
    """Only the step from no GPU budget to one is checked: the app check refused unclassed
    devices in the pool since."""
    held = [vm("tenant-a", "old", A10)]
    before = tenant("tenant-root", "a", {TOTAL_KEY: 4})
    tenants = [root(), before]
    grown = tenant("tenant-root", "a", {TOTAL_KEY: 4, L40S_KEY: 2})
    assert gate(grown, tenants, held, old=before) == (True, "")


def test_on_create_a_tenant_whose_namespace_another_release_claims_is_refused() -> None:
    """Tenant lab beside `lab-old` (labelled lab): carving both would pass the budget, and two
    claimants would lock the pool."""
    lab_old = replace(tenant("tenant-acme", "lab", {TOTAL_KEY: 3}), release="lab-old")
    tenants = [root(), tenant("tenant-root", "acme", {TOTAL_KEY: 4}), lab_old]
    verdict = check_declaration(
        new=tenant("tenant-acme", "lab", {TOTAL_KEY: 1}), old=None, apps=[], tenants=tenants,
        catalog=CATALOG, creating=True,
    )  # fmt: skip
    assert verdict == Verdict(
        False,
        "tenant lab: its namespace tenant-acme-lab is already claimed by HelmRelease "
        "tenant-acme/lab-old; two releases of one tenant would make every budget verdict in its "
        "pool fail closed",
    )


def test_a_tenant_without_a_name_fails_closed_where_its_pool_matters() -> None:
    tenants = [tenant("tenant-root", "root", {TOTAL_KEY: 4})]
    nameless = Tenant("tenant-root", None, {TOTAL_KEY: 9})
    assert gate(nameless, tenants) == (
        False,
        f"{FAILED_CLOSED}Tenant in tenant-root has no name: its namespace, and the pool it "
        "carves out of, are unknown",
    )


@pytest.mark.parametrize(
    ("change", "old"),
    [
        ({TOTAL_KEY: 1, "requests.cpu": 2}, {TOTAL_KEY: 1, "requests.cpu": 2}),  # unchanged
        ({TOTAL_KEY: 1, "requests.cpu": 1}, {TOTAL_KEY: 1, "requests.cpu": 2}),  # cpu lowered
        ({TOTAL_KEY: 0}, None),  # a new sub-tenant at 0
    ],
)
def test_a_declaration_that_grows_nothing_passes_beside_an_unreadable_member(
    change: dict[str, int], old: dict[str, int] | None
) -> None:
    """Only growth reads the pool's members: one legacy VM with `gpus: null` in tenant-a must
    not lock every sub-tenant declaration of the pool."""
    a = tenant("tenant-root", "a", {TOTAL_KEY: 4})
    before = tenant("tenant-a", "b", old) if old is not None else None
    tenants = [root(), a, *([before] if before else [])]
    new = tenant("tenant-a", "b", change)
    assert gate(new, tenants, [UNREADABLE_VM], old=before) == (True, "")
    grown = tenant("tenant-a", "b", {**change, TOTAL_KEY: 2})
    assert gate(grown, tenants, [UNREADABLE_VM], old=before) == (
        False,
        f"{FAILED_CLOSED}{UNREADABLE_VM.unreadable}",
    )
