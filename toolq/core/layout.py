"""Where an operation's keys live: the ledger's layout. Pure, no I/O.

One class per layout, one contract (:class:`Layout`), chosen once by the topology
(:func:`toolq.topology.topology_for`); the rest of the code asks the layout
instead of testing ``cells is None``:

==============  ==================  =====================  ==============
layout          ``keys_of(ref)``    ``every_cell()``       ``cells``
==============  ==================  =====================  ==============
SingleTag(p)    ``Keys(p)``         ``[Keys(p)]``          None
Cells(p, n)     its cell's keys     ``Keys(p, 0..n-1)``    n
==============  ==================  =====================  ==============

``cells`` is what the ledger's meta records (:func:`toolq.core.cells.cells_conflict`).
Which cell a ref is in is :func:`toolq.core.cells.cell_of`, the same forever.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from toolq.core.cells import cell_of, cells_conflict, check_cells, every_cell
from toolq.core.keys import Keys


class Layout(ABC):
    """Where the keys of a deployment (``prefix``) live."""

    prefix: str

    #: A process checks the cells its ledger's meta recorded (:meth:`conflict`) when it
    #: builds its ledger: every call it makes names a cell the meta must agree with. The
    #: single tag checks at the first submit instead (no round trip for a reader).
    check_meta_first: bool = False

    @property
    @abstractmethod
    def cells(self) -> int | None:
        """The number of cells (what the ledger's meta records); None: the single tag."""

    @abstractmethod
    def keys_of(self, ref: str) -> Keys:
        """The keys of the cell the operation ``ref`` lives in."""

    @abstractmethod
    def every_cell(self) -> list[Keys]:
        """The keys of every cell, in cell order (what a view, a scheduler, a relay walks)."""

    @property
    def root(self) -> Keys:
        """The deployment-wide keys, in no cell: meta, schedulers, workers, relays."""
        return Keys(self.prefix)

    def channels(self, steps: bool = False) -> list[str]:
        """The channels the scripts announce settled states on (``steps``: the other
        states and progress), one per cell."""
        return [k.notify_steps if steps else k.notify for k in self.every_cell()]

    def outbox_streams(self) -> list[str]:
        """The outbox stream of every cell (outbox mode: what relays read)."""
        return [k.outbox for k in self.every_cell()]

    def group(self, refs: Sequence[str]) -> dict[Keys, list[int]]:
        """The positions of ``refs`` by the keys of their cell, in order of first
        appearance (one script touches one cell: a call on several is one per cell)."""
        groups: dict[Keys, list[int]] = {}
        for i, ref in enumerate(refs):
            groups.setdefault(self.keys_of(ref), []).append(i)
        return groups

    def conflict(self, recorded: str | bytes | None) -> str | None:
        """Why this layout cannot serve a ledger whose meta recorded ``recorded`` cells
        (None: it can)."""
        return cells_conflict(recorded, self.cells)


@dataclass(frozen=True)
class SingleTag(Layout):
    """One hash tag for the whole ledger: one slot, one server."""

    prefix: str = "toolq"

    @property
    def cells(self) -> None:
        return None

    def keys_of(self, ref: str) -> Keys:
        return self.root

    def every_cell(self) -> list[Keys]:
        return [self.root]


@dataclass(frozen=True)
class Cells(Layout):
    """The ledger split into ``n`` cells, each under its own tag (:mod:`toolq.core.cells`)."""

    prefix: str = "toolq"
    n: int = 256
    check_meta_first = True

    def __post_init__(self) -> None:
        check_cells(self.n)

    @property
    def cells(self) -> int:
        return self.n

    def keys_of(self, ref: str) -> Keys:
        return Keys(self.prefix, cell_of(ref, self.n))

    def every_cell(self) -> list[Keys]:
        return every_cell(self.prefix, self.n)


def layout_of(prefix: str, cells: int | None) -> Layout:
    """The layout of a ledger recorded with ``cells`` (None: the single tag): what a
    tool reading a ledger's meta, or a test, builds; a process asks its topology."""
    return SingleTag(prefix) if cells is None else Cells(prefix, cells)
