"""Which keys a ledger call names: the layout (:mod:`toolq.core.layout`) maps a ref to its
cell's keys, and :class:`Routes` keeps the :class:`~toolq.adapters.ledger.wire.ScriptArgs` of each.
Shared by the sync and the async ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolq.adapters.ledger.wire import InlinePush, OutboxPush, Push, ScriptArgs
from toolq.core import errors
from toolq.core.keys import Keys
from toolq.core.layout import Layout, layout_of
from toolq.decisions.formats import FORMAT_FIELD


@dataclass(frozen=True)
class Pinned(Layout):
    """Every ref on one cell's keys: a ledger built for one cell (``cell``), or a
    single-tag ledger's :meth:`toolq.adapters.ledger.store.Ledger.in_cell` (a tool working on
    one cell)."""

    home: Keys

    @property
    def prefix(self) -> str:  # type: ignore[override]
        return self.home.prefix

    @property
    def cells(self) -> None:
        return None

    def keys_of(self, ref: str) -> Keys:
        return self.home

    def every_cell(self) -> list[Keys]:
        return [self.home]


def strategies(
    prefix: str, outbox: bool, cell: int | None, cells: int | None
) -> tuple[Layout, Push]:
    """The layout and push that a ledger built from flags has (tests, tools); a
    process's ledger gets them from its topology (:mod:`toolq.topology.ledger`)."""
    layout = layout_of(prefix, cells) if cell is None else Pinned(Keys(prefix, cell))
    return layout, OutboxPush() if outbox else InlinePush()


class Routes:
    """The calls of a ledger by ref and by cell; its own :attr:`keys` (``home``) are
    the deployment-wide ones (schedulers, workers, meta: no cell), or one cell's."""

    layout: Layout
    calls: ScriptArgs
    keys: Keys

    def route_by(
        self,
        prefix: str,
        cell: int | None,
        layout: Layout | None,
        push: Push | None,
        *,
        outbox: bool,
        cells: int | None,
    ) -> None:
        """Route by the topology's ``layout`` and ``push`` (a process's ledger), else
        by the flags (:func:`strategies`); the home keys are ``cell``'s (None: none)."""
        flagged = strategies(prefix, outbox, cell, cells)
        self.route(layout or flagged[0], push or flagged[1], Keys(prefix, cell))

    def route(self, layout: Layout, push: Push, home: Keys) -> None:
        self.layout = layout
        self._push = push
        self._calls: dict[Keys, ScriptArgs] = {}
        self.calls = self.calls_at(home)
        self.keys = self.calls.keys

    @property
    def cells(self) -> int | None:
        """The number of cells (None: the single tag), as :attr:`layout` says."""
        return self.layout.cells

    def calls_at(self, keys: Keys) -> ScriptArgs:
        """The calls on ``keys`` (made once, shared by every copy of the ledger)."""
        found = self._calls.get(keys)
        if found is None:
            found = self._calls[keys] = ScriptArgs(keys, self._push)
        return found

    def calls_of(self, ref: str) -> ScriptArgs:
        """The calls on ``ref``'s keys (its cell's in cells mode)."""
        return self.calls_at(self.layout.keys_of(ref))

    def keys_of(self, ref: str) -> Keys:
        """The keys of ``ref``'s cell (this ledger's own without cells)."""
        return self.calls_of(ref).keys

    def ask_cells(self, pipe: Any) -> None:
        """Pipeline what :meth:`cells_refused` reads: the number of cells recorded in the
        meta, recorded first at first use in cells mode (a single tag records none),
        and the ledger's format (:mod:`toolq.adapters.ledger.stored_format`)."""
        meta = Keys(self.keys.prefix).meta
        if self.layout.cells is not None:
            pipe.hsetnx(meta, "cells", self.layout.cells)
        pipe.hmget(meta, ["cells", FORMAT_FIELD])

    def cells_refused(self, answers: list[Any]) -> Any:
        """errors.RequestRefused for a ledger recorded with another layout; else the
        format the meta records (raw, None for none), which the caller checks."""
        cells, recorded = answers[-1]
        why = self.layout.conflict(cells)
        if why is not None:
            raise errors.RequestRefused(why)
        return recorded
