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


def test_selector_errors_word_for_word() -> None:
    from hooks.rules.selectors import SelectorError, parse_selector, requirement_matches
    from hooks.wire.metacontroller import Requirement

    cases = {
        "a=b,(": "cannot parse selector at '('",
        "a in ()": "invalid values for a",
        "a=b,a=c": "a is required to equal two values",
        "a=b,": "selector ends with a comma",
    }
    for text, message in cases.items():
        with pytest.raises(SelectorError) as raised:
            parse_selector(text)
        assert str(raised.value) == message, text
    with pytest.raises(SelectorError, match=r"^unknown operator Near$"):
        requirement_matches(Requirement(key="a", operator="Near"), {"a": "b"})


def test_a_namespace_selector_selects_by_the_labels_of_the_namespace_only() -> None:
    from hooks.rules.selectors import rule_selects
    from hooks.wire.metacontroller import LabelSelector, RelatedRule

    rule = RelatedRule(
        api_version="v1",
        resource="secrets",
        namespace_selector=LabelSelector(match_labels={"vgpu": "true"}),
    )
    assert rule_selects(rule, "s", "tenant-a", {}, {"vgpu": "true"})
    assert not rule_selects(rule, "s", "tenant-b", {"vgpu": "true"}, {"vgpu": "false"})
    plain = RelatedRule(api_version="v1", resource="secrets")
    assert rule_selects(plain, "s", "tenant-b", {}, {})
