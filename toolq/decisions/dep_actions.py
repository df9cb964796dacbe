"""An operator's actions on a dependency key (pure): when each applies, and when the
calls the key held back go once it is settled.

=========  ==========================================  ==============================
action     applies when                                writes (the key's hash)
=========  ==========================================  ==============================
``lift``   the shared backoff runs: ``paused_until``   drops ``paused_until`` and
           is after now                                ``pause_code``
``close``  the breaker is ``open`` or ``half_open``    ``breaker=closed``, ``fails=0``;
                                                       drops ``fails_since``,
                                                       ``open_until``, ``probe``,
                                                       ``probe_until``
=========  ==========================================  ==============================

Otherwise the action is refused with :class:`Refusal` (``NOT_PAUSED``,
``BREAKER_CLOSED``) and nothing is written. Either way that applies records who, when
and why (``op_at``, ``op_by``, ``op_what``, ``op_why``, and the last
:data:`LOG_CAP` actions as JSON in ``op_log``), and makes the refs the key holds back
due now, spread over :func:`spread_ms` so they do not all reach the provider at once.
The Lua (:mod:`toolq.adapters.ledger.lua_dep_ops`) renders :data:`CLOSABLE` from here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from toolq.core.deps import BreakerState


class DepAction(StrEnum):
    LIFT = "lift"
    CLOSE = "close"


#: The breaker states ``close`` applies to.
CLOSABLE: frozenset[BreakerState] = frozenset({"open", "half_open"})

#: Actions kept in a key's ``op_log`` (the newest first).
LOG_CAP = 20
#: The longest a reason may be (what the console's field and the CLI accept).
MAX_REASON = 500

#: How far apart the held-back calls go once a key is settled: ``PER_CALL_MS`` per
#: call, at least ``MIN_SPREAD_MS``, at most ``MAX_SPREAD_MS`` (the scheduler hands
#: out due work in batches; a key with a rate limit meters them again at the claim).
PER_CALL_MS = 5
MIN_SPREAD_MS = 100
MAX_SPREAD_MS = 2_000


@dataclass(frozen=True)
class Refusal:
    """Why an action does not apply: a stable ``code`` and a sentence."""

    code: str
    message: str


NOT_PAUSED = Refusal("NOT_PAUSED", "the key is not paused: there is no pause to lift")
BREAKER_CLOSED = Refusal("BREAKER_CLOSED", "the key's breaker is closed already")
#: Every refusal by its code (what the Lua answers).
REFUSALS = {r.code: r for r in (NOT_PAUSED, BREAKER_CLOSED)}


def refusal(
    action: DepAction, *, paused_until_ms: int | None, breaker: str, now_ms: int
) -> Refusal | None:
    """Why ``action`` does not apply to a key in this state (None: it applies)."""
    if action is DepAction.LIFT:
        if paused_until_ms is None or paused_until_ms <= now_ms:
            return NOT_PAUSED
        return None
    if breaker not in CLOSABLE:
        return BREAKER_CLOSED
    return None


def spread_ms(waiting: int) -> int:
    """The window the held-back calls are spread over (ms)."""
    return max(MIN_SPREAD_MS, min(MAX_SPREAD_MS, waiting * PER_CALL_MS))


def due_times(refs: list[str], now_ms: int, seed: int) -> list[tuple[str, int]]:
    """Each held-back ref and when it is due: now plus a jitter within :func:`spread_ms`
    (``seed``: the same refs, time and seed give the same times)."""
    window = spread_ms(len(refs))
    rng = random.Random(seed)
    return [(ref, now_ms + rng.randrange(window)) for ref in refs]


def check_reason(reason: object) -> str:
    """The reason, stripped; ValueError for none, or one too long."""
    text = reason.strip() if isinstance(reason, str) else ""
    if not text:
        raise ValueError("say why (a reason is required)")
    if len(text) > MAX_REASON:
        raise ValueError(f"a reason is at most {MAX_REASON} characters")
    return text
