"""The outbox in ``toolq status`` (issue 18), shaped from what was read (pure)."""

from __future__ import annotations

import json

import pytest

from toolq.ledger.outbox import parse_status

NOW = 1_700_000_010_000
ALIVE = 15_000


def beat(at: int, lag: int) -> bytes:
    return json.dumps({"at": at, "published": 9, "lag_ms": lag}).encode()


@pytest.mark.parametrize(
    ("length", "first", "beats", "expected"),
    [
        # empty, no relay ever ran
        (0, [], {}, {"entries": 0, "oldest_age_ms": None, "relays": 0, "lag_ms": None}),
        # an entry 4 s old, one live relay and one dead: the live one's lag only
        (
            3,
            [(b"1700000006000-0", {})],
            {b"r1": beat(NOW - 1_000, 12), b"r2": beat(NOW - ALIVE - 1, 9_999)},
            {"entries": 3, "oldest_age_ms": 4_000, "relays": 1, "lag_ms": 12},
        ),
        # the largest lag of the live relays; a beat that is not JSON is passed over
        (
            1,
            [(b"1700000010000-3", {})],
            {b"a": beat(NOW, 5), b"b": beat(NOW, 40), b"c": b"garbage"},
            {"entries": 1, "oldest_age_ms": 0, "relays": 2, "lag_ms": 40},
        ),
    ],
)
def test_outbox_status(
    length: int, first: list[object], beats: dict[bytes, bytes], expected: dict[str, object]
) -> None:
    assert parse_status(length, first, beats, NOW, ALIVE) == expected
