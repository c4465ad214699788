"""Pool subtrees: which namespaces a pool's report reads.

A pool's figures read its own tenant's releases and every release in the namespaces below it
(`pools`: members, carve-outs, unplaced tenants in a member namespace), never anything beside or
above. So each tenant namespace names, by its depth, every namespace on its way up (itself
included) that may be a pool root, and a pool root's report selects its subtree by the one name at
its own depth. Depth is a name's alone (`namespace_chain`), so a label written per depth never
has to move.
"""

from __future__ import annotations

from collections.abc import Iterable

from hooks.rules.budget.pools import owners
from hooks.rules.budget.tenancy import Tenant, owner_of, parent_namespace


def namespace_chain(namespace: str) -> tuple[str, ...]:
    """The namespace and those above it, `tenant-root` first; empty for a namespace no tenant
    could own (its depth in a tree is the index of its own name)."""
    if owner_of(namespace) is None:
        return ()
    found: list[str] = []
    current: str | None = namespace
    while current is not None:
        found.append(current)
        current = parent_namespace(current)
    return tuple(reversed(found))


def pool_roots_above(namespace: str, tenants: Iterable[Tenant]) -> dict[int, str]:
    """By depth, each namespace on the chain whose owner is bounded, as the pool arithmetic decides
    it from the same releases (two releases claiming one namespace make an owner that cannot be
    read, which counts as bounded). Given every Tenant release that claims a namespace on the
    chain, a pool root whose report needs this namespace is always among them."""
    owned = owners(tenants)
    return {
        depth: ancestor
        for depth, ancestor in enumerate(namespace_chain(namespace))
        if ancestor in owned and owned[ancestor].bounded
    }
