import pytest

from hooks.rules.selectors import SelectorError, parse_selector, selector_matches
from hooks.wire.metacontroller import LabelSelector, Requirement


def test_empty_selector_means_everything() -> None:
    assert parse_selector("") is None
    assert parse_selector("   ") is None
    assert selector_matches(None, {})


def test_kubectl_syntax_becomes_label_selector() -> None:
    assert parse_selector("a=b,c!=d,e in (y, x),f,!g,h==i, j notin (z)") == LabelSelector(
        match_labels={"a": "b", "h": "i"},
        match_expressions=[
            Requirement(key="c", operator="NotIn", values=["d"]),
            Requirement(key="e", operator="In", values=["x", "y"]),
            Requirement(key="f", operator="Exists"),
            Requirement(key="g", operator="DoesNotExist"),
            Requirement(key="j", operator="NotIn", values=["z"]),
        ],
    )


def test_prefixed_keys_and_empty_values() -> None:
    assert parse_selector(
        "kubevirt.io=virt-launcher,nvidia.com/gpu.present=true,x="
    ) == LabelSelector(
        match_labels={"kubevirt.io": "virt-launcher", "nvidia.com/gpu.present": "true", "x": ""}
    )


@pytest.mark.parametrize(
    "text", ["a=((", "a in ()", "=b", "a=b,", "a b", "a=b=c", "a in (x", "a=1,a=2"]
)
def test_malformed_selectors_are_refused(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(text)


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a=b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a!=b", {"a": "b"}, False),
        ("a in (x,y)", {"a": "y"}, True),
        ("a in (x,y)", {}, False),
        ("a notin (x)", {}, True),
        ("a", {"a": ""}, True),
        ("!a", {"a": ""}, False),
    ],
)
def test_selector_matching_follows_kubernetes(
    text: str, labels: dict[str, str], expected: bool
) -> None:
    assert selector_matches(parse_selector(text), labels) is expected
