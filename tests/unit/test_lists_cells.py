"""Merging one list query's pages from every cell (cells mode): pure, as a table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolq.adapters.ledger.lists import ListQuery, decode_cursor, merge_cells
from toolq.core.states import State


def _out(rows: list[tuple[str, int]], *, more: bool = False, last: Any = None, **kw: Any) -> str:
    full = [[ref, "pay", score, "1", "3", "", "", ""] for ref, score in rows]
    return json.dumps({"rows": full, "more": more, "last": last, **kw})


@pytest.mark.parametrize(
    ("outs", "limit", "refs", "cursor"),
    [
        # every cell done: the rows in (score, ref) order, no cursor
        ([_out([("a", 1), ("c", 3)]), _out([("b", 2)])], 5, ["a", "b", "c"], None),
        # more rows than the limit: the first ones, and a cursor after the last given
        ([_out([("a", 1), ("c", 3)]), _out([("b", 2), ("d", 4)])], 3, ["a", "b", "c"], (3, "c")),
        # equal scores: the ref decides, as in one sorted set
        ([_out([("b", 1)]), _out([("a", 1)])], 5, ["a", "b"], None),
        # a cell that stopped early (budget or limit): nothing past where it stopped
        (
            [_out([("a", 1)], more=True, last=[2, "x"], budget=True), _out([("b", 2), ("c", 9)])],
            5,
            ["a", "b"],
            (2, "x"),
        ),
    ],
)
def test_pages_from_every_cell_merge_into_one_walk(
    outs: list[str], limit: int, refs: list[str], cursor: tuple[int, str] | None
) -> None:
    page = merge_cells(outs, ListQuery(State.SUCCEEDED, limit=limit))
    assert [i.operation_ref for i in page.items] == refs
    if cursor is None:
        assert page.next_cursor is None
    else:
        assert page.next_cursor is not None
        pos, newest = decode_cursor(page.next_cursor)
        assert (pos.score, pos.ref, newest) == (*cursor, False)


def test_newest_first_merges_downwards_and_stops_at_the_highest_stop() -> None:
    outs = [_out([("c", 9), ("a", 5)], more=True, last=[5, "a"]), _out([("b", 7), ("d", 1)])]
    page = merge_cells(outs, ListQuery(State.SUCCEEDED, limit=10, newest_first=True))
    assert [i.operation_ref for i in page.items] == ["c", "b", "a"]
    assert page.next_cursor is not None


def test_totals_sum_and_unknown_stays_unknown() -> None:
    q = ListQuery(State.SUCCEEDED)
    assert merge_cells([_out([], total=2), _out([], total=3)], q).total == 5
    assert merge_cells([_out([], total=2), _out([])], q).total is None
