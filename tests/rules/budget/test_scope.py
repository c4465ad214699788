"""Which releases a review reads (`hooks.rules.budget.scope`): the reads themselves, as the rules
ask for them, answered from a cluster of plain values. How each read becomes a LIST is the
reader's (tests/kubeapi/test_budget_reader.py)."""

from __future__ import annotations

from dataclasses import replace

from hooks.rules.budget.keys import TOTAL_KEY
from hooks.rules.budget.scope import Read, ReleasesIn, TenantsNamed, UnnamedTenants, read_scope
from hooks.rules.budget.tenancy import App, Tenancy, Tenant
from tests.builders import GPU, tenant
from tests.rules.budget import vm as gpu_vm

ROOT = Tenant("tenant-root", "root", {}, release="tenant-root")


class Cluster:
    """Releases, each labelled with its tenant's name unless listed as unlabelled; every read
    the rules ask for is recorded."""

    def __init__(self, releases: list[Tenant | App], unlabelled: list[Tenant] = ()) -> None:
        self.releases, self.unlabelled = releases, list(unlabelled)
        self.reads: list[Read] = []

    def read(self, request: Read) -> list[Tenant | App]:
        self.reads.append(request)
        match request:
            case TenantsNamed(release_namespace, names):
                return [
                    t
                    for t in self.releases
                    if isinstance(t, Tenant)
                    and t.release_namespace == release_namespace
                    and t.name in names
                ]
            case UnnamedTenants(release_namespace):
                return [t for t in self.unlabelled if t.release_namespace == release_namespace]
            case ReleasesIn(namespace):
                return [
                    o
                    for o in (*self.releases, *self.unlabelled)
                    if (o.release_namespace if isinstance(o, Tenant) else o.namespace) == namespace
                ]


def stored_tenant(
    where: str, name: str, declaration: dict[str, int | None] | None = None
) -> Tenant:
    """A tenant as its HelmRelease stores it: the release named `tenant-<name>`."""
    return tenant(where, name, declaration, release=f"tenant-{name}")


def vm(namespace: str, name: str) -> App:
    return replace(gpu_vm(namespace, name, GPU), release=name)


def test_a_namespace_whose_parent_cannot_exist_is_never_read() -> None:
    cluster = Cluster([])
    assert read_scope(["tenant--x"], cluster.read) == Tenancy()
    assert cluster.reads == [TenantsNamed("tenant-root", ("root",)), UnnamedTenants("tenant-root")]


def test_a_tenant_labelled_only_on_another_release_is_looked_for_among_the_unlabelled() -> None:
    """`x-old` says it is tenant x, but tenant x's own release is `tenant-x`: it may be there
    without its label, so the unlabelled releases are read too."""
    old = Tenant("tenant-root", "x", {TOTAL_KEY: 1}, release="x-old")
    own = Tenant("tenant-root", "x", {TOTAL_KEY: 2}, release="tenant-x")
    cluster = Cluster([ROOT, old], unlabelled=[own])
    tenancy = read_scope(["tenant-x"], cluster.read)
    assert UnnamedTenants("tenant-root") in cluster.reads
    assert {t.release for t in tenancy.tenants} == {"tenant-root", "x-old", "tenant-x"}
    canonical = Cluster([ROOT, own])
    read_scope(["tenant-x"], canonical.read)
    assert UnnamedTenants("tenant-root") not in canonical.reads  # found by its label


# The cost contract: a review reads the owners of its namespace and its own pool, which stops at
# bounded sub-tenants (each its own pool) and goes through unbounded ones.
TREE: list[Tenant | App] = [
    ROOT,
    stored_tenant("tenant-root", "a", {TOTAL_KEY: 4}),
    stored_tenant("tenant-a", "u"),  # unbounded: inside a's pool
    stored_tenant("tenant-a", "b", {TOTAL_KEY: 1}),  # bounded: a pool of its own
    stored_tenant("tenant-a-b", "c"),
    stored_tenant("tenant-a-u", "w"),
    vm("tenant-a-u", "vm-u"),
    vm("tenant-a-b", "vm-b"),
    vm("tenant-a-b-c", "vm-c"),
    vm("tenant-a-u-w", "vm-w"),
]
A_POOL = [ReleasesIn("tenant-a"), ReleasesIn("tenant-a-u"), ReleasesIn("tenant-a-u-w")]


def test_a_review_reads_its_pool_from_the_root_down_through_unbounded_tenants() -> None:
    cluster = Cluster(TREE)
    tenancy = read_scope(["tenant-a"], cluster.read)
    assert cluster.reads == [TenantsNamed("tenant-root", ("a", "root")), *A_POOL]
    assert {app.name for app in tenancy.apps} == {"vm-u", "vm-w"}


def test_a_review_deep_inside_a_pool_reads_its_owners_then_the_whole_pool() -> None:
    cluster = Cluster(TREE)
    tenancy = read_scope(["tenant-a-u-w"], cluster.read)
    assert sorted(map(repr, cluster.reads)) == sorted(
        map(
            repr,
            [
                TenantsNamed("tenant-a", ("u",)),
                TenantsNamed("tenant-a-u", ("w",)),
                TenantsNamed("tenant-root", ("a", "root")),
                *A_POOL,
            ],
        )
    )
    assert {app.name for app in tenancy.apps} == {"vm-u", "vm-w"}


def test_a_review_inside_a_bounded_sub_tenant_reads_that_pool_and_not_its_parents() -> None:
    cluster = Cluster(TREE)
    tenancy = read_scope(["tenant-a-b-c"], cluster.read)
    pool_reads = [r for r in cluster.reads if isinstance(r, ReleasesIn)]
    assert sorted(r.namespace for r in pool_reads) == ["tenant-a-b", "tenant-a-b-c"]
    assert {app.name for app in tenancy.apps} == {"vm-b", "vm-c"}


def test_each_release_is_kept_once_however_many_reads_return_it() -> None:
    cluster = Cluster(TREE)
    tenancy = read_scope(["tenant-a", "tenant-a-u"], cluster.read)
    releases = [t.release_key for t in tenancy.tenants] + [a.release_key for a in tenancy.apps]
    assert len(releases) == len(set(releases))


def many_tenants_without_budgets(count: int) -> Cluster:
    """The root without a budget, `count` tenants without one beside each other, five apps
    each, and one bounded tenant among them."""
    releases: list[Tenant | App] = [ROOT, stored_tenant("tenant-root", "bounded", {TOTAL_KEY: 4})]
    for index in range(count):
        releases.append(stored_tenant("tenant-root", f"t{index}"))
        releases += [vm(f"tenant-t{index}", f"v{n}") for n in range(5)]
    return Cluster(releases)


def test_a_review_where_no_pool_applies_reads_the_same_few_releases_however_many_tenants() -> None:
    """A review in `tenant-root` (no budget) beside a thousand tenants without one: its owners
    and nothing more, as beside ten; a new tenant's budget reads its own namespace too."""
    for count in (10, 1000):
        cluster = many_tenants_without_budgets(count)
        read_scope(["tenant-root"], cluster.read)
        assert cluster.reads == [TenantsNamed("tenant-root", ("root",))], count
        cluster = many_tenants_without_budgets(count)
        read_scope(["tenant-root", "tenant-new"], cluster.read, subtrees=["tenant-new"])
        assert cluster.reads == [
            TenantsNamed("tenant-root", ("new", "root")),
            UnnamedTenants("tenant-root"),
            ReleasesIn("tenant-new"),
        ], count


def test_a_review_in_a_pool_beside_a_thousand_tenants_without_budgets_reads_its_pool_only() -> None:
    cluster = many_tenants_without_budgets(1000)
    cluster.releases.append(vm("tenant-bounded", "mine"))
    found = read_scope(["tenant-bounded"], cluster.read)
    assert cluster.reads == [
        TenantsNamed("tenant-root", ("bounded", "root")),
        ReleasesIn("tenant-bounded"),
    ]
    assert [app.name for app in found.apps] == ["mine"]
