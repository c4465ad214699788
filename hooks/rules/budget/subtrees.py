"""Report groups: which namespaces one report target reads, and which pools it reports.

A pool's figures read its own tenant's releases and every release in the namespaces below it
(`pools`: members, carve-outs, unplaced tenants in a member namespace), never anything beside or
above. So every pool below a top-level tenant (a child of `tenant-root`) is computed from that
tenant's subtree alone, plus the release that claims the top-level namespace: each top-level
namespace is one report target for its whole subtree, found by a label that depends on a name
alone (`top_level_namespace`). The root's pool reads the whole tenancy, and only when the root
tenant is bounded (`root_bounded`). Depth is a name's alone (`namespace_chain`): tenant names have
no dashes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from hooks.rules.budget.pools import owners
from hooks.rules.budget.tenancy import ROOT_NAMESPACE, Tenant, owner_of, parent_namespace

ReportGroup = Literal["root", "top_level", "below_top_level"]


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


def top_level_namespace(namespace: str) -> str | None:
    """The top-level tenant's namespace a namespace is in (itself, at depth 1); None for
    `tenant-root` and for a namespace no tenant could own."""
    chain = namespace_chain(namespace)
    return chain[1] if len(chain) > 1 else None


def report_group(namespace: str) -> ReportGroup | None:
    """What a tenant namespace's report target reports: the root's pool, every pool of a
    top-level subtree, or nothing (its pool is its top-level namespace's to report); None for a
    namespace no tenant could own."""
    depth = len(namespace_chain(namespace))
    if depth == 0:
        return None
    return ("root", "top_level", "below_top_level")[min(depth, 3) - 1]


def root_bounded(tenants: Iterable[Tenant]) -> bool:
    """Whether `tenant-root`'s tenant is bounded, as the pool arithmetic decides it from the
    releases that claim it (two claiming it make an owner that cannot be read, which counts as
    bounded)."""
    owner = owners(tenants).get(ROOT_NAMESPACE)
    return owner is not None and owner.bounded
