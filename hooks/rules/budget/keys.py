"""Budget keys: the total key and one per class, and the values a `resourceQuotas` map holds."""

from __future__ import annotations

from collections.abc import Mapping

from hooks.rules.quantity import QuantityError, parse_units
from hooks.wire.cozystack import QuotaValue
from hooks.wire.names import is_dns_label

TOTAL_KEY = "gpuclass.cozystack.io/devices"
CLASS_KEY_SUFFIX = ".gpuclass.cozystack.io/devices"
GPU_DOMAIN = "gpuclass.cozystack.io"


def class_key(class_name: str) -> str:
    return f"{class_name}{CLASS_KEY_SUFFIX}"


def in_gpu_domain(key: str) -> bool:
    """A key whose domain ends with `gpuclass.cozystack.io`, dot or no dot, in any case:
    `l40sgpuclass.cozystack.io/devices` is a typo of a budget key, not some other key. A key with
    no `/` is all domain: `gpuclass.cozystack.io` alone is a budget key with its name left off."""
    domain = key.partition("/")[0]
    return domain.strip().lower().endswith(GPU_DOMAIN)


def is_budget_key(key: str) -> bool:
    """Exactly the total key, or `<class>.gpuclass.cozystack.io/devices` for a class name."""
    if key == TOTAL_KEY:
        return True
    class_name = key.removesuffix(CLASS_KEY_SUFFIX)
    return class_name != key and is_dns_label(class_name)


def parse_budget(value: QuotaValue) -> int:
    """A budget value in whole devices; QuantityError when it is not one. A JSON number is held
    to the bounds of a quantity string: whole, non-negative, within int64."""
    if isinstance(value, bool) or value is None:
        raise QuantityError("not a quantity")
    if isinstance(value, int):
        return parse_units(str(value))
    return parse_units(repr(value) if isinstance(value, float) else value)


def tenant_declaration(quotas: Mapping[str, QuotaValue]) -> dict[str, int | None]:
    """A `resourceQuotas` map: budget keys in devices (None where the value does not parse),
    other keys as 0."""
    units: dict[str, int | None] = {}
    for key, value in quotas.items():
        if not is_budget_key(key):
            units[key] = 0
            continue
        try:
            units[key] = parse_budget(value)
        except QuantityError:
            units[key] = None
    return units


def quota_problem(quotas: Mapping[str, QuotaValue]) -> str | None:
    """`resourceQuotas.<key>: <why>` for the first budget key (sorted) whose value is not a whole,
    non-negative number of devices; None when every one is."""
    for key in sorted(quotas):
        if is_budget_key(key):
            try:
                parse_budget(quotas[key])
            except QuantityError as error:
                return f"resourceQuotas.{key}: {error}"
    return None
