"""Ledger cells: which cell an operation's keys live in. Pure, no I/O.

Past one server (issue 18) the ledger is split into a fixed number of cells,
chosen at deployment (:data:`DEFAULT_CELLS`), far more than there will ever be
nodes: every key of a cell carries the cell's hash tag (:class:`toolq.core.keys.Keys`
with ``cell``), so a cell is one Cluster slot, and Valkey Cluster spreads the
cells over its primaries and moves them with atomic slot migration. Every
ledger script touches one cell only.

**The hash** (:func:`cell_of`) must give every process, every machine and every
toolq version the same cell for a ref, for as long as the ledger lives: a ref
whose cell changed would be looked up in the wrong cell and not be found. So it
is not Python's ``hash()`` (salted per process), and it is spelled out here to
the byte so that another language can compute it:

    cell = int.from_bytes(BLAKE2b-64(utf8(ref)), "big") % cells

(BLAKE2b with an 8-byte digest, no key, no salt, no personalization: ``b2sum
-l 64``.) It is not the CRC16 Cluster hashes slots with, so that which cell a
ref is in and which slot a cell's tag is in are unrelated; a 64-bit value
modulo a few hundred is even to well under a millionth. The unit tests pin
some values: changing them is a migration, never a refactor.
"""

from __future__ import annotations

import hashlib
import math

from toolq.core.keys import Keys

#: The cells of a deployment that does not choose: enough for 256 primaries, few
#: enough that a view reading every cell stays cheap (one pipeline per node).
DEFAULT_CELLS = 256

#: More cells than Cluster has slots would only put several cells in one slot.
MAX_CELLS = 16384


def check_cells(cells: int) -> int:
    """``cells`` if it is a valid number of cells (1 .. :data:`MAX_CELLS`); else ValueError."""
    if isinstance(cells, bool) or not isinstance(cells, int) or not 1 <= cells <= MAX_CELLS:
        raise ValueError(f"the number of cells must be a whole number 1..{MAX_CELLS}: {cells!r}")
    return cells


def cell_of(ref: str, cells: int) -> int:
    """The cell (0 .. cells - 1) of the operation ``ref``, the same forever (see above)."""
    check_cells(cells)
    digest = hashlib.blake2b(ref.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % cells


def keys_of(ref: str, prefix: str, cells: int) -> Keys:
    """The keys of the cell ``ref`` lives in."""
    return Keys(prefix, cell_of(ref, cells))


def every_cell(prefix: str, cells: int) -> list[Keys]:
    """The keys of every cell, in cell order (what a view or a scheduler walks)."""
    return [Keys(prefix, cell) for cell in range(check_cells(cells))]


def cells_conflict(recorded: str | bytes | None, wanted: int | None) -> str | None:
    """Why a process with ``wanted`` cells (None: the single tag, no ``TOOLQ_CELLS``)
    cannot serve a ledger whose meta recorded ``recorded`` (None: nothing recorded
    yet, or the same number); the text names both."""
    if recorded is None:
        return None
    text = recorded.decode() if isinstance(recorded, bytes) else recorded
    if wanted is None:
        # After `toolq cells migrate`: a process on the single tag would write
        # operations no other process reads, and read none of theirs.
        return (
            f"this ledger lives in {text} cells (toolq cells migrate), and this process "
            f"has no TOOLQ_CELLS: set TOOLQ_CELLS={text}"
        )
    if text == str(wanted):
        return None
    return (
        f"this ledger lives in {text} cells, not {wanted}: the number of cells is fixed "
        "for the ledger's life (a ref's cell depends on it); set TOOLQ_CELLS="
        f"{text}"
    )


def fair_share(cells: int, schedulers: int) -> int:
    """How many cells one of ``schedulers`` live schedulers holds at most: all of them
    between them, none holding more than one cell over another."""
    return math.ceil(check_cells(cells) / max(1, schedulers))


def lease_plan(held: list[int], cells: int, schedulers: int) -> tuple[list[int], int]:
    """What a scheduler holding ``held`` does next: the cells it gives up (its share
    shrank: another scheduler came) and how many more it may take (its share grew:
    one went, or it just started). Pure."""
    share = fair_share(cells, schedulers)
    keep = sorted(held)[:share]
    return sorted(held)[share:], share - len(keep)
