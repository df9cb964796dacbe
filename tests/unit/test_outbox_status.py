"""The outbox in ``toolq status`` (issue 18), shaped from what was read (pure)."""

from __future__ import annotations

import json

import pytest

from toolq.adapters.ledger.outbox import parse_status

NOW = 1_700_000_010_000
ALIVE = 15_000


def beat(at: int, lag: int, waiting: object = None) -> bytes:
    b: dict[str, object] = {"at": at, "published": 9, "lag_ms": lag}
    if waiting is not None:
        b["waiting"] = waiting
    return json.dumps(b).encode()


@pytest.mark.parametrize(
    ("length", "first", "beats", "expected"),
    [
        # empty, no relay ever ran
        (
            0,
            [],
            {},
            {"entries": 0, "oldest_age_ms": None, "relays": 0, "lag_ms": None, "waiting": []},
        ),
        # an entry 4 s old, one live relay and one dead: the live one's lag only
        (
            3,
            [(b"1700000006000-0", {})],
            {b"r1": beat(NOW - 1_000, 12), b"r2": beat(NOW - ALIVE - 1, 9_999)},
            {"entries": 3, "oldest_age_ms": 4_000, "relays": 1, "lag_ms": 12, "waiting": []},
        ),
        # the largest lag of the live relays; a beat that is not JSON is passed over
        (
            1,
            [(b"1700000010000-3", {})],
            {b"a": beat(NOW, 5), b"b": beat(NOW, 40), b"c": b"garbage"},
            {"entries": 1, "oldest_age_ms": 0, "relays": 2, "lag_ms": 40, "waiting": []},
        ),
        # a live relay waiting for the broker says since when; a dead one's wait and a
        # malformed one are passed over
        (
            2,
            [(b"1700000010000-3", {})],
            {
                b"a": beat(NOW, 0, {"for": "broker", "since": NOW - 40_000}),
                b"b": beat(NOW - ALIVE - 1, 0, {"for": "broker", "since": 1}),
                b"c": beat(NOW, 0, {"since": 3}),
            },
            {
                "entries": 2,
                "oldest_age_ms": 0,
                "relays": 2,
                "lag_ms": 0,
                "waiting": [{"id": "a", "for": "broker", "since": NOW - 40_000}],
            },
        ),
    ],
)
def test_outbox_status(
    length: int, first: list[object], beats: dict[bytes, bytes], expected: dict[str, object]
) -> None:
    assert parse_status(length, first, beats, NOW, ALIVE) == expected
