from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooks.rules.scheduling import ineligibility, tolerates
from hooks.wire.gpuclass import Toleration
from hooks.wire.kube import Node, Taint
from tests.builders import as_wire, node


def toleration(**fields: Any) -> Toleration:
    return Toleration.model_validate(fields)


def taint(key: str = "nvidia.com/gpu", value: str = "", effect: str = "NoSchedule") -> Taint:
    return Taint(key=key, value=value, effect=effect)


def test_node_eligibility_requires_ready_condition_true() -> None:
    assert ineligibility(as_wire(node("a"), Node), []) is None
    for status in ("False", "Unknown", None):
        assert ineligibility(as_wire(node("a", ready=status), Node), []) == "not Ready"


def test_node_eligibility_excludes_cordoned_nodes() -> None:
    assert ineligibility(as_wire(node("a", unschedulable=True), Node), []) == "cordoned"


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_node_eligibility_excludes_untolerated_noschedule_and_noexecute_taints(effect: str) -> None:
    tainted = as_wire(node("a", taints=[{"key": "gpu", "value": "x", "effect": effect}]), Node)
    assert ineligibility(tainted, []) == f"taint gpu=x:{effect} not tolerated"
    assert ineligibility(tainted, [toleration(key="gpu", operator="Exists")]) is None


def test_prefer_no_schedule_taint_never_excludes_a_node() -> None:
    tainted = as_wire(node("a", taints=[{"key": "gpu", "effect": "PreferNoSchedule"}]), Node)
    assert ineligibility(tainted, []) is None


def test_toleration_effect_must_equal_taint_effect_when_set() -> None:
    assert not tolerates(
        toleration(key="nvidia.com/gpu", operator="Exists", effect="NoExecute"), taint()
    )
    assert tolerates(
        toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"), taint()
    )
    assert tolerates(toleration(key="nvidia.com/gpu", operator="Exists"), taint(effect="NoExecute"))


def test_toleration_empty_key_with_exists_matches_every_taint() -> None:
    everything = toleration(operator="Exists")
    assert tolerates(everything, taint(key="a", value="b"))
    assert tolerates(everything, taint(key="c", effect="NoExecute"))


def test_toleration_keys_must_be_equal() -> None:
    assert not tolerates(toleration(key="other", operator="Exists"), taint())


def test_toleration_exists_ignores_value_and_equal_needs_equal_values() -> None:
    assert tolerates(toleration(key="k", operator="Exists", value=""), taint(key="k", value="v"))
    assert tolerates(toleration(key="k", operator="Equal", value="v"), taint(key="k", value="v"))
    assert not tolerates(
        toleration(key="k", operator="Equal", value="w"), taint(key="k", value="v")
    )
    assert tolerates(toleration(key="k", value="v"), taint(key="k", value="v"))
    assert not tolerates(toleration(key="k"), taint(key="k", value="v"))


def test_toleration_with_unknown_operator_matches_nothing() -> None:
    assert not tolerates(toleration(key="k", operator="Gt", value="v"), taint(key="k", value="v"))


def test_toleration_seconds_play_no_part() -> None:
    timed = toleration(key="k", operator="Exists", tolerationSeconds=0)
    assert tolerates(timed, taint(key="k", effect="NoExecute"))


keys = st.sampled_from(["a", "b", "nvidia.com/gpu"])
values = st.sampled_from(["", "x", "y"])
effects = st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])
taints = st.builds(lambda k, v, e: {"key": k, "value": v, "effect": e}, keys, values, effects)
tolerations = st.builds(
    lambda k, o, v, e: {"key": k, "operator": o, "value": v if o != "Exists" else "", "effect": e},
    keys,
    st.sampled_from(["Exists", "Equal"]),
    values,
    st.sampled_from(["", "NoSchedule", "NoExecute"]),
)


@given(st.lists(taints, max_size=4), st.lists(tolerations, max_size=4), taints)
def test_adding_a_tolerated_taint_never_changes_eligibility(
    existing: list[dict[str, str]], given_tolerations: list[dict[str, str]], extra: dict[str, str]
) -> None:
    parsed = [toleration(**t) for t in given_tolerations]
    if not any(tolerates(t, Taint(**extra)) for t in parsed):
        parsed.append(toleration(key=extra["key"], operator="Exists"))
    before = ineligibility(as_wire(node("n", taints=existing), Node), parsed)
    after = ineligibility(as_wire(node("n", taints=[*existing, extra]), Node), parsed)
    assert (before is None) == (after is None)


@given(
    st.lists(taints, max_size=4),
    st.lists(tolerations, max_size=4),
    st.lists(tolerations, max_size=3),
)
def test_more_tolerations_never_make_a_node_ineligible(
    node_taints: list[dict[str, str]], base: list[dict[str, str]], more: list[dict[str, str]]
) -> None:
    subject = as_wire(node("n", taints=node_taints), Node)
    fewer = ineligibility(subject, [toleration(**t) for t in base])
    extra = ineligibility(subject, [toleration(**t) for t in base + more])
    assert fewer is not None or extra is None


@given(taints)
def test_empty_key_exists_toleration_tolerates_any_taint(any_taint: dict[str, str]) -> None:
    assert tolerates(toleration(operator="Exists"), Taint(**any_taint))


def test_a_taint_without_a_value_is_shown_by_its_key() -> None:

    bare = as_wire(node("n", taints=[{"key": "maintenance", "effect": "NoSchedule"}]), Node)
    assert ineligibility(bare, []) == "taint maintenance:NoSchedule not tolerated"
    valued = [{"key": "maintenance", "value": "firmware", "effect": "NoExecute"}]
    assert ineligibility(as_wire(node("n", taints=valued), Node), []) == (
        "taint maintenance=firmware:NoExecute not tolerated"
    )
