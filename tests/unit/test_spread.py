"""Spreading cells over a Cluster's primaries (toolq/adapters/ledger/spread.py): the pure
decisions."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolq.adapters.ledger.spread import (
    SLOTS,
    Move,
    batches,
    cell_slots,
    gaps,
    joiners,
    parse_nodes,
    plan,
    ranges,
)

NODES = """\
aaa 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 6000
bbb 127.0.0.1:7002@17002 master - 0 1 2 connected 5461-5999 6001-10922 [10923->-ccc]
ccc 127.0.0.1:7003@17003 master - 0 1 3 connected 10923-16383
ddd 127.0.0.1:7004@17004 master - 0 1 4 connected
eee 127.0.0.1:7005@17005 slave aaa 0 1 1 connected
fff 127.0.0.1:7006@17006 master,fail - 0 1 5 disconnected
"""


def test_parse_nodes_reads_the_live_primaries_and_their_slots() -> None:
    found = {p.id: p for p in parse_nodes(NODES, "10.0.0.1")}
    assert sorted(found) == ["aaa", "bbb", "ccc", "ddd"]  # no replica, no failed node
    assert found["aaa"].myself and not found["bbb"].myself
    assert found["aaa"].slots == frozenset(range(5461)) | {6000}
    assert 10923 not in found["bbb"].slots  # in transit: still the source's
    assert found["ddd"].slots == frozenset() and found["ddd"].address == "127.0.0.1:7004"


def test_a_node_that_never_met_another_is_on_the_host_asked() -> None:
    (alone,) = parse_nodes("abc :36873@46873 myself,master - 0 0 0 connected 2294 3607\n", "h")
    assert alone.address == "h:36873" and alone.slots == {2294, 3607}


@pytest.mark.parametrize(
    ("served", "want"),
    [
        ([], [(0, SLOTS - 1)]),
        (range(SLOTS), []),
        ([0, 5, 6, SLOTS - 1], [(1, 4), (7, SLOTS - 2)]),
        ([3607], [(0, 3606), (3608, SLOTS - 1)]),
    ],
)
def test_gaps_are_the_ranges_no_node_serves(served: list[int], want: list[tuple[int, int]]) -> None:
    assert gaps(served) == want


def test_ranges_join_neighbours() -> None:
    assert ranges([7, 1, 2, 3, 9, 8, 5]) == [(1, 3), (5, 5), (7, 9)]


# weights (cells per slot), owners (slot -> primary), primaries -> cells after, moves
PLANS = [
    # one server's cells, two empty primaries joined: a third each, a third moved each
    ({s: 1 for s in range(6)}, dict.fromkeys(range(6), "a"), "abc", {"a": 2, "b": 2, "c": 2}, 4),
    # uneven ranges: the busiest gives one to the idlest, no more
    (
        {1: 1, 2: 1, 3: 1, 4: 1},
        {1: "a", 2: "a", 3: "a", 4: "b"},
        "abc",
        {"a": 2, "b": 1, "c": 1},
        1,
    ),
    # balanced already (floor/ceil): nothing moves
    ({1: 1, 2: 1, 3: 1, 4: 1, 5: 1}, {1: "a", 2: "a", 3: "b", 4: "b", 5: "c"}, "abc", None, 0),
    # two cells in one slot: it goes whole; 3 / 2 is as even as it gets
    ({1: 2, 2: 1, 3: 1, 4: 1}, dict.fromkeys([1, 2, 3, 4], "a"), "ab", {"a": 3, "b": 2}, None),
    # one primary: nowhere to go
    ({1: 1, 2: 1}, {1: "a", 2: "a"}, "a", None, 0),
    # a slot of many cells against many of one: the big one moves alone
    ({1: 4, 2: 1, 3: 1, 4: 1, 5: 1}, dict.fromkeys(range(1, 6), "a"), "ab", {"a": 4, "b": 4}, 1),
]


@pytest.mark.parametrize(("weights", "owners", "names", "after", "moves"), PLANS)
def test_plan_spreads_cells_evenly_moving_few_slots(
    weights: dict[int, int],
    owners: dict[int, str],
    names: str,
    after: dict[str, int] | None,
    moves: int | None,
) -> None:
    made = plan(weights, owners, list(names))
    assert made.cells == sum(weights.values())
    assert made.after == (after or made.before)
    if moves is not None:
        assert len(made.moves) == moves
    # the moves take the "before" to the "after"
    loads = dict(made.before)
    for m in made.moves:
        assert owners[m.slot] == m.source != m.target and m.cells == weights[m.slot]
        loads[m.source] -= m.cells
        loads[m.target] += m.cells
    assert loads == made.after


def test_slots_without_cells_stay_and_an_unserved_cell_slot_is_an_error() -> None:
    made = plan({1: 1, 2: 0}, {1: "a", 2: "a", 3: "a"}, ["a", "b"])
    assert made.moves == [] and made.after == {"a": 1, "b": 0}
    with pytest.raises(ValueError, match="slot 9 holds cells"):
        plan({9: 1}, {}, ["a"])


def test_256_cells_from_one_server_to_three_primaries() -> None:
    weights = cell_slots("toolq", 256)
    assert len(weights) == 256  # one slot each (keys.py: prefix inside the braces)
    made = plan(weights, dict.fromkeys(weights, "a"), ["a", "b", "c"])
    assert sorted(made.after.values()) == [85, 85, 86] and len(made.moves) == 170


@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=5).flatmap(
        lambda nodes: st.tuples(st.just(len(nodes)), st.lists(st.sampled_from(range(len(nodes)))))
    )
)
def test_with_one_cell_a_slot_every_primary_ends_at_floor_or_ceil_in_the_fewest_moves(
    case: tuple[int, list[int]],
) -> None:
    n, owners_of = case
    names = [f"n{i}" for i in range(n)]
    owners = {slot: names[i] for slot, i in enumerate(owners_of)}
    made = plan(dict.fromkeys(owners, 1), owners, names)
    q, r = divmod(len(owners), n)
    assert sorted(made.after.values()) == [q] * (n - r) + [q + 1] * r
    # fewest: the busiest r keep q + 1, the others q; every cell above that moves once
    targets = [q + 1] * r + [q] * (n - r)
    loads = sorted(made.before.values(), reverse=True)
    assert len(made.moves) == sum(max(0, x - t) for x, t in zip(loads, targets, strict=True))


def test_batches_group_by_pair_and_size() -> None:
    moves = [Move(s, 1, "a", "b") for s in range(5)] + [Move(9, 1, "a", "c")]
    got = batches(moves, size=2)
    assert [[m.slot for m in b] for b in got] == [[0, 1], [2, 3], [4], [9]]


def _resolve(host: str) -> str:
    """A resolver: two names of one node, and a name no resolver knows."""
    if host == "nowhere":
        raise socket.gaierror("Name or service not known")
    return {"localhost": "127.0.0.1", "node-b": "10.0.0.2"}.get(host, host)


@pytest.mark.parametrize(
    ("joining", "want"),
    [
        # CLUSTER NODES shows the IP MEET resolved: a name met by an interrupted run is in
        (["localhost:7001", "localhost:7002"], ["localhost:7002"]),
        (["127.0.0.1:7001", "node-b:7003"], []),
        # another port of the same host is another node
        (["node-b:7004"], ["node-b:7004"]),
        # a name that does not resolve is kept (adopt then finds it does not answer)
        (["nowhere:7001"], ["nowhere:7001"]),
    ],
)
def test_a_node_met_already_is_not_joined_again_whatever_its_name(
    joining: list[str], want: list[str]
) -> None:
    known = ["127.0.0.1:7001", "10.0.0.2:7003"]
    assert joiners(joining, known, resolve=_resolve) == want
