import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooks.rules.quantity import QuantityError, parse_quantity, parse_units


@pytest.mark.parametrize(
    ("text", "units"),
    [
        ("2", 2),
        ("0", 0),
        ("1k", 1000),
        ("2000m", 2),
        ("1Ki", 1024),
        ("5e3", 5000),
        ("1E2", 100),
        ("+3", 3),
        (".5k", 500),
        ("1M", 1_000_000),
        ("3.0", 3),
    ],
)
def test_quantity_strings_with_suffixes_are_whole_units(text: str, units: int) -> None:
    assert parse_units(text) == units


@pytest.mark.parametrize(
    "text",
    [
        "",
        "NaN",
        "Infinity",
        "-1",
        "0.5",
        "1.5k" + "m",
        "abc",
        "1 k",
        "1e999999",
        "9" * 80,
        "1Ei" * 2,
        "10E",
        "1x",
    ],
)
def test_malformed_or_fractional_quantities_are_refused(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_units(text)


def test_exa_suffix_differs_from_exponent() -> None:
    assert parse_quantity("1E") == 10**18
    assert parse_quantity("1E3") == 1000


@given(st.integers(min_value=0, max_value=2**62))
def test_plain_integers_round_trip(value: int) -> None:
    assert parse_units(str(value)) == value
    assert parse_units(f"{value}000m") == value


def test_limits_and_messages_word_for_word() -> None:
    from hooks.rules.quantity import QuantityError, parse_quantity, parse_units

    assert parse_quantity("0" * 63 + "1") == 1  # 64 characters is the longest accepted
    with pytest.raises(QuantityError, match=r"^quantity too long$"):
        parse_quantity("0" * 64 + "1")
    assert parse_quantity("2Ki") == 2048
    assert parse_quantity("1e30") == 10**30  # the largest exponent accepted
    with pytest.raises(QuantityError, match=r"^exponent out of range$"):
        parse_quantity("1e31")
    with pytest.raises(QuantityError, match=r"^negative quantity$"):
        parse_units("-1")
    assert parse_units(str(2**63 - 1)) == 2**63 - 1
    with pytest.raises(QuantityError, match=r"^quantity out of range$"):
        parse_units(str(2**63))
