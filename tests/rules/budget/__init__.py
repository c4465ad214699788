"""The budget rules of docs/gpu-budgets.md, one test module per module of `hooks.rules.budget`;
the tenants, apps and classes they are tried on."""

from __future__ import annotations

from dataclasses import replace

from hooks.rules.budget.apps import AppCheck
from hooks.rules.budget.declarations import check_declaration
from hooks.rules.budget.keys import TOTAL_KEY, class_key
from hooks.rules.budget.reservations import Catalog
from hooks.rules.budget.tenancy import KUBERNETES_NODES, VM_INSTANCE, App, Group, Tenant, pool_size
from hooks.rules.budget.verdicts import Verdict
from hooks.rules.classes import ClassIdentity

L40S, H100 = "nvidia.com/NVIDIA_L40S-24Q", "nvidia.com/GH100_H100_PCIE"
CLASSES = (
    ClassIdentity("l40s", "2026-01-01T00:00:00Z", False, L40S),
    ClassIdentity("h100", "2026-01-01T00:00:00Z", False, H100),
)
CATALOG = Catalog(CLASSES)
L40S_KEY = class_key("l40s")
A10 = "nvidia.com/NVIDIA_A10-24Q"  # a resource no class of CLASSES names
UNREADABLE_VM = App(
    "tenant-a",
    VM_INSTANCE,
    "legacy",
    unreadable="HelmRelease tenant-a/vm-instance-legacy: spec.values.gpus: expected a list, got "
    "null",
    release="vm-instance-legacy",
)


def root(**quota: int) -> Tenant:
    return Tenant(
        "tenant-root", "root", {k.replace("__", "/").replace("_", "."): v for k, v in quota.items()}
    )


def vm(namespace: str, name: str, *gpus: str, instance_type: str | None = None) -> App:
    return App(namespace, VM_INSTANCE, name, (Group(tuple(gpus), instance_type),))


def pool(
    namespace: str,
    name: str,
    *gpus: str,
    max_replicas: int = 10,
    min_replicas: int = 0,
    instance_type: str | None = None,
) -> App:
    group = Group(tuple(gpus), instance_type, pool_size(max_replicas, min_replicas))
    return App(namespace, KUBERNETES_NODES, name, (group,))


def admit(
    new: App, apps: list[App], tenants: list[Tenant], old: App | None = None
) -> tuple[bool, str]:
    verdict = AppCheck(new=new, old=old, apps=apps, tenants=tenants).verdict(CATALOG)
    return verdict.allowed, verdict.message


def gate(
    new: Tenant, tenants: list[Tenant], apps: list[App] = (), old: Tenant | None = None
) -> tuple[bool, str]:  # type: ignore[assignment]
    verdict = check_declaration(new=new, old=old, apps=apps, tenants=tenants, catalog=CATALOG)
    return verdict.allowed, verdict.message


def broken_tenant(parent_ns: str, name: str, key: str = TOTAL_KEY) -> Tenant:
    return Tenant(
        parent_ns,
        name,
        {key: None},
        f"HelmRelease {parent_ns}/tenant-{name}: spec.values.resourceQuotas.{key}: "
        "extended resources are whole units",
    )


def release_of(app: App, release: str, unreadable: str | None = None) -> App:
    return replace(app, release=release, unreadable=unreadable)


def check_app(
    *,
    new: App,
    old: App | None,
    apps: list[App],
    tenants: list[Tenant],
    catalog: Catalog,
    creating: bool | None = None,
) -> Verdict:
    """The app check's verdict in one call."""
    return AppCheck(new=new, old=old, apps=apps, tenants=tenants, creating=creating).verdict(
        catalog
    )
