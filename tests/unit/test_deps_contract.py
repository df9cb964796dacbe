"""The dependency-limits contract (toolq.core.deps): rates, keys and names, as tables."""

from __future__ import annotations

import pytest

from toolq.core.deps import Limits, Rate, dep_cell, is_dep_key
from toolq.core.keys import Keys


@pytest.mark.parametrize(
    ("text", "count", "per_ms", "interval"),
    [
        ("100/s", 100, 1000, 10.0),
        ("20/10s", 20, 10_000, 500.0),
        ("600/m", 600, 60_000, 100.0),
        ("1/h", 1, 3_600_000, 3_600_000.0),
        (" 5 / 250ms ", 5, 250, 50.0),
        ("0.5/s", 0.5, 1000, 2000.0),
    ],
)
def test_a_rate_parses_to_calls_per_period(
    text: str, count: float, per_ms: int, interval: float
) -> None:
    rate = Rate.parse(text)
    assert (rate.count, rate.per_ms, rate.interval_ms) == (count, per_ms, interval)


@pytest.mark.parametrize("text", ["", "100", "100/d", "0/s", "-1/s", "10/0s", "s/10", "1e3/s"])
def test_a_bad_rate_is_refused_with_the_shape_it_must_have(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        Rate.parse(text)
    with pytest.raises(ValueError, match="rate"):
        Limits(rate=text)


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("stripe", True),
        ("stripe:acct_123", True),
        ("mail@eu-1", True),
        ("a" * 128, True),
        ("a" * 129, False),
        ("", False),
        (":stripe", False),
        ("str ipe", False),
        ("stripe/x", False),
        ("{stripe}", False),
        (42, False),
    ],
)
def test_dependency_keys(key: object, ok: bool) -> None:
    assert is_dep_key(key) is ok


def test_a_keys_limiter_names_share_the_ledgers_tag() -> None:
    k = Keys("toolq")
    assert k.dep("stripe") == "{toolq}:dep:stripe"
    assert k.dep_slots("stripe") == "{toolq}:dep:stripe:slots"
    assert k.dep_waiting("stripe") == "{toolq}:dep:stripe:waiting"
    assert k.deps == "{toolq}:deps"
    assert k.dep("x").startswith(k.dep_prefix)
    assert Keys("toolq", 3).dep("stripe") == "{toolq:c003}:dep:stripe"


def test_a_keys_cell_is_the_same_forever_and_in_range() -> None:
    cells = {dep_cell(f"stripe:{i}", 16) for i in range(200)}
    assert cells <= set(range(16)) and len(cells) > 8
    assert dep_cell("stripe", 16) == dep_cell("stripe", 16)
