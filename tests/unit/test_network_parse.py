"""tc rate spelling: parse_rate and format_rate (pure functions, no subprocess)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from injectors.network import _RATE_UNITS, format_rate, parse_rate


@pytest.mark.parametrize(("text", "bits"), [
    ("100mbit", 100_000_000),
    ("100", 100),
    ("100bit", 100),
    ("1kbit", 1000),
    ("1kibit", 1024),
    ("1Kibit", 1024),
    ("2gbit", 2_000_000_000),
    ("1gibit", 1024**3),
    ("1tbit", 10**12),
    ("1bps", 8),
    ("1kbps", 8000),  # tc: kbps is kiloBYTES per second
    ("1KBps", 8000),
    ("12.5MBps", 100_000_000),
    ("1mibps", 8 * 1024**2),
    ("1.5mbit", 1_500_000),
    (".5kbit", 500),
    ("1e6", 1_000_000),
    ("1E2MBIT", 100_000_000),
    (" 10mbit ", 10_000_000),
])
def test_parse_rate_follows_tc(text: str, bits: int) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", [
    "", "mbit", "abc", "100 mbit", "100mbits", "100mb", "-5mbit", "0bit", "0", "0.1bit", "1.5.3mbit",
    "nan", "inf", "0x10", "1e", "1e400mbit", "10 0",
])
def test_parse_rate_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_parse_rate_rejects_non_strings() -> None:
    with pytest.raises(ValueError):
        parse_rate(100)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_format_rate_rejects_non_positive_ints(bad: object) -> None:
    with pytest.raises(ValueError):
        format_rate(bad)  # type: ignore[arg-type]


def test_format_rate_uses_the_largest_exact_unit() -> None:
    assert format_rate(100_000_000) == "100mbit"
    assert format_rate(1_500_000) == "1500kbit"
    assert format_rate(1001) == "1001bit"
    assert format_rate(3 * 10**12) == "3tbit"


@given(st.integers(min_value=1, max_value=10**15))
def test_format_then_parse_round_trips(bits: int) -> None:
    assert parse_rate(format_rate(bits)) == bits


@given(st.integers(min_value=1, max_value=10**6),
       st.sampled_from(sorted(u for u, s in _RATE_UNITS.items() if s == int(s))),
       st.booleans())
def test_every_unit_scales_an_integer(n: int, unit: str, upper: bool) -> None:
    spelled = f"{n}{unit.upper() if upper else unit}"
    assert parse_rate(spelled) == n * int(_RATE_UNITS[unit])
