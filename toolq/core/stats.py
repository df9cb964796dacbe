"""The names of the ledger's per-tool counters that tell whether toolq can be trusted,
and the fixed buckets of the recovery-time histogram the ledger keeps beside them.

The stats hash (:attr:`toolq.core.keys.Keys.stats`) holds ``<tool>|<name>`` -> count.
Besides the counters the decisions name (``unknown``, ``verify_found``, ...), the
ledger's APPLY counts, at every transition out of a pending-recovery state, how long
the operation spent in it: one ``HINCRBY`` of the bucket the time falls in
(``recovery_ms:<state>:<le>``, ``le`` the bucket's upper edge in ms or ``inf``) and one
of the sum (``recovery_ms:<state>:sum``). Buckets are not cumulative (each time is
counted once, in its own bucket); :func:`cumulative` turns them into Prometheus's.
A call that never enters recovery writes none of these.
"""

from __future__ import annotations

from collections.abc import Mapping

from toolq.core.states import PENDING_RECOVERY

#: Upper edges (ms) of the recovery-time buckets; a time above the last is ``inf``.
#: From a tenth of a second (a check that answers at once) to a week (an approval
#: nobody gave): 19 buckets per tool and state, created only when one is counted.
RECOVERY_BUCKETS_MS: tuple[int, ...] = (
    100, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000,
    1_800_000, 3_600_000, 7_200_000, 21_600_000, 86_400_000, 259_200_000, 604_800_000,
)  # fmt: skip
INF = "inf"
SUM = "sum"
RECOVERY_PREFIX = "recovery_ms"
#: The states whose time is measured, in the order the pages show them.
RECOVERY_STATES: tuple[str, ...] = tuple(s.value for s in PENDING_RECOVERY)

#: Operator resolutions of an escalated operation (counted by the ledger by these names).
RESOLUTIONS: tuple[str, ...] = ("resolved_committed", "resolved_not_committed", "resolved_retry")
#: A repeated submit of an existing operation (same ref, same arguments) that the ledger
#: answered for the existing one instead of creating a second: SUBMIT counts it.
DUPLICATE_SUBMITS = "duplicate_submits"
#: The counters the trust figures are made of (:mod:`toolq.services.scheduler.trust`).
TRUST_COUNTERS: tuple[str, ...] = (
    "unknown", "verify_found", "verify_not_found", "verify_escalated", "no_verifier",
    "duplicates_prevented", DUPLICATE_SUBMITS, "escalated", *RESOLUTIONS,
)  # fmt: skip


def bucket_labels() -> tuple[str, ...]:
    """Every bucket's ``le`` as the stats field spells it, the last ``inf``."""
    return (*(str(e) for e in RECOVERY_BUCKETS_MS), INF)


def recovery_field(state: str, le: str) -> str:
    """The stats name of ``state``'s bucket ``le`` (or of its sum: ``le=SUM``)."""
    return f"{RECOVERY_PREFIX}:{state}:{le}"


def is_recovery_field(name: str) -> bool:
    return name.startswith(RECOVERY_PREFIX + ":")


def parse_recovery_field(name: str) -> tuple[str, str] | None:
    """``(state, le)`` of a recovery-time stats name (``le`` may be ``sum``); None if
    it is not one."""
    head, _, rest = name.partition(":")
    state, _, le = rest.partition(":")
    if head != RECOVERY_PREFIX or state not in RECOVERY_STATES:
        return None
    if le not in (SUM, INF) and not le.isdigit():
        return None
    return state, le


def recovery_of(counters: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """One tool's recovery-time fields by state: ``{state: {le: n, 'sum': ms}}``."""
    out: dict[str, dict[str, int]] = {}
    for name, n in counters.items():
        parsed = parse_recovery_field(name)
        if parsed is not None:
            state, le = parsed
            out.setdefault(state, {})[le] = int(n)
    return out


def cumulative(buckets: Mapping[str, int]) -> list[tuple[str, int]]:
    """Prometheus's ``le`` buckets (cumulative, ``+Inf`` last) from one state's own."""
    out: list[tuple[str, int]] = []
    total = 0
    for e in RECOVERY_BUCKETS_MS:
        total += int(buckets.get(str(e), 0))
        out.append((_seconds(e), total))
    total += int(buckets.get(INF, 0))
    out.append(("+Inf", total))
    return out


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g}"
