"""Cells (toolq.core.cells, toolq.core.keys.Keys with a cell): the hash, the tags, the slots."""

from __future__ import annotations

import hashlib

import pytest
from redis.crc import key_slot

from toolq.core.cells import (
    DEFAULT_CELLS,
    MAX_CELLS,
    cell_of,
    cells_conflict,
    check_cells,
    every_cell,
    fair_share,
    keys_of,
    lease_plan,
)
from toolq.core.keys import Keys

# Pinned: a ref's cell must never change across versions and processes. Computed
# independently with coreutils: printf '%s' REF | b2sum -l 64, as an integer mod cells.
PINNED = [
    ("op-1", 0xAC4AE24F7ED00766),
    ("call_7f3a", 0xC68C6B8E880E0352),
    ("é/ref", 0x163254D19BC9A2EF),
]


@pytest.mark.parametrize(("ref", "digest"), PINNED)
@pytest.mark.parametrize("cells", [1, 7, 256, 1000, MAX_CELLS])
def test_the_cell_of_a_ref_is_pinned(ref: str, digest: int, cells: int) -> None:
    assert cell_of(ref, cells) == digest % cells


def test_pinned_values() -> None:
    assert [cell_of(ref, DEFAULT_CELLS) for ref, _ in PINNED] == [102, 82, 239]


def test_refs_spread_evenly_over_256_cells() -> None:
    # Two shapes of refs (a counter, hex digests): both must spread. A fixed input, so
    # the statistic is fixed too: this fails for a bad hash, never by chance.
    for refs in (
        [f"call-{i}" for i in range(100_000)],
        [hashlib.sha1(str(i).encode()).hexdigest()[:16] for i in range(100_000)],
    ):
        counts = [0] * DEFAULT_CELLS
        for ref in refs:
            counts[cell_of(ref, DEFAULT_CELLS)] += 1
        expected = len(refs) / DEFAULT_CELLS
        chi2 = sum((c - expected) ** 2 / expected for c in counts)
        # 255 degrees of freedom: mean 255, sd ~22.6; 400 is p < 1e-8 for a fair hash.
        assert chi2 < 400, chi2
        assert min(counts) > 0.8 * expected
        assert max(counts) < 1.2 * expected


def test_the_prefix_alone_keeps_todays_single_tag() -> None:
    k = Keys("toolq")
    assert (k.tag, k.op("r"), k.due) == ("{toolq}", "{toolq}:op:r", "{toolq}:due")
    assert k == Keys("toolq", None)


@pytest.mark.parametrize(
    ("prefix", "cell", "tag"),
    [
        ("toolq", 0, "{toolq:c000}"),
        ("toolq", 42, "{toolq:c042}"),
        ("toolq", 255, "{toolq:c255}"),
        ("toolq", 1000, "{toolq:c1000}"),
        ("acme", 7, "{acme:c007}"),
    ],
)
def test_a_cells_keys_carry_the_prefix_and_the_cell_in_one_tag(
    prefix: str, cell: int, tag: str
) -> None:
    k = Keys(prefix, cell)
    assert k.tag == tag
    names = [k.op("r/1"), k.due, k.wake, k.sleep_until, k.stats, k.tools, k.outbox]
    names += [k.index("send", "queued"), k.op_prefix, k.index_prefix]
    assert all(n.startswith(tag + ":") for n in names)
    # One slot for all of them: a script on one cell never crosses slots.
    assert {key_slot(n.encode()) for n in names} == {key_slot(tag.encode())}


def test_cell_tags_hash_to_different_slots() -> None:
    tags = [k.tag for k in every_cell("toolq", DEFAULT_CELLS)]
    assert len(set(tags)) == DEFAULT_CELLS
    # For the default prefix no two of the 256 cells share a slot ...
    assert len({key_slot(t.encode()) for t in tags}) == DEFAULT_CELLS
    # ... and for any prefix few do (256 tags in 16384 slots: ~2 collisions expected).
    for prefix in ("acme", "prod", "staging-eu", "t"):
        slots = {key_slot(k.tag.encode()) for k in every_cell(prefix, DEFAULT_CELLS)}
        assert len(slots) >= DEFAULT_CELLS - 8, prefix


def test_two_deployments_on_one_cluster_put_a_cell_in_different_slots() -> None:
    same = [
        c
        for c in range(DEFAULT_CELLS)
        if key_slot(Keys("a", c).tag.encode()) == key_slot(Keys("b", c).tag.encode())
    ]
    assert len(same) <= 2


def test_keys_of_a_ref_are_its_cells() -> None:
    for ref, _ in PINNED:
        assert keys_of(ref, "toolq", DEFAULT_CELLS) == Keys("toolq", cell_of(ref, DEFAULT_CELLS))
    assert [k.cell for k in every_cell("toolq", 3)] == [0, 1, 2]


@pytest.mark.parametrize("bad", [0, -1, MAX_CELLS + 1, True, 2.5, "256"])
def test_a_bad_number_of_cells_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="number of cells"):
        check_cells(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="number of cells"):
        cell_of("r", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, True])
def test_a_bad_cell_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="cell"):
        Keys("toolq", bad)


@pytest.mark.parametrize(
    ("cells", "schedulers", "share"),
    [(256, 1, 256), (256, 2, 128), (256, 3, 86), (8, 3, 3), (2, 3, 1), (1, 1, 1), (8, 0, 8)],
)
def test_a_fair_share_covers_every_cell(cells: int, schedulers: int, share: int) -> None:
    assert fair_share(cells, schedulers) == share
    assert share * max(1, schedulers) >= cells


@pytest.mark.parametrize(
    ("held", "cells", "schedulers", "release", "take"),
    [
        ([], 8, 1, [], 8),  # alone: every cell
        ([0, 1, 2, 3, 4, 5, 6, 7], 8, 2, [4, 5, 6, 7], 0),  # another came: half go
        ([0, 1, 2, 3], 8, 1, [], 4),  # the other went: take its cells
        ([5, 1, 3], 8, 3, [], 0),  # at its share: nothing changes
        ([6, 2, 4], 8, 4, [6], 0),  # the highest cells go first
    ],
)
def test_a_lease_plan_moves_towards_the_share(
    held: list[int], cells: int, schedulers: int, release: list[int], take: int
) -> None:
    assert lease_plan(held, cells, schedulers) == (release, take)


@pytest.mark.parametrize(
    ("recorded", "wanted", "refused"),
    [
        (None, 8, False),
        (b"8", 8, False),
        ("8", 8, False),
        (b"256", 8, True),
        (None, None, False),  # the single tag, never moved
        (b"256", None, True),  # moved into cells: a process without TOOLQ_CELLS
    ],
)
def test_the_number_of_cells_recorded_is_the_only_one_accepted(
    recorded: str | bytes | None, wanted: int | None, refused: bool
) -> None:
    why = cells_conflict(recorded, wanted)
    assert (why is not None) == refused
    if refused:
        assert why is not None and "TOOLQ_CELLS=256" in why
