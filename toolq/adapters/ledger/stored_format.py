"""The ledger's stored format in Redis: the check every process makes once.

It follows the read of the meta every process makes when it starts
(:meth:`toolq.adapters.ledger.routes.Routes.ask_cells`): a ledger that records today's
format costs nothing more. One that records none is looked at once (two ``SCAN``\\ s for
the keys of earlier formats, :func:`toolq.decisions.formats.unversioned_format`) and
stamped with today's format (``HSETNX``) if it holds none; any other format is refused
(errors.LedgerFormat). ``toolq migrate`` is :mod:`toolq.adapters.ledger.upgrade`.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis

from toolq.core import errors
from toolq.core.keys import Keys
from toolq.core.text import as_text
from toolq.decisions import formats
from toolq.decisions.formats import FORMAT, FORMAT_FIELD

#: Keys asked for per SCAN round trip.
CHUNK = 1000


def glob(text: str) -> str:
    """``text`` as a literal SCAN pattern (a prefix may hold ``[`` or ``*``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def v1_pattern(prefix: str) -> str:
    return glob(prefix + ":") + "*"


def hist_pattern(prefix: str) -> str:
    return glob(Keys(prefix).tag + ":hist:") + "*"


def detect(client: redis.Redis, prefix: str) -> int:
    """The format of ``prefix``'s ledger from its keys (what an unversioned ledger is)."""
    v1 = any(
        formats.is_v1_key(prefix, as_text(k))
        for k in client.scan_iter(match=v1_pattern(prefix), count=CHUNK)
    )
    hist = not v1 and next(iter(client.scan_iter(match=hist_pattern(prefix), count=CHUNK)), None)
    return formats.unversioned_format(v1, bool(hist))


async def adetect(client: aioredis.Redis, prefix: str) -> int:
    """:func:`detect` on an asyncio client."""
    v1 = False
    async for k in client.scan_iter(match=v1_pattern(prefix), count=CHUNK):
        if formats.is_v1_key(prefix, as_text(k)):
            v1 = True
            break
    hist = False
    if not v1:
        async for _k in client.scan_iter(match=hist_pattern(prefix), count=CHUNK):
            hist = True
            break
    return formats.unversioned_format(v1, hist)


def refuse(prefix: str, found: int) -> None:
    why = formats.refusal(prefix, found)
    if why is not None:
        raise errors.LedgerFormat(why, found=found, expected=FORMAT)


def recorded(prefix: str, raw: Any) -> int | None:
    try:
        return formats.recorded_format(raw)
    except formats.FormatError as exc:
        raise errors.LedgerFormat(f"ledger {prefix!r}: {exc}") from None


def format_checked(client: redis.Redis, prefix: str, raw: Any) -> None:
    """Refuse (errors.LedgerFormat) a ledger whose meta records ``raw`` as its format
    unless it is today's; stamp an unversioned one that holds no earlier format's keys."""
    found = recorded(prefix, raw)
    if found is None:
        refuse(prefix, detect(client, prefix))
        if client.hsetnx(Keys(prefix).meta, FORMAT_FIELD, FORMAT):
            return
        found = recorded(prefix, client.hget(Keys(prefix).meta, FORMAT_FIELD))
    if found is not None:
        refuse(prefix, found)


async def aformat_checked(client: aioredis.Redis, prefix: str, raw: Any) -> None:
    """:func:`format_checked` on an asyncio client."""
    found = recorded(prefix, raw)
    if found is None:
        refuse(prefix, await adetect(client, prefix))
        if await client.hsetnx(Keys(prefix).meta, FORMAT_FIELD, FORMAT):
            return
        found = recorded(prefix, await client.hget(Keys(prefix).meta, FORMAT_FIELD))
    if found is not None:
        refuse(prefix, found)
