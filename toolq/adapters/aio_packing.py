"""``redis.asyncio``'s commands packed by hiredis, as the sync client's are.

redis-py's sync connections pack a command with hiredis, in C, when it is installed
(``redis.connection.HiredisRespSerializer``; toolq requires hiredis); its asyncio
connections always pack in Python (``AbstractConnection.pack_command``: an encode and
a bytes join per argument). A ledger script call carries some 25 arguments: on the
asyncio pool's loop, the packing of 4,000 of them (a claim and a record for each of
2,000 calls) was a fifth of the loop's CPU (cProfile; bench/RESULTS.md, the asyncio
pool), time the loop's other calls waited for.

:func:`hiredis_packed` gives an asyncio pool's connections the sync client's packing:
the same steps (a command name with a space split into its words, a bytearray as
bytes, hiredis's ``TypeError`` for an argument it cannot send raised as
redis-py's ``DataError``), so a script call goes out as the sync ledger sends it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.exceptions import DataError


def packed(*args: Any) -> list[bytes]:
    """One command in the server's protocol (``HiredisRespSerializer.pack``)."""
    first = args[0]
    if isinstance(first, str):
        args = (*first.encode().split(), *args[1:])
    elif b" " in first:
        args = (*first.split(), *args[1:])
    wire: Any = args
    try:
        return [hiredis.pack_command(wire)]
    except TypeError:  # a bytearray, which hiredis does not take (checked only then)
        wire = tuple(bytes(a) if isinstance(a, bytearray) else a for a in args)
    try:
        return [hiredis.pack_command(wire)]
    except TypeError as exc:
        raise DataError(str(exc)) from exc


class HiredisPacking:
    """Mixed into an asyncio connection class: :func:`packed` packs its commands (its
    pipelines' too: ``pack_commands`` packs each command with this); and a connection
    the server closed while it sat in the pool is opened again before a command goes
    out on it, as the sync pool does when it hands one out (redis.asyncio's pool asks
    ``can_read``, which does not see the close): after a restart of the server, the
    first command on each pooled connection failed with "Connection closed by server",
    and a ``tq.aio`` call answered ``QUEUE_UNAVAILABLE`` with the server up again.
    Nothing was sent on the closed connection, so nothing is sent twice."""

    _reader: asyncio.StreamReader | None

    def pack_command(self, *args: Any) -> list[bytes]:
        return packed(*args)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        reader = self._reader
        if reader is not None and reader.at_eof():
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
        await super().send_packed_command(command, check_health)  # type: ignore[misc]


def hiredis_packed(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """``pool``, making its connections (the class its URL chose: TCP, TLS, a Unix
    socket) with :class:`HiredisPacking` mixed in; before its first connection. A pool
    making them by a function (fakeredis's) is left as it is."""
    cls = pool.connection_class
    if isinstance(cls, type) and not issubclass(cls, HiredisPacking):
        pool.connection_class = type(f"Hiredis{cls.__name__}", (HiredisPacking, cls), {})
    return pool
