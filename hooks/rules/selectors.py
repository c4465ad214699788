"""Label selectors in kubectl syntax (`a=b,c!=d,e in (x,y),f,!g`), and how they match labels."""

from __future__ import annotations

import re
from collections.abc import Mapping

from hooks.wire.metacontroller import LabelSelector, RelatedRule, Requirement

_KEY = r"(?:[a-z0-9A-Z](?:[-a-z0-9A-Z_.]*[a-z0-9A-Z])?/)?[a-z0-9A-Z](?:[-a-z0-9A-Z_.]*[a-z0-9A-Z])?"
_VALUE = r"(?:[a-z0-9A-Z](?:[-a-z0-9A-Z_.]*[a-z0-9A-Z])?)?"
_TERM = re.compile(
    rf"\s*(?:(?P<not>!)\s*(?P<absent>{_KEY})"
    rf"|(?P<setkey>{_KEY})\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\)"
    rf"|(?P<eqkey>{_KEY})\s*(?P<eqop>==|=|!=)\s*(?P<value>{_VALUE})"
    rf"|(?P<exists>{_KEY}))\s*(?:,|$)"
)


class SelectorError(ValueError):
    pass


def parse_selector(text: str) -> LabelSelector | None:
    """The LabelSelector for a kubectl-syntax selector; None for an empty one (everything)."""
    text = text.strip()
    if not text:
        return None
    match_labels: dict[str, str] = {}
    expressions: list[Requirement] = []
    position = 0
    while position < len(text):
        match = _TERM.match(text, position)
        if match is None or match.end() == position:
            raise SelectorError(f"cannot parse selector at {text[position:]!r}")
        position = match.end()
        if match["absent"]:
            expressions.append(Requirement(key=match["absent"], operator="DoesNotExist"))
        elif match["setkey"]:
            values = sorted({v.strip() for v in match["values"].split(",") if v.strip()})
            if not values or any(not re.fullmatch(_VALUE, v) for v in values):
                raise SelectorError(f"invalid values for {match['setkey']}")
            operator = "In" if match["setop"] == "in" else "NotIn"
            expressions.append(Requirement(key=match["setkey"], operator=operator, values=values))
        elif match["eqkey"]:
            key, value = match["eqkey"], match["value"]
            if match["eqop"] == "!=":
                expressions.append(Requirement(key=key, operator="NotIn", values=[value]))
            elif match_labels.get(key, value) != value:
                raise SelectorError(f"{key} is required to equal two values")
            else:
                match_labels[key] = value
        else:
            expressions.append(Requirement(key=match["exists"], operator="Exists"))
        if text[position - 1 : position] == "," and position == len(text):
            raise SelectorError("selector ends with a comma")
    return LabelSelector(match_labels=match_labels or None, match_expressions=expressions or None)


def requirement_matches(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    present = requirement.key in labels
    values = requirement.values or []
    match requirement.operator:
        case "In":
            return present and labels[requirement.key] in values
        case "NotIn":
            return not present or labels[requirement.key] not in values
        case "Exists":
            return present
        case "DoesNotExist":
            return not present
    raise SelectorError(f"unknown operator {requirement.operator}")


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes semantics; no selector selects everything (as Metacontroller treats it)."""
    if selector is None:
        return True
    for key, value in (selector.match_labels or {}).items():
        if labels.get(key) != value:
            return False
    return all(requirement_matches(r, labels) for r in selector.match_expressions or [])


class RuleError(ValueError):
    """A related-resource rule Metacontroller refuses (it fails the parent's sync)."""


def check_rule(rule: RelatedRule) -> None:
    """Metacontroller's own refusals (`determineSelectionType`): names beside a label or
    namespace selector, and a namespace beside a namespace selector. A label selector within one
    namespace is a rule of its own."""
    if rule.names and (rule.label_selector is not None or rule.namespace_selector is not None):
        raise RuleError(
            f"{rule.api_version} {rule.resource}: names cannot be combined with "
            "labelSelector or namespaceSelector"
        )
    if rule.namespace and rule.namespace_selector is not None:
        raise RuleError(
            f"{rule.api_version} {rule.resource}: namespace cannot be combined with "
            "namespaceSelector"
        )


def rule_selects(
    rule: RelatedRule,
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    namespace_labels: Mapping[str, str],
) -> bool:
    """Whether Metacontroller would send this object for the rule (the parent is cluster-scoped).
    `names: []` and an omitted selector both mean "no filter"."""
    check_rule(rule)
    if rule.namespace and namespace != rule.namespace:
        return False
    if rule.names and name not in rule.names:
        return False
    if rule.namespace_selector is not None and not selector_matches(
        rule.namespace_selector, namespace_labels
    ):
        return False
    return selector_matches(rule.label_selector, labels)
