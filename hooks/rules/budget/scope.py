"""Which releases a verdict needs: the reads of a review, each decided by what the ones before it
found, and nothing more.

`scoped_reads` yields each read it needs (`Read`) and is sent what the read found; it returns the
tenancy the verdicts about its namespaces read. It does no I/O: the edge performs each read
(`hooks.kubeapi.budget`), a test answers it from a list of releases. The rules give the same
verdict on this tenancy as on every release of the cluster: a pool's arithmetic reads only its
members, its carve-outs and the tenants above it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass

from hooks.rules.budget.pools import owners, pool_root
from hooks.rules.budget.tenancy import App, Tenancy, Tenant, owner_of
from hooks.wire.names import is_dns_label


@dataclass(frozen=True)
class TenantsNamed:
    """The Tenant releases of a namespace whose name label is one of these names."""

    release_namespace: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class UnnamedTenants:
    """The Tenant releases of a namespace whose name label is missing or empty."""

    release_namespace: str


@dataclass(frozen=True)
class ReleasesIn:
    """Every Tenant, VMInstance and KubernetesNodes release of a namespace."""

    namespace: str


Read = TenantsNamed | UnnamedTenants | ReleasesIn
Found = Sequence[Tenant | App]
Reads = Generator[Read, Found, Tenancy]


def scoped_reads(namespaces: Iterable[str], subtrees: Iterable[str] = ()) -> Reads:
    """The reads the verdicts about these namespaces need, and the whole of `subtrees` (a
    tenant's own namespace, whose floor a new or lowered budget reads).

    1. The tenants owning each namespace and every ancestor of it (one read per namespace they
       are declared in, by name label), which place each namespace in its pool. Where an owner is
       not found that way under its canonical release name (`tenant-<name>`), the releases there
       without a name label are read too: one of them may be that owner (named by its release
       name), or may be unplaceable and fail closed where it could matter. Where every owner is a
       labelled `tenant-<name>`, no other release can claim those tenants by its release name
       (that name is taken), and unplaceable ones change nothing on the way.
    2. Each pool these namespaces are in, from its root down, and each of `subtrees`: the apps
       and the Tenant releases of every namespace, descending through unbounded tenants and
       stopping at bounded ones, which carve their declaration out of the pool and hold their
       own pools. A namespace in no pool needs nothing more: whatever it holds, no verdict about
       it reads it, so a review there costs the same few reads however many tenants without a
       budget lie beside or below it.
    """
    below = tuple(dict.fromkeys(subtrees))
    scope = tuple(dict.fromkeys([*namespaces, *below]))
    found: dict[tuple[str, str], Tenant | App] = {}

    def add(objects: Found) -> None:
        for obj in objects:
            found.setdefault(obj.release_key, obj)

    wanted: dict[str, set[str]] = {}
    for namespace in scope:
        current: str | None = namespace
        while current is not None and (owner := owner_of(current)) is not None:
            release_namespace, name = owner
            # `tenant--x` names a parent `tenant-`, which cannot exist: nothing to read there
            if name and is_dns_label(release_namespace):
                wanted.setdefault(release_namespace, set()).add(name)
            current = None if current == release_namespace else release_namespace
    for release_namespace, names in sorted(wanted.items()):
        labelled = yield TenantsNamed(release_namespace, tuple(sorted(names)))
        add(labelled)
        canonical = {
            t.name
            for t in labelled
            if isinstance(t, Tenant) and t.name is not None and t.release == f"tenant-{t.name}"
        }
        if names - canonical:
            add((yield UnnamedTenants(release_namespace)))

    owned = owners(t for t in found.values() if isinstance(t, Tenant))
    starts = [root for root in (pool_root(owned, n) for n in scope) if root is not None]
    pending = list(dict.fromkeys([*starts, *below]))
    visited: set[str] = set()
    while pending:
        namespace = pending.pop()
        if namespace in visited:
            continue
        visited.add(namespace)
        objects = yield ReleasesIn(namespace)
        add(objects)
        pending.extend(
            obj.owned_namespace
            for obj in objects
            if isinstance(obj, Tenant) and obj.owned_namespace is not None and not obj.bounded
        )
    return Tenancy(
        tuple(o for o in found.values() if isinstance(o, Tenant)),
        tuple(o for o in found.values() if isinstance(o, App)),
    )


def read_scope(
    namespaces: Iterable[str], read: Callable[[Read], Found], subtrees: Iterable[str] = ()
) -> Tenancy:
    """The tenancy of `scoped_reads`, each read answered by `read`."""
    reads = scoped_reads(namespaces, subtrees)
    try:
        request = next(reads)
        while True:
            request = reads.send(read(request))
    except StopIteration as done:
        tenancy: Tenancy = done.value
        return tenancy
