"""Which namespace is which: tenants, their namespaces and their parents
(`hooks.rules.budget.tenancy`)."""

from __future__ import annotations

from hooks.rules.budget.tenancy import (
    parent_namespace,
    tenant_namespace,
)


def test_tenant_namespaces() -> None:
    assert tenant_namespace("tenant-root", "root") == "tenant-root"
    assert tenant_namespace("tenant-root", "a") == "tenant-a"
    assert tenant_namespace("tenant-a", "b") == "tenant-a-b"
    assert parent_namespace("tenant-a-b") == "tenant-a"
    assert parent_namespace("tenant-a") == "tenant-root"
    assert parent_namespace("tenant-root") is None
    assert parent_namespace("cozy-system") is None


def test_owner_of_is_the_inverse_of_tenant_namespace() -> None:
    from hooks.rules.budget.tenancy import owner_of

    for release_namespace, name in (
        ("tenant-root", "root"),
        ("tenant-root", "a"),
        ("tenant-a", "b"),
    ):
        assert owner_of(tenant_namespace(release_namespace, name)) == (release_namespace, name)
    assert owner_of("default") is None
