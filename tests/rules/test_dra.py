"""The free units of a DRA class (hooks.rules.dra): each step by example, and the whole against an
independent model over random slices, generations, shared PCI addresses, counters, taints,
DeviceTaintRules and claims."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooks.rules.dra import PCI_BUS_ID, compute_dra_capacity, device_class_selector
from hooks.wire.dra import DeviceTaintRule, ResourceClaim, ResourceSlice
from hooks.wire.gpuclass import Toleration
from hooks.wire.kube import Node
from tests.builders import DRIVER, as_wire, claim, device, node, resource_slice, taint_rule

VFIO = {"type": "vfio"}


def capacity(  # type: ignore[no-untyped-def]
    slices, claims=(), nodes=None, attributes=VFIO, tolerations=(), rules=()
):
    nodes = nodes if nodes is not None else [node("n1", gpus=None), node("n2", gpus=None)]
    return compute_dra_capacity(
        [as_wire(s, ResourceSlice) for s in slices],
        [as_wire(c, ResourceClaim) for c in claims],
        [as_wire(n, Node) for n in nodes],
        DRIVER,
        attributes,
        [Toleration.model_validate(t) for t in tolerations],
        [as_wire(r, DeviceTaintRule) for r in rules],
    )


def test_free_counts_the_class_devices_per_node_and_the_best_node() -> None:
    result = capacity(
        [
            resource_slice(
                "n1", [device("a"), device("b"), device("c", kind="gpu")], node_name="n1"
            ),
            resource_slice("n2", [device("a")], node_name="n2"),
        ]
    )
    assert (result.free, result.max_free_per_node) == (3, 2)


def test_only_the_latest_generation_of_a_pool_counts() -> None:
    result = capacity(
        [
            resource_slice("n1", [device("a"), device("b")], node_name="n1", generation=1),
            resource_slice("n1", [device("a")], node_name="n1", generation=2),
        ]
    )
    assert result.free == 1


def test_an_incomplete_pool_counts_nothing_and_is_named() -> None:
    result = capacity([resource_slice("n1", [device("a")], node_name="n1", count=2)])
    assert result.free == 0
    assert result.incomplete_pools == (f"{DRIVER}/n1",)


def test_attributes_without_a_domain_are_the_drivers() -> None:
    slices = [resource_slice("n1", [device("a")], node_name="n1")]
    assert capacity(slices, attributes={f"{DRIVER}/type": "vfio", "index": 0}).free == 1
    assert capacity(slices, attributes={"index": "0"}).free == 0
    assert capacity(slices, attributes={"other.example.com/type": "vfio"}).free == 0


def test_an_allocated_device_is_taken_unless_for_admin_access() -> None:
    slices = [resource_slice("n1", [device("a"), device("b")], node_name="n1")]
    assert capacity(slices, [claim(("n1", "a"))]).free == 1
    assert capacity(slices, [claim(("n1", "a"), admin=True)]).free == 2


def test_devices_sharing_a_pci_address_are_one_unit_taken_by_any_of_them() -> None:
    card = [device("gpu-0", kind="gpu", bus="0000:01"), device("vfio-0", bus="0000:01")]
    slices = [resource_slice("n1", [*card, device("vfio-1", bus="0000:02")], node_name="n1")]
    assert capacity(slices).free == 2
    taken = capacity(slices, [claim(("n1", "gpu-0"))])
    assert (taken.free, taken.nodes[0].units, taken.nodes[0].taken) == (1, 2, 1)


def test_a_device_is_free_only_while_its_counters_fit_what_is_left() -> None:
    devices = [device("m1", draws={"memory": "40Gi"}), device("m2", draws={"memory": "60Gi"})]
    slices = [resource_slice("n1", devices, node_name="n1", counters={"memory": "80Gi"})]
    assert capacity(slices).free == 2
    assert capacity(slices, [claim(("n1", "m1"))]).free == 0


def test_an_untolerated_device_taint_excludes_the_device() -> None:
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}
    slices = [resource_slice("n1", [device("a", taints=[taint]), device("b")], node_name="n1")]
    assert capacity(slices).free == 1
    tolerated = capacity(slices, tolerations=[{"key": "gpu.nvidia.com/xid", "operator": "Exists"}])
    assert tolerated.free == 2


def test_a_device_taint_rule_taints_the_devices_its_every_set_field_selects() -> None:
    slices = [
        resource_slice("n1", [device("a"), device("b")], node_name="n1"),
        resource_slice("n2", [device("a")], node_name="n2"),
    ]
    assert capacity(slices, rules=[taint_rule("one", {"pool": "n1", "device": "a"})]).free == 2
    assert capacity(slices, rules=[taint_rule("pool", {"driver": DRIVER, "pool": "n1"})]).free == 1
    assert capacity(slices, rules=[taint_rule("every", {})]).free == 0
    assert capacity(slices, rules=[taint_rule("other", {"driver": "x.io"})]).free == 3
    assert capacity(slices, rules=[taint_rule("none", None)]).free == 3
    assert capacity(slices, rules=[taint_rule("inert", {}, effect="None")]).free == 3
    tolerated = [{"key": "maintenance", "operator": "Exists"}]
    assert capacity(slices, rules=[taint_rule("every", {})], tolerations=tolerated).free == 3


def test_a_device_whose_attributes_do_not_decode_is_named_and_counts_nothing() -> None:
    """Only the class's attributes and the PCI address are read: a malformed one of those skips
    its device alone, and says which; a malformed attribute the class does not read is unread."""
    bad = {"name": "bad", "attributes": {"type": {"string": 3}}}
    unread = {"name": "odd", "attributes": {"type": {"string": "vfio"}, "x": {"int": "7"}}}
    bare = [{"name": "bare"}, {"name": "null", "attributes": None}]  # of no class, and valid
    slices = [resource_slice("n1", [device("a"), bad, unread, *bare], node_name="n1")]
    result = capacity(slices)
    assert result.free == 2
    assert [(i.kind, i.name, i.reason) for i in result.invalid] == [
        ("ResourceSlice", "n1-1", "device bad: attributes do not decode")
    ]


def test_the_node_rules_apply_and_several_nodes_count_on_none() -> None:
    slices = [
        resource_slice("n1", [device("a")], node_name="n1"),
        resource_slice("fabric", [device("x"), device("y")]),
    ]
    result = capacity(slices, nodes=[node("n1", gpus=None, unschedulable=True)])
    assert (result.free, result.max_free_per_node) == (2, 0)
    assert result.nodes[0].not_eligible_because == "cordoned"


def test_with_per_device_node_selection_each_device_says_its_node() -> None:
    devices = [
        device("a") | {"nodeName": "n1"},
        device("b") | {"nodeName": "n2"},
        device("c") | {"nodeName": "n2"},
        device("x") | {"allNodes": True},
    ]
    made = resource_slice("fabric", devices)
    del made["spec"]["allNodes"]
    made["spec"]["perDeviceNodeSelection"] = True
    result = capacity([made])
    assert [(n.name, n.units, n.free) for n in result.nodes] == [("n1", 1, 1), ("n2", 2, 2)]
    assert (result.shared.units, result.free, result.max_free_per_node) == (1, 4, 2)


def test_a_driver_with_no_slice_is_not_publishing() -> None:
    assert not capacity(
        [resource_slice("n1", [device("a")], node_name="n1", driver="x.io")]
    ).publishing
    assert capacity([resource_slice("n1", [], node_name="n1")]).publishing


# --- the independent model ------------------------------------------------------------------


def model_free(
    slices: list[dict[str, Any]],
    claims: list[dict[str, Any]],
    eligible: set[str],
    kind: str,
    tolerated: bool,
    rules: list[dict[str, Any]],
) -> tuple[int, int]:
    """(free, max free per node) by brute force: each device against every other."""
    complete = []
    for pool in {s["spec"]["pool"]["name"] for s in slices}:
        mine = [s for s in slices if s["spec"]["pool"]["name"] == pool]
        top = max(s["spec"]["pool"]["generation"] for s in mine)
        latest = [s for s in mine if s["spec"]["pool"]["generation"] == top]
        if all(s["spec"]["pool"]["resourceSliceCount"] == len(latest) for s in latest):
            complete += latest
    devices = [(s, d) for s in complete for d in s["spec"]["devices"]]
    held = [
        (r["pool"], r["device"])
        for c in claims
        for r in c["status"]["allocation"]["devices"]["results"]
        if not r["adminAccess"]
    ]

    def pool_of(s: dict[str, Any]) -> str:
        return str(s["spec"]["pool"]["name"])

    def bus(d: dict[str, Any]) -> str | None:
        return d["attributes"].get(PCI_BUS_ID, {}).get("string")

    def same_unit(a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
        if pool_of(a[0]) != pool_of(b[0]):
            return False
        return a[1]["name"] == b[1]["name"] or (bus(a[1]) is not None and bus(a[1]) == bus(b[1]))

    def ruled(x: tuple[Any, Any]) -> bool:
        here = {"driver": x[0]["spec"]["driver"], "pool": pool_of(x[0]), "device": x[1]["name"]}
        return any(
            "deviceSelector" in r["spec"]
            and r["spec"]["taint"]["effect"] != "None"
            and all(here[k] == v for k, v in r["spec"]["deviceSelector"].items())
            for r in rules
        )

    def is_taken(x: tuple[Any, Any]) -> bool:
        return (pool_of(x[0]), x[1]["name"]) in held

    def fits(x: tuple[Any, Any]) -> bool:
        for draw in x[1].get("consumesCounters", []):
            for counter, value in draw["counters"].items():
                total = sum(
                    int(cs["counters"][counter]["value"])
                    for s in complete
                    if pool_of(s) == pool_of(x[0])
                    for cs in s["spec"].get("sharedCounters", [])
                    if counter in cs["counters"]
                )
                used = sum(
                    int(v["value"])
                    for y in devices
                    if pool_of(y[0]) == pool_of(x[0]) and is_taken(y)
                    for dr in y[1].get("consumesCounters", [])
                    for c, v in dr["counters"].items()
                    if c == counter
                )
                if int(value["value"]) > total - used:
                    return False
        return True

    free_devices = [
        x
        for x in devices
        if x[1]["attributes"]["type"]["string"] == kind
        and (tolerated or not (x[1].get("taints") or ruled(x)))
        and not any(same_unit(x, y) and is_taken(y) for y in devices)
        and fits(x)
    ]
    units: list[tuple[Any, Any]] = []
    for x in free_devices:
        if not any(same_unit(x, u) for u in units):
            units.append(x)
    per_node: dict[str, int] = {}
    shared = 0
    for s, _ in units:
        where = s["spec"].get("nodeName")
        if where is None:
            shared += 1
        elif where in eligible:
            per_node[where] = per_node.get(where, 0) + 1
    return sum(per_node.values()) + shared, max(per_node.values(), default=0)


NODES = ["n1", "n2", "n3"]


@st.composite
def clusters(
    draw: st.DrawFn,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    slices = []
    for pool in [*NODES, "fabric"]:
        for generation in draw(st.sets(st.sampled_from([1, 2]), max_size=2)):
            count = draw(st.integers(1, 2))
            for part in range(draw(st.integers(1, 2))):
                devices = [
                    device(
                        f"d{part}-{i}",
                        kind=draw(st.sampled_from(["vfio", "gpu"])),
                        bus=draw(st.sampled_from([None, "0000:01", "0000:02"])),
                        taints=draw(
                            st.sampled_from([None, [{"key": "xid", "effect": "NoSchedule"}]])
                        ),
                        draws=draw(st.sampled_from([None, {"memory": "1"}, {"memory": "3"}])),
                    )
                    for i in range(draw(st.integers(0, 3)))
                ]
                made = resource_slice(
                    pool,
                    devices,
                    node_name=None if pool == "fabric" else pool,
                    generation=generation,
                    count=count,
                    counters=draw(st.sampled_from([None, {"memory": "4"}])) if part == 0 else None,
                )
                made["metadata"]["name"] += f"-{part}"
                slices.append(made)
    names = [(s["spec"]["pool"]["name"], d["name"]) for s in slices for d in s["spec"]["devices"]]
    claims = [
        claim(held, admin=draw(st.booleans()))
        for held in (draw(st.lists(st.sampled_from(names), max_size=4)) if names else [])
    ]
    selectors = st.none() | st.fixed_dictionaries(
        {},
        optional={
            "driver": st.sampled_from([DRIVER, "x.io"]),
            "pool": st.sampled_from([*NODES, "fabric"]),
            "device": st.sampled_from(sorted({n for _, n in names}) or ["d0-0"]),
        },
    )
    rules = [
        taint_rule(f"r{i}", selector, key="xid", effect=effect)
        for i, (selector, effect) in enumerate(
            draw(
                st.lists(
                    st.tuples(selectors, st.sampled_from(["NoSchedule", "None"])),
                    min_size=1,
                    max_size=2,
                )
            )
        )
    ]
    return slices, claims, rules


@given(clusters(), st.sets(st.sampled_from(NODES)), st.sampled_from(["vfio", "gpu"]), st.booleans())
def test_free_units_agree_with_an_independent_model(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]],
    ready: set[str],
    kind: str,
    tolerated: bool,
) -> None:
    slices, claims, rules = cluster
    nodes = [node(n, gpus=None, ready="True" if n in ready else "False") for n in NODES]
    tolerations = [{"key": "xid", "operator": "Exists"}] if tolerated else []
    result = capacity(
        slices, claims, nodes, attributes={"type": kind}, tolerations=tolerations, rules=rules
    )
    assert (result.free, result.max_free_per_node) == model_free(
        slices, claims, ready, kind, tolerated, rules
    )


def test_the_selector_is_the_drivers_and_every_attributes_equality() -> None:
    selector = device_class_selector(DRIVER, {"type": "vfio", "index": 0, "x.io/ok": "yes"})
    assert selector == (
        'device.driver == "gpu.nvidia.com"'
        ' && has(device.attributes["gpu.nvidia.com"].index)'
        ' && device.attributes["gpu.nvidia.com"].index == 0'
        ' && has(device.attributes["gpu.nvidia.com"].type)'
        ' && device.attributes["gpu.nvidia.com"].type == "vfio"'
        ' && has(device.attributes["x.io"].ok) && device.attributes["x.io"].ok == "yes"'
    )


@pytest.mark.parametrize(
    "hostile", ['" || true || "', "\\", '\\"', "a\nb", "\u2028", "'", "`", "\x00"]
)
def test_a_string_value_cannot_end_its_literal(hostile: str) -> None:
    selector = device_class_selector(DRIVER, {"model": hostile})
    literal = selector.rsplit(" == ", 1)[1]
    assert literal.startswith('"') and literal.endswith('"')
    body = literal[1:-1]
    # every quote inside is escaped, and every backslash begins an escape
    unescaped = body.replace("\\\\", "").replace('\\"', "")
    assert '"' not in unescaped and "\n" not in body and "\x00" not in body
    assert json.loads(literal) == hostile
