"""The ledger's stored format: which one a ledger holds, and how each earlier one
becomes today's (``toolq migrate``). Pure: names and values in, names and values out;
the Redis part is :mod:`toolq.adapters.ledger.stored_format` (the check) and
:mod:`toolq.adapters.ledger.upgrade` (the migration).

=======  ===========================================  ==========================
format   what is stored                               written by
=======  ===========================================  ==========================
1        keys without a hash tag (``toolq:op:<ref>``), before 5e258ec (issue 12)
         history in a list per operation
         (``toolq:hist:<ref>``)
2        one hash tag (``{toolq}:op:<ref>``), history  5e258ec .. efd5336
         still in a list (``{toolq}:hist:<ref>``)
3        history in the record (fields ``h1`` ..       108ddd3 (issue 14) to today
         ``h<hn>``, ``hn``); ``format`` in the meta
=======  ===========================================  ==========================

The format is the ``format`` field of the ledger's meta (:attr:`toolq.core.keys.Keys.meta`),
written by the first process that uses an empty ledger. A ledger without it was
written before the field existed: its keys say which format it is in
(:func:`unversioned_format`). **A change to what is stored bumps** :data:`FORMAT`,
adds a row above and a step to :func:`steps` (and to the adapter's ``STEP_RUNNERS``),
and commits a ledger of the previous format as test data (``tests/data/ledgers/``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The format this toolq reads and writes.
FORMAT = 3

#: The meta field that holds it.
FORMAT_FIELD = "format"

#: One line per format (``toolq migrate`` and the refusals name them).
DESCRIPTIONS: dict[int, str] = {
    1: "keys without a hash tag, history in a list per operation",
    2: "tagged keys, history in a list per operation",
    3: "tagged keys, history in the operation's record",
}

#: What a format-1 ledger keeps under ``<prefix>:``: key names (exact) ...
V1_NAMES = ("due", "wake", "sleep_until", "tools", "stats", "schedulers")
#: ... and name prefixes (``op:<ref>``, ``hist:<ref>``, ``idx:<tool>:<state>``).
V1_PREFIXES = ("op:", "hist:", "idx:")
#: Format-1 keys that only a running scheduler needs: deleted, not moved (a
#: scheduler makes them again; the heartbeats of format 1's are stale by then).
TRANSIENT = ("wake", "sleep_until", "schedulers")


class FormatError(ValueError):
    """A meta's ``format`` that is no whole number >= 1."""


def recorded_format(raw: str | bytes | None) -> int | None:
    """The format a meta records (None: no field, an unversioned ledger)."""
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else raw
    if not text.isdigit() or int(text) < 1:
        raise FormatError(f"the ledger's meta records format {text!r}, not a number >= 1")
    return int(text)


def refusal(prefix: str, found: int) -> str | None:
    """Why a process of this toolq cannot use a ledger in format ``found`` (None: it can)."""
    if found == FORMAT:
        return None
    if found > FORMAT:
        return (
            f"the ledger {prefix!r} is in format {found}, newer than this toolq's "
            f"({FORMAT}): upgrade toolq (every process that shares the ledger)"
        )
    return (
        f"the ledger {prefix!r} is in format {found} ({DESCRIPTIONS[found]}); this toolq "
        f"reads format {FORMAT}: stop every worker, scheduler and relay, then run "
        f"`toolq migrate` (`toolq migrate --dry-run` shows what it would do)"
    )


def v1_target(prefix: str, key: str) -> str | None:
    """Format 1 -> 2: the tagged name of the format-1 key ``key`` (None: not one of
    the ledger's format-1 keys, or one of :data:`TRANSIENT`, deleted instead)."""
    head = prefix + ":"
    if not key.startswith(head):
        return None
    rest = key[len(head) :]
    if rest in V1_NAMES:
        return None if rest in TRANSIENT else "{" + prefix + "}:" + rest
    if any(rest.startswith(p) and len(rest) > len(p) for p in V1_PREFIXES):
        return "{" + prefix + "}:" + rest
    return None


def is_v1_key(prefix: str, key: str) -> bool:
    """``key`` is one a format-1 ledger of ``prefix`` wrote (moved or deleted by step 1)."""
    head = prefix + ":"
    return v1_target(prefix, key) is not None or (
        key.startswith(head) and key[len(head) :] in TRANSIENT
    )


def history_fields(entries: Sequence[str | bytes]) -> dict[str, str]:
    """Format 2 -> 3: a history list's entries as the record's fields ``h1`` .. ``h<n>``
    and ``hn``, each entry in today's spelling (whole numbers, keys in order)."""
    fields: dict[str, str] = {}
    for n, raw in enumerate(entries, start=1):
        fields[f"h{n}"] = history_entry(raw)
    fields["hn"] = str(len(entries))
    return fields


def history_entry(raw: str | bytes) -> str:
    """One history entry (the JSON an earlier script's ``cjson.encode`` wrote) as the
    Lua of today writes it (``entry()`` in :mod:`toolq.adapters.ledger.lua_prelude`)."""
    data: dict[str, Any] = json.loads(raw)
    out: dict[str, Any] = {"at": int(float(data["at"]))}
    if data.get("from"):
        out["from"] = data["from"]
    out["to"] = data["to"]
    out["attempt"] = int(float(data.get("attempt") or 0))
    out["by"] = str(data.get("by") or "")
    if data.get("code") is not None:
        out["code"] = str(data["code"])
    return json.dumps(out, separators=(",", ":"))


@dataclass(frozen=True)
class Step:
    """One migration step: from format ``source`` to ``source + 1``."""

    source: int
    what: str


#: Every step, in order; ``toolq migrate`` runs those from the ledger's format on.
STEPS = (
    Step(1, "rename every key to the tagged name ({prefix}:op:<ref> -> {{{prefix}}}:op:<ref>)"),
    Step(2, "fold each history list ({{{prefix}}}:hist:<ref>) into its record (h1 .. hn)"),
)


def steps(found: int) -> list[Step]:
    """The steps that bring a ledger in format ``found`` to :data:`FORMAT` (none for
    today's; ValueError for a format newer than this toolq's)."""
    if found > FORMAT:
        raise ValueError(refusal("", found))
    return [s for s in STEPS if s.source >= found]


def unversioned_format(v1_keys: bool, history_lists: bool) -> int:
    """A ledger whose meta records no format: 1 if it holds a format-1 key, 2 if a
    history list, else today's (an empty ledger, or one written since format 3)."""
    if v1_keys:
        return 1
    if history_lists:
        return 2
    return FORMAT
