import json

import msgspec
import pytest

from hooks.wire.gpuclass import DEFAULT_TOKEN_KEY, InvalidSpecError, parse_spec


def spec(body: str):  # type: ignore[no-untyped-def]
    return parse_spec(msgspec.Raw(body.encode()))


def test_valid_spec_with_defaults() -> None:
    parsed = spec('{"resourceName": "nvidia.com/X", "license": {"secretRef": {"name": "tok"}}}')
    assert parsed.resource_name == "nvidia.com/X"
    assert parsed.license is not None
    assert parsed.license.feature_type == 1
    assert parsed.license.secret_ref.key == DEFAULT_TOKEN_KEY
    assert parsed.license.secret_ref.namespace is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{}", "spec"),
        ('{"resourceName": 5}', "spec.resourceName"),
        ('{"resourceName": "gpu"}', "spec.resourceName"),
        ('{"resourceName": "kubernetes.io/gpu"}', "spec.resourceName"),
        ('{"resourceName": "x.kubernetes.io/gpu"}', "spec.resourceName"),
        ('{"resourceName": "requests.nvidia.com/gpu"}', "spec.resourceName"),
        (
            '{"resourceName": "nvidia.com/X", "tolerations": [{"operator": "Equal"}]}',
            "spec.tolerations[0]",
        ),
        ('{"resourceName": "nvidia.com/X", "license": {}}', "spec.license.secretRef"),
        (
            '{"resourceName": "nvidia.com/X", '
            '"license": {"secretRef": {"name": "a"}, "featureType": 0}}',
            "spec.license.featureType",
        ),
        (
            '{"resourceName": "nvidia.com/X", '
            '"license": {"secretRef": {"name": "a", "namespace": "Bad_NS"}}}',
            "spec.license.secretRef.namespace",
        ),
        ("[]", "spec"),
        ("null", "spec"),
    ],
)
def test_invalid_spec_message_names_the_field(body: str, field: str) -> None:
    with pytest.raises(InvalidSpecError) as error:
        spec(body)
    assert str(error.value).startswith(field + ":")


DOMAIN_253 = ".".join(["a" * 63] * 4)[:253]


@pytest.mark.parametrize(
    ("resource", "problem"),
    [
        ("gpu", "must look like <domain>/<name>"),
        ("/gpu", "must look like <domain>/<name>"),
        ("nvidia.com/", "must look like <domain>/<name>"),
        ("Nvidia.com/gpu", "domain must be a DNS subdomain"),
        (DOMAIN_253 + "x/gpu", "domain must be a DNS subdomain"),
        ("node.kubernetes.io/gpu", "must not be in the kubernetes.io domain"),
        (
            "nvidia.com/a/b",
            "name after the domain must be a qualified name of at most 63 characters",
        ),
        (
            "nvidia.com/" + "g" * 64,
            "name after the domain must be a qualified name of at most 63 characters",
        ),
        ("requests.nvidia.com/gpu", "must not start with requests."),
    ],
)
def test_each_refused_resource_name_is_refused_in_its_own_words(
    resource: str, problem: str
) -> None:
    with pytest.raises(InvalidSpecError) as error:
        spec(json.dumps({"resourceName": resource}))
    assert str(error.value) == f"spec.resourceName: {problem}"


@pytest.mark.parametrize("resource", [DOMAIN_253 + "/gpu", "nvidia.com/" + "g" * 63])
def test_a_resource_name_at_each_length_bound_is_accepted(resource: str) -> None:
    assert spec(json.dumps({"resourceName": resource})).resource_name == resource
