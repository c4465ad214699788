"""The app check, rule by rule (`test_rule_<n>` is docs/gpu-budgets.md's rule n;
`hooks.rules.budget.apps`)."""

from __future__ import annotations

from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.pools import Pools
from hooks.rules.budget.reservations import Catalog, reservation
from hooks.rules.budget.tenancy import (
    VM_INSTANCE,
    App,
    Tenant,
)
from hooks.rules.budget.verdicts import FAILED_CLOSED, Verdict
from hooks.rules.classes import ClassIdentity
from tests.builders import tenant
from tests.rules.budget import (
    CATALOG,
    H100,
    L40S,
    L40S_KEY,
    UNREADABLE_VM,
    admit,
    check_app,
    pool,
    release_of,
    root,
    vm,
)


def test_rule_1_a_tenant_is_bounded_when_it_declares_any_key() -> None:
    assert tenant("tenant-root", "a", {"requests.cpu": 4}).bounded
    assert not tenant("tenant-root", "a").bounded


def test_rule_2_unbounded_tenants_admit_everything() -> None:
    assert admit(vm("tenant-a", "v", L40S, L40S, L40S), [], [tenant("tenant-root", "a")]) == (
        True,
        "",
    )


def test_rule_3_and_6_a_bounded_tenant_pool_admits_within_its_declaration() -> None:
    tenants = [tenant("tenant-root", "a", {L40S_KEY: 2})]
    existing = [vm("tenant-a", "one", L40S)]
    assert admit(vm("tenant-a", "two", L40S), existing, tenants)[0]
    allowed, message = admit(vm("tenant-a", "two", L40S, L40S), existing, tenants)
    assert not allowed
    assert message == (
        f"{L40S_KEY}: this VMInstance needs 2, the pool of tenant a (tenant-a) has 1 left "
        "(budget 2, 0 carved out for sub-tenants, 1 reserved by other apps)"
    )


def test_rule_6_members_include_unbounded_sub_tenants() -> None:
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 2}), tenant("tenant-a", "b")]
    assert not admit(vm("tenant-a-b", "v", L40S), [vm("tenant-a", "w", H100, H100)], tenants)[0]


def test_rule_4_nested_pools_carve_out_their_whole_declaration() -> None:
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 8}), tenant("tenant-a", "b", {TOTAL_KEY: 5})]
    assert Pools(tenants).carved_out("tenant-a", TOTAL_KEY) == 5
    assert admit(vm("tenant-a", "v", L40S, L40S, L40S), [], tenants)[0]
    assert not admit(vm("tenant-a", "v", L40S, L40S, L40S, L40S), [], tenants)[0]
    # the sub-tenant's own pool: its declaration, not what the parent has left
    assert admit(
        vm("tenant-a-b", "v", *[L40S] * 5), [vm("tenant-a", "w", L40S, L40S, L40S)], tenants
    )[0]


def test_rule_4_siblings_each_carve_out() -> None:
    tenants = [
        tenant("tenant-root", "a", {TOTAL_KEY: 10}),
        tenant("tenant-a", "b", {TOTAL_KEY: 4}),
        tenant("tenant-a", "c", {TOTAL_KEY: 4}),
        tenant("tenant-a", "d"),
    ]
    assert Pools(tenants).carved_out("tenant-a", TOTAL_KEY) == 8
    assert admit(vm("tenant-a-d", "v", L40S, L40S), [], tenants)[0]
    assert not admit(vm("tenant-a-d", "v", L40S, L40S, L40S), [], tenants)[0]


def test_rule_5_available_is_never_negative() -> None:
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 2}), tenant("tenant-a", "b", {TOTAL_KEY: 5})]
    allowed, message = admit(vm("tenant-a", "v", L40S), [], tenants)
    assert not allowed
    assert "has 0 left (budget 2, 5 carved out for sub-tenants" in message


def test_rule_6_the_app_under_review_counts_with_its_new_value_not_its_old() -> None:
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 3})]
    old = vm("tenant-a", "v", L40S, L40S)
    assert admit(vm("tenant-a", "v", L40S, L40S, L40S), [old], tenants, old=old)[0]


def test_rule_6_a_key_the_pool_does_not_declare_is_unbounded() -> None:
    tenants = [tenant("tenant-root", "a", {class_key("h100"): 1})]
    assert admit(vm("tenant-a", "v", L40S, L40S, L40S), [], tenants)[0]
    assert not admit(vm("tenant-a", "v", H100, H100), [], tenants)[0]


def test_rule_7_over_budget_pool_shrinking_and_unchanged_updates_pass_growth_fails() -> None:
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 2})]
    old = vm("tenant-a", "v", L40S, L40S, L40S)
    apps = [old, vm("tenant-a", "w", L40S)]  # 4 reserved against a budget of 2
    assert admit(vm("tenant-a", "v", L40S), apps, tenants, old=old)[0]
    assert admit(old, apps, tenants, old=old)[0]
    assert not admit(vm("tenant-a", "v", *[L40S] * 4), apps, tenants, old=old)[0]
    assert not admit(vm("tenant-a", "new", L40S), apps, tenants)[0]


def test_max_replicas_defaults_to_ten() -> None:
    assert reservation(pool("ns", "p", L40S), CATALOG).keys == {L40S_KEY: 10, TOTAL_KEY: 10}
    assert reservation(pool("ns", "p", L40S, H100, max_replicas=3), CATALOG).get(TOTAL_KEY) == 6
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 9})]
    assert not admit(pool("tenant-a", "p", L40S), [], tenants)[0]
    assert admit(pool("tenant-a", "p", L40S, max_replicas=9), [], tenants)[0]


def test_max_replicas_zero_reserves_nothing() -> None:
    assert reservation(pool("ns", "p", L40S, max_replicas=0), CATALOG).get(TOTAL_KEY) == 0
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 0})]
    assert admit(pool("tenant-a", "p", L40S, max_replicas=0), [], tenants)[0]


def test_entries_mapping_to_no_class_are_checked_for_growth_only_on_update() -> None:
    unknown = "nvidia.com/UNKNOWN"
    tenants = [tenant("tenant-root", "a", {TOTAL_KEY: 8})]
    old = vm("tenant-a", "v", unknown, L40S)
    assert admit(vm("tenant-a", "v", unknown), [old], tenants, old=old)[0]
    assert admit(old, [old], tenants, old=old)[0]
    allowed, message = admit(vm("tenant-a", "v", unknown, unknown), [old], tenants, old=old)
    assert not allowed and "map to no GPUClass" in message


def test_a_class_being_deleted_wins_no_resource_name() -> None:
    classes = (
        ClassIdentity("going", "2020-01-01T00:00:00Z", True, L40S),
        ClassIdentity("staying", "2026-01-01T00:00:00Z", False, L40S),
    )
    assert reservation(vm("ns", "v", L40S), Catalog(classes)).keys == {
        class_key("staying"): 1,
        TOTAL_KEY: 1,
    }
    tenants = [tenant("tenant-root", "a", {class_key("going"): 0, class_key("staying"): 1})]
    verdict = check_app(
        new=vm("tenant-a", "v", L40S), old=None, apps=[], tenants=tenants, catalog=Catalog(classes)
    )
    assert verdict.allowed, verdict.message


def test_carve_outs_count_bounded_tenants_below_unbounded_ones() -> None:
    tenants = [
        tenant("tenant-root", "a", {TOTAL_KEY: 4}),
        tenant("tenant-a", "b"),  # unbounded: its namespace tenant-a-b is in a's pool
        tenant("tenant-a-b", "c", {TOTAL_KEY: 3}),  # bounded: carves 3 out of a's pool
    ]
    assert Pools(tenants).carved_out("tenant-a", TOTAL_KEY) == 3
    assert admit(vm("tenant-a", "v", L40S), [], tenants)[0]
    allowed, message = admit(vm("tenant-a-b", "v", L40S, L40S), [], tenants)
    assert not allowed and "has 1 left (budget 4, 3 carved out for sub-tenants" in message


def test_entries_mapping_to_no_class() -> None:
    unknown = "nvidia.com/UNKNOWN"
    assert admit(
        vm("tenant-a", "v", unknown), [], [tenant("tenant-root", "a", {"requests.cpu": 8})]
    )[0]
    allowed, message = admit(
        vm("tenant-a", "v", unknown), [], [tenant("tenant-root", "a", {TOTAL_KEY: 8})]
    )
    assert not allowed and "nvidia.com/UNKNOWN" in message
    assert admit(vm("tenant-a", "v", unknown), [], [])[0]


def test_carve_outs_cross_unbounded_tenants_for_apps_too() -> None:
    tenants = [
        tenant("tenant-root", "a", {TOTAL_KEY: 4}),
        tenant("tenant-a", "u"),
        tenant("tenant-a-u", "w", {TOTAL_KEY: 3}),
    ]
    assert admit(vm("tenant-a", "v", L40S), [], tenants)[0]
    allowed, message = admit(vm("tenant-a", "v", L40S, L40S), [], tenants)
    assert not allowed and "3 carved out for sub-tenants" in message


def test_message_carved_out_is_the_sum_of_carve_outs_not_budget_less_available() -> None:
    tenants = [
        tenant("tenant-root", "a", {TOTAL_KEY: 2}),
        tenant("tenant-a", "b", {TOTAL_KEY: 3}),
        tenant("tenant-a", "c", {TOTAL_KEY: 2}),
    ]
    allowed, message = admit(vm("tenant-a", "v", L40S), [], tenants)
    assert not allowed
    assert message.endswith(
        "has 0 left (budget 2, 5 carved out for sub-tenants, 0 reserved by other apps)"
    )


def test_unreadable_app_in_the_pool_denies_naming_object_and_field() -> None:
    legacy = App(
        "tenant-a",
        VM_INSTANCE,
        "legacy",
        unreadable="HelmRelease tenant-a/vm-instance-legacy: spec.values.gpus: expected a list, "
        "got null",
    )
    tenants = [
        tenant("tenant-root", "a", {TOTAL_KEY: 4}),
        tenant("tenant-root", "b", {TOTAL_KEY: 4}),
    ]
    allowed, message = admit(vm("tenant-a", "v", L40S), [legacy], tenants)
    assert not allowed
    assert message == (
        "GPU budget check failed closed: HelmRelease tenant-a/vm-instance-legacy: "
        "spec.values.gpus: expected a list, got null"
    )
    other = check_app(
        new=vm("tenant-b", "v", L40S), old=None, apps=[legacy], tenants=tenants, catalog=CATALOG
    )
    assert other.allowed and other.skipped == (legacy.unreadable,)
    # on UPDATE the app under review's own stored release is replaced by the new value, never
    # read; a CREATE has no stored self, so the same release is another one, and read
    replaced = App("tenant-a", VM_INSTANCE, "v", unreadable=legacy.unreadable)
    assert admit(vm("tenant-a", "v", L40S), [replaced], tenants, old=vm("tenant-a", "v"))[0]
    assert not admit(vm("tenant-a", "v", L40S), [replaced], tenants)[0]


def test_a_tenant_release_that_names_no_tenant_fails_closed_beneath_where_it_lives() -> None:
    nameless = Tenant("tenant-a", None, {}, "HelmRelease tenant-a/odd: metadata.labels: no name")
    tenants = [
        tenant("tenant-root", "a", {TOTAL_KEY: 4}),
        tenant("tenant-root", "b", {TOTAL_KEY: 4}),
        nameless,
    ]
    assert not admit(vm("tenant-a", "v", L40S), [], tenants)[0]
    assert not admit(vm("tenant-a-q", "v", L40S), [], tenants)[0]
    assert admit(vm("tenant-b", "v", L40S), [], tenants)[0]


def test_the_root_tenant_is_never_its_own_sub_tenant_its_apps_use_its_whole_budget() -> None:
    tenants = [tenant("tenant-root", "root", {TOTAL_KEY: 4})]
    assert admit(vm("tenant-root", "four", L40S, L40S, L40S, L40S), [], tenants) == (True, "")
    allowed, message = admit(vm("tenant-root", "five", *[L40S] * 5), [], tenants)
    assert not allowed
    assert message == (
        f"{TOTAL_KEY}: this VMInstance needs 5, the pool of tenant root (tenant-root) has 4 left "
        "(budget 4, 0 carved out for sub-tenants, 0 reserved by other apps)"
    )


def test_a_vm_and_a_worker_pool_of_one_name_each_reserve() -> None:
    """Apps are told apart by kind and name: a VMInstance and a KubernetesNodes named alike are
    two reservations, neither hiding the other."""
    tenants = [root(), tenant("tenant-root", "a", {TOTAL_KEY: 4})]
    apps = [vm("tenant-a", "x", L40S, L40S), pool("tenant-a", "x", L40S, max_replicas=2)]
    allowed, message = admit(vm("tenant-a", "y", L40S), apps, tenants)
    assert not allowed and "4 reserved by other apps" in message
    # growing either one counts the other
    grown_vm = vm("tenant-a", "x", L40S, L40S, L40S)
    assert not admit(grown_vm, apps, tenants, old=apps[0])[0]
    grown_pool = pool("tenant-a", "x", L40S, max_replicas=3)
    assert not admit(grown_pool, apps, tenants, old=apps[1])[0]


def test_an_app_several_releases_store_fails_closed_naming_the_first_two_in_a_pool() -> None:
    new = vm("tenant-a", "v", L40S)
    stored = [release_of(new, name) for name in ("vm-instance-v", "v-copy", "v-old")]
    tenants = [root(gpuclass__cozystack__io__devices=4), tenant("tenant-root", "a")]
    edit = vm("tenant-a", "v")
    verdict = check_app(new=new, old=edit, apps=stored, tenants=tenants, catalog=CATALOG)
    assert verdict == Verdict(
        False,
        "GPU budget check failed closed: HelmRelease tenant-a/v-copy and "
        "HelmRelease tenant-a/v-old both store VMInstance v",
    )


def test_without_a_pool_every_release_storing_the_app_is_read_and_its_problems_logged() -> None:
    new = vm("tenant-a", "v", L40S)
    stored = [release_of(new, "vm-instance-v"), release_of(new, "v-old", "v-old: unreadable")]
    verdict = check_app(new=new, old=None, apps=stored, tenants=[root()], catalog=CATALOG)
    assert verdict == Verdict(True, "", skipped=("v-old: unreadable",))


def test_an_app_fails_closed_while_a_release_of_nowhere_could_own_its_namespace() -> None:
    """A release that says not even where it lives could be tenant a, bounded: tenant-a's pool
    is not known until tenant a is."""
    nowhere = Tenant("", None, {}, unreadable="HelmRelease (unnamed): metadata: expected a map")
    assert admit(vm("tenant-a", "v", L40S), [], [root(), nowhere]) == (
        False,
        "GPU budget check failed closed: HelmRelease (unnamed): metadata: expected a map",
    )
    placed = [root(), tenant("tenant-root", "a"), nowhere]
    assert admit(vm("tenant-a", "v", L40S), [], placed) == (True, "")


def test_on_create_a_release_already_carrying_the_apps_identity_is_another_release() -> None:
    """VM v created beside `vm-instance-v-legacy`, labelled v, with 3 devices: both reserve."""
    legacy = release_of(vm("tenant-a", "v", L40S, L40S, L40S), "vm-instance-v-legacy")
    tenants = [tenant("tenant-root", "root", {TOTAL_KEY: 4}), tenant("tenant-root", "a")]
    creating = check_app(
        new=vm("tenant-a", "v", L40S, L40S), old=None, apps=[legacy], tenants=tenants,
        catalog=CATALOG, creating=True,
    )  # fmt: skip
    assert not creating.allowed and "2 reserved by other apps" not in creating.message
    assert "3 reserved by other apps" in creating.message


def test_an_app_without_a_name_matches_no_release() -> None:
    """A CREATE under `generateName` (no name yet) took the one unlabelled release as itself and
    left its 3 devices uncounted; an update cannot have an empty name either."""
    unlabelled = release_of(vm("tenant-a", "", *(L40S,) * 3), "vm-instance-legacy")
    tenants = [tenant("tenant-root", "root", {TOTAL_KEY: 4}), tenant("tenant-root", "a")]
    for creating in (True, False):
        verdict = check_app(
            new=vm("tenant-a", "", L40S, L40S), old=vm("tenant-a", ""), apps=[unlabelled],
            tenants=tenants, catalog=CATALOG, creating=creating,
        )  # fmt: skip
        assert not verdict.allowed and "3 reserved by other apps" in verdict.message


def test_an_app_growing_only_keys_its_pool_does_not_declare_passes_beside_an_unreadable_member(
) -> None:  # fmt: skip
    tenants = [root(), tenant("tenant-root", "a", {L40S_KEY: 2})]
    assert admit(vm("tenant-a", "h", H100), [UNREADABLE_VM], tenants)[0]
    assert admit(vm("tenant-a", "l", L40S), [UNREADABLE_VM], tenants) == (
        False,
        f"{FAILED_CLOSED}{UNREADABLE_VM.unreadable}",
    )


def test_a_pool_whose_own_tenant_cannot_be_read_has_no_budget_anyone_can_know() -> None:
    unreadable_a = Tenant("tenant-root", "a", {}, "HelmRelease tenant-root/tenant-a: bad")
    assert admit(vm("tenant-a", "v", "nvidia.com/unclassed"), [], [root(), unreadable_a]) == (
        False,
        f"{FAILED_CLOSED}HelmRelease tenant-root/tenant-a: bad",
    )
