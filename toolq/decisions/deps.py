"""Limits per dependency (issue 28): the limiter's decisions, pure. The ledger's Lua
(:mod:`toolq.adapters.ledger.lua_deps`) makes the same ones atomically in the claim and
the record of an outcome; the contract test drives both through one table.

**Admission** (:func:`admit`, at a claim of a call whose record has a ``dep``), in
this order; the first that holds the call back names the reason:

========== ========================================= =================================
reason     when                                      not_before
========== ========================================= =================================
paused     ``paused_until > now`` (shared backoff)   ``paused_until``
paused     the pause is over: another call is the    ``probe_until`` (its lease)
           probe that tests it (``resume``)
breaker_open the breaker is open, ``open_until > now`` ``open_until``
half_open  open time over: another call is the probe ``probe_until`` (its lease)
concurrency the key's live slots >= concurrency      the first slot's lease end
rate       GCRA: ``tat - now > (burst - 1) * T``     the call's reserved slot
========== ========================================= =================================

**Rate: GCRA with reservations.** ``tat`` (theoretical arrival time) moves one
interval ``T`` on per admitted call. A call over the rate is given the next free slot
(``tat - (burst - 1) * T``, then ``tat += T``) as its ``not_before``, stored on its
record (``dep_slot``): coming back at it, it passes without consuming again. So 2,000
queued calls are each held back once and come back in rate order, instead of all
polling. A second clock, ``atat``, moves with the calls actually let through: a
reserved call that comes back late (a busy queue) passes only if ``atat`` allows it,
else it takes a new slot at the end of the schedule; so calls whose slots were
spread never reach the provider bunched. A reservation older than
:data:`RESERVATION_GRACE_MS` (a pause came between) is dropped: a new one is taken.

**Outcomes** (:func:`signal_of`, :func:`after_outcome`): ``RateLimited`` pauses the
key until the call's retry is due; ``Unavailable`` pauses it too and counts a breaker
failure; an unknown outcome (``OutcomeUnknown``, a timeout) counts a failure only.
The call that got the 429 spends its attempt (it caused it); every call the key then
holds back spends none. **A pause ends with one probe**: the first call admitted after
it tests the key alone (``resume``, the ``probe`` field); its success lets the others
go (the script makes them due now, spread), a new 429 pauses the key again. So the calls
a pause held back do not all reach a provider that is still down; calls not yet claimed
when it ends are not held back, and without a declared rate may meet the next 429.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from toolq.core import errors

#: Why a call is held back (``safe_details.reason`` of its DEPENDENCY_LIMITED envelope).
Reason = Literal["rate", "concurrency", "paused", "breaker_open", "half_open"]
#: What an outcome tells the key: ``pause`` (a 429), ``down`` (unavailable: pause and a
#: breaker failure), ``failure`` (a breaker failure only), or None.
Signal = Literal["pause", "down", "failure"]

#: A reserved slot is honoured up to this long after it (the scheduler's and the
#: queue's latency); later, the call reserves again.
RESERVATION_GRACE_MS = 2_000
#: ... and this much before it (the worker's clock a little behind the scheduler's).
RESERVATION_SLACK_MS = 20


@dataclass(frozen=True)
class DepState:
    """One key's limiter state (the fields of ``Keys.dep(key)``, :mod:`toolq.core.deps`)."""

    tat: float = 0
    #: The calls actually let through (GCRA too): a reserved call coming back late
    #: passes only if this allows it, so late comers never bunch into a burst.
    atat: float = 0
    paused_until: int = 0
    breaker: str = "closed"
    fails: int = 0
    fails_since: int = 0
    open_until: int = 0
    probe: str = ""
    probe_until: int = 0
    #: A pause was set and has not yet been followed by a call that went through: when
    #: it ends, one call at a time tests the key (the probe) before the others go.
    resume: bool = False


@dataclass(frozen=True)
class Admission:
    """What a claim does: admit (``reason`` None) or hold back until ``not_before``;
    ``reserve``: the slot the call keeps (rate)."""

    state: DepState
    reason: Reason | None = None
    not_before: int = 0
    reserve: int | None = None
    probe: bool = False


def admit(
    s: DepState,
    *,
    ref: str,
    now: int,
    lease_ms: int,
    interval_ms: float,
    burst: int,
    concurrency: int,
    live_slots: list[tuple[str, int]],
    slot: int | None,
) -> Admission:
    """The admission table of the module's docstring. ``live_slots``: (ref, lease end)
    of the calls in flight; ``slot``: the call's reservation, if it has one."""
    if s.paused_until > now:
        return Admission(s, "paused", s.paused_until)
    probe = False
    if s.resume:
        # The pause is over, not yet shown to be: one call tests the key first.
        if s.probe and s.probe != ref and s.probe_until > now:
            return Admission(s, "paused", s.probe_until)
        probe = True
    if s.breaker == "open":
        if s.open_until > now:
            return Admission(s, "breaker_open", s.open_until)
        s = replace(s, breaker="half_open", probe="", probe_until=0)
    if s.breaker == "half_open":
        if s.probe and s.probe != ref and s.probe_until > now:
            return Admission(s, "half_open", s.probe_until)
        probe = True
    if concurrency > 0:
        live = sorted(end for r, end in live_slots if end > now and r != ref)
        if len(live) >= concurrency:
            return Admission(s, "concurrency", live[0])
    if interval_ms > 0:
        if slot is not None and slot > now + RESERVATION_SLACK_MS:
            return Admission(s, "rate", slot)
        reserved = slot is not None and slot >= now - RESERVATION_GRACE_MS
        tau = (burst - 1) * interval_ms
        atat = max(s.atat, now)
        if reserved and atat - now <= tau:
            s = replace(s, atat=atat + interval_ms)  # its slot: the schedule does not move
        else:
            tat = max(s.tat, now, atat)
            if tat - now > tau:
                at = int(tat - tau)
                return Admission(replace(s, tat=tat + interval_ms), "rate", at, reserve=at)
            s = replace(s, tat=tat + interval_ms, atat=atat + interval_ms)
    if probe:
        s = replace(s, probe=ref, probe_until=now + lease_ms)
    return Admission(s, probe=probe)


def signal_of(exc: BaseException) -> Signal | None:
    """What a tool's exception tells its dependency key (the module's docstring)."""
    if isinstance(exc, errors.RateLimited):
        return "pause"
    if isinstance(exc, errors.Unavailable):
        return "down"
    if isinstance(exc, errors.OutcomeUnknown | TimeoutError):
        return "failure"
    return None


def after_outcome(
    s: DepState,
    *,
    ref: str,
    now: int,
    signal: Signal | None,
    due: int | None,
    succeeded: bool,
    breaker_failures: int,
    breaker_window_ms: int,
    breaker_open_ms: int,
) -> DepState:
    """The key's state after one of its calls left ``running``: the shared backoff
    (``pause``/``down`` with the call's retry ``due``: paused until then, never less
    than a pause already set) and the breaker (a failure in the window counts; the
    ``breaker_failures``-th opens it; the half-open probe's success closes it, its
    failure opens it again)."""
    if signal in ("pause", "down") and due is not None:
        s = replace(s, paused_until=max(s.paused_until, due), resume=True)
    failure = signal in ("down", "failure")
    if s.breaker == "half_open" and s.probe == ref:
        if failure:
            return replace(s, breaker="open", open_until=now + breaker_open_ms, probe="")
        if succeeded or signal is None:
            return replace(s, breaker="closed", fails=0, fails_since=0, probe="", resume=False)
        return s
    if s.resume and s.probe == ref:
        # The probe after a pause: its success lets the others go (the script makes the
        # calls the key holds back due now, spread); anything else leaves the key to
        # the next probe.
        s = replace(s, probe="", resume=not (succeeded or signal is None))
    if failure:
        if now - s.fails_since > breaker_window_ms:
            s = replace(s, fails=1, fails_since=now)
        else:
            s = replace(s, fails=s.fails + 1)
        if s.breaker == "closed" and s.fails >= breaker_failures:
            s = replace(s, breaker="open", open_until=now + breaker_open_ms)
    return s


def hold_due(not_before: int, now: int, reason: Reason, frac: float, deadline_ms: int) -> int:
    """When a held-back call is looked at again: ``not_before``, spread (but for a
    reserved rate slot, already spaced) by ``frac`` in [0, 1) of a fifth of the wait,
    between 100 ms and 5 s, so that the calls a pause held back do not all come back at
    once; never past just after the deadline (where the scheduler escalates it)."""
    due = not_before
    if reason != "rate":
        spread = min(5_000, max(100, (not_before - now) // 5))
        due += int(frac * spread)
    if deadline_ms and due > deadline_ms + 1:
        due = deadline_ms + 1
    return due
