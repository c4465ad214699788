"""KubeVirt's cluster instance types as the budgets read them: the devices each attaches to a VM
that names it. Each is decoded on its own, so that one that does not decode fails closed only
for the apps that name it."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from hooks.rules.budget.reservations import Catalog
from hooks.rules.classes import ClassIdentity
from hooks.wire.kube import Instancetype, NameOnlyMeta
from hooks.wire.problems import Undecodable, decoded

INSTANCE_TYPES_API = "/apis/instancetype.kubevirt.io/v1beta1/virtualmachineclusterinstancetypes"


class _Head(msgspec.Struct, kw_only=True):
    metadata: NameOnlyMeta = NameOnlyMeta()


_INSTANCE_TYPE = msgspec.json.Decoder(Instancetype)
_HEAD = msgspec.json.Decoder(_Head)


def attached_by_type(
    raws: Iterable[msgspec.Raw],
) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """The devices each instance type attaches (those that attach none are left out), and the
    problem of each that does not decode, by name. One whose name cannot be read is named by
    no app."""
    devices: dict[str, tuple[str, ...]] = {}
    problems: dict[str, str] = {}
    for raw in raws:
        try:
            instance_type = decoded(_INSTANCE_TYPE, raw)
        except Undecodable as problem:
            try:
                name = decoded(_HEAD, raw).metadata.name
            except Undecodable:
                continue
            problems[name] = str(problem)
            continue
        gpus = tuple(gpu.device_name for gpu in instance_type.spec.gpus)
        if gpus:
            devices[instance_type.metadata.name] = gpus
    return devices, problems


def catalog_of(classes: Iterable[ClassIdentity], instance_types: Iterable[msgspec.Raw]) -> Catalog:
    """The catalog of these classes and cluster instance types."""
    devices, problems = attached_by_type(instance_types)
    return Catalog(tuple(classes), devices, problems)
