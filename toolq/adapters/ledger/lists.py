"""Lists of operations in a state, read page by page from the state indexes.

Every operation is in one sorted set per tool and state
(:meth:`toolq.core.keys.Keys.index`), scored by when it entered that state. A page
is a walk of those sets in score order (oldest first, or newest first),
merged across tools, starting after a cursor:

- **Cursor.** The (score, ref) of the last entry a page examined; a sorted
  set orders equal scores by member, so (score, ref) is a total order and the
  next page starts exactly after it, whatever entered or left the list
  meanwhile. Each set is read with ``ZRANGE BYSCORE ... LIMIT`` from the
  cursor's score: the cost is O(log N + page), never an offset into the set.
- **Filters.** ``older_than`` is a bound on the score: the index serves it,
  and the total stays exact (``ZCOUNT``). ``ref_contains`` and ``code`` are
  not in the index: a filtered page examines at most :data:`SCAN_BUDGET`
  entries (``code`` reads their records, at most :data:`CODE_BUDGET`), then
  returns what matched with ``partial`` set and a cursor where it stopped,
  so that no page costs more than a bounded read however rare the matches are.
- **Search.** ``state`` None walks every state's index of every tool at once,
  merged by score (when each entered its state). The search (``search``, the
  API's ``q``) keeps a ref that contains it, or every entry of a tool whose name
  contains it (that tool's indexes match whole). Entries are filtered on their
  member as they are read; a record is read only for a row the page takes.
- **Pages.** A page looks for ``limit + 1`` rows and returns ``limit``: the one
  more is what says there is a next page, so the last page offers none.
  ``prev_cursor`` walks back from a page's first row (the same walk, reversed).

The checks, the cursor and which filters the index serves are pure
(:func:`parse_query`, :func:`encode_cursor`), tested as tables. The walk
itself runs in the server, one read-only script per page (:data:`LIST`):
:func:`read_page` and :func:`aread_page` send it on a sync or an async client.
"""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from toolq.adapters.ledger.list_page import (
    LIST,
    empty_page,
    index_args,
    list_keys,
    merge_cells,
    page_of,
    tools_of,
)
from toolq.adapters.ledger.list_query import (
    DEFAULT_LIMIT,
    MAX_AGE_S,
    MAX_LIMIT,
    TOOL_RE,
    ListQuery,
    Position,
    decode_cursor,
    encode_cursor,
    parse_query,
    read_cursor,
)
from toolq.core.keys import Keys
from toolq.core.record import OperationPage

__all__ = [
    "CHUNK",
    "CODE_BUDGET",
    "DEFAULT_LIMIT",
    "LIST",
    "MAX_AGE_S",
    "MAX_LIMIT",
    "SCAN_BUDGET",
    "TOOL_RE",
    "ListQuery",
    "Position",
    "aread_page",
    "aread_page_cells",
    "decode_cursor",
    "encode_cursor",
    "merge_cells",
    "page_of",
    "parse_query",
    "read_cursor",
    "read_page",
    "read_page_cells",
]

#: Index entries a filtered page examines at most (``ref_contains`` and the search
#: read members only). A search of 10,000 operations in every state is one page:
#: 23 ms (60 ms with the machine's two cores busy) for a ref part that matched 2 of
#: them (tests/integration/test_search.py); a page that finds nothing in 10^6 costs
#: ~100-150 ms at this budget on that busy machine (bench/lists_bench.py at 20,000:
#: 224 ms; it was 5,000 before the search, which then took two pages for 10,000).
SCAN_BUDGET = 12_000
#: Records a ``code`` filter reads at most per page (their envelopes are parsed).
CODE_BUDGET = 1_000
#: Entries read from one index per round trip while filtering.
CHUNK = 1_000


def _args(q: ListQuery, tools: list[str]) -> list[str | int]:
    after = q.after
    return [
        int(q.walk_newest),
        "" if after is None else after.score,
        "" if after is None else after.ref,
        "" if q.max_score is None else q.max_score,
        q.limit,
        SCAN_BUDGET,
        CODE_BUDGET if q.code is not None else SCAN_BUDGET,
        CHUNK if q.filtered else q.limit + 2,
        q.ref_contains or "",
        q.code or "",
        int(not q.filtered),
        q.search or "",
        *index_args(tools, q),
    ]


# --------------------------------------------------------------------------- sending it


def read_page(client: redis.Redis, q: ListQuery, keys: Keys) -> OperationPage:
    """One page on a sync client: the tools (unless ``q.tool``), then the script."""
    tools = tools_of(q, () if q.tool is not None else client.smembers(keys.tools))
    if not tools:
        return empty_page(q)
    script = client.register_script(LIST)
    return page_of(script(keys=list_keys(keys, tools, q), args=_args(q, tools)), q)


def read_page_cells(client: redis.Redis, q: ListQuery, cells: list[Keys]) -> OperationPage:
    """Cells mode: the page read in every cell (one script call each) and merged."""
    if q.tool is None:
        pipe = client.pipeline(transaction=False)
        for keys in cells:
            pipe.smembers(keys.tools)
        tools = tools_of(q, {t for members in pipe.execute() for t in members})
    else:
        tools = [q.tool]
    if not tools:
        return empty_page(q)
    script = client.register_script(LIST)
    return merge_cells(
        [script(keys=list_keys(keys, tools, q), args=_args(q, tools)) for keys in cells], q
    )


async def aread_page_cells(
    client: aioredis.Redis, q: ListQuery, cells: list[Keys]
) -> OperationPage:
    """:func:`read_page_cells` on ``redis.asyncio``."""
    if q.tool is None:
        pipe = client.pipeline(transaction=False)
        for keys in cells:
            pipe.smembers(keys.tools)
        tools = tools_of(q, {t for members in await pipe.execute() for t in members})
    else:
        tools = [q.tool]
    if not tools:
        return empty_page(q)
    script = client.register_script(LIST)
    raws = [await script(keys=list_keys(keys, tools, q), args=_args(q, tools)) for keys in cells]
    return merge_cells(raws, q)


async def aread_page(client: aioredis.Redis, q: ListQuery, keys: Keys) -> OperationPage:
    """:func:`read_page` on ``redis.asyncio``."""
    tools = tools_of(q, () if q.tool is not None else await client.smembers(keys.tools))
    if not tools:
        return empty_page(q)
    script = client.register_script(LIST)
    return page_of(await script(keys=list_keys(keys, tools, q), args=_args(q, tools)), q)
