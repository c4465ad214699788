"""Every setting is declared once, in `hooks.settings.Settings`, and every other place that names
it agrees: the README's settings table (made from it), the chart's values, values schema, docs and
Deployment env. A setting added in one place and not the others fails here."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from hooks.settings import ENV_PREFIX, Settings, declared, readme_with_table
from tests import ROOT, cozystack

CHART = ROOT / "metacontroller"
DEPLOYMENT = CHART / "templates" / "deployment.yaml"
FIELDS = sorted(Settings.model_fields)
ENV_NAME = re.compile(rf"\b{ENV_PREFIX}[A-Z0-9_]+\b")
# Variables of the build, not of the service: where `make` caches the test tools.
# What the build and the tests read, not the service: where Go tools are cached, where
# Cozystack's sources are.
BUILD_VARIABLES = {f"{ENV_PREFIX}TESTENV_CACHE", cozystack.ARCHIVE_VARIABLE}


def env(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


# What the chart takes from Helm itself rather than from values.yaml.
HELM_OBJECTS = {"Release.Namespace"}


def chart_fields() -> list[str]:
    return [name for name in FIELDS if declared(name, "chart") is not None]


def chart_value_fields() -> list[str]:
    return [name for name in chart_fields() if declared(name, "chart") not in HELM_OBJECTS]


def deployment_env() -> set[str]:
    return set(re.findall(rf"- name: ({ENV_PREFIX}[A-Z0-9_]+)", DEPLOYMENT.read_text()))


def values_at(tree: Any, path: str) -> bool:
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def schema_at(schema: dict[str, Any], path: str) -> bool:
    """The schema declares the path, or an object along it that takes any keys (`resources`,
    a Kubernetes ResourceRequirements)."""
    for part in path.split("."):
        if schema.get("type") == "object" and "properties" not in schema:
            return True
        properties = schema.get("properties", {})
        if part not in properties:
            return False
        schema = properties[part]
    return True


def test_the_readme_settings_table_is_made_from_settings() -> None:
    readme = (ROOT / "README.md").read_text()
    assert readme == readme_with_table(readme), "run `make settings-table`"


@pytest.mark.parametrize("name", FIELDS)
def test_every_setting_says_what_it_means_and_whether_the_chart_sets_it(name: str) -> None:
    field = Settings.model_fields[name]
    assert field.description
    chart, reason = declared(name, "chart"), declared(name, "not_in_chart")
    assert (chart is None) != (reason is None), "declare it with hooks.settings.setting"


@pytest.mark.parametrize("name", chart_value_fields())
def test_a_chart_setting_is_a_value_in_values_yaml_the_schema_and_the_install_docs(
    name: str,
) -> None:
    path = declared(name, "chart")
    assert path is not None
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    install = (ROOT / "docs" / "install.md").read_text()
    assert values_at(values, path), f"values.yaml has no {path}"
    assert schema_at(schema, path), f"values.schema.json has no {path}"
    assert f"`{path}`" in install, f"docs/install.md does not name {path}"


def test_the_deployment_sets_exactly_the_chart_settings() -> None:
    assert deployment_env() == {env(name) for name in chart_fields()}


@pytest.mark.parametrize("name", sorted(set(chart_fields()) - set(chart_value_fields())))
def test_a_setting_from_helms_own_objects_is_set_from_that_object(name: str) -> None:
    template = DEPLOYMENT.read_text()
    assert (
        f"- name: {env(name)}\n          value: {{{{ .{declared(name, 'chart')} | quote }}}}"
        in (template)
    )


def test_every_variable_the_docs_and_chart_name_is_a_setting() -> None:
    known = {env(name) for name in FIELDS} | BUILD_VARIABLES
    places = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    places += [
        CHART / "values.yaml",
        *sorted(p for p in (CHART / "templates").rglob("*") if p.is_file()),
    ]
    named = {
        (str(path.relative_to(ROOT)), variable)
        for path in places
        for variable in ENV_NAME.findall(path.read_text())
    }
    assert sorted(n for n in named if n[1] not in known) == []


def schema_node(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The schema of the value at a dotted path; None inside an object that takes any keys."""
    for part in path.split("."):
        if schema.get("type") == "object" and "properties" not in schema:
            return None
        schema = schema["properties"][part]
    return schema


def service_bounds(name: str) -> dict[str, Any]:
    """The bounds the service puts on a setting, as JSON Schema words (pydantic's own schema)."""
    field = Settings.model_json_schema()["properties"][name]
    bounds = dict(field)
    for alternative in field.get("anyOf", []):
        bounds.update(alternative)
    return bounds


def tightest(schema: dict[str, Any], inclusive: str, exclusive: str) -> tuple[float, bool] | None:
    """A schema's bound on one side as (value, exclusive), None without one."""
    if inclusive in schema:
        return schema[inclusive], False
    if exclusive in schema:
        return schema[exclusive], True
    return None


def within(chart: tuple[float, bool] | None, service: tuple[float, bool], upper: bool) -> bool:
    """Whether the chart's bound lets through nothing past the service's bound."""
    if chart is None:
        return False
    (chart_value, chart_strict), (service_value, service_strict) = chart, service
    if chart_value != service_value:
        return chart_value < service_value if upper else chart_value > service_value
    return chart_strict or not service_strict


SIDES = [
    ("minimum", "exclusiveMinimum", False),
    ("maximum", "exclusiveMaximum", True),
    ("minLength", "", False),
    ("maxLength", "", True),
]


@pytest.mark.parametrize("name", chart_value_fields())
def test_the_chart_lets_through_no_value_the_service_refuses_at_start(name: str) -> None:
    """Every bound of a chart setting is in values.schema.json, as tight or tighter: a value
    the service would refuse fails `helm install`, not the pod."""
    path = declared(name, "chart")
    assert path is not None
    chart = schema_node(json.loads((CHART / "values.schema.json").read_text()), path)
    if chart is None:  # resources.limits.memory: a Kubernetes quantity the API server checks
        return
    service = service_bounds(name)
    for inclusive, exclusive, upper in SIDES:
        bound = tightest(service, inclusive, exclusive)
        if bound is not None:
            assert within(tightest(chart, inclusive, exclusive), bound, upper), (
                f"{path}: the chart has no {inclusive or exclusive} as tight as {bound}"
            )
    if "pattern" in service:
        assert chart.get("pattern") == service["pattern"], f"{path}: pattern"
