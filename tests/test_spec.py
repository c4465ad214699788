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
        ("{}", "spec.resourceName"),
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
