"""The ledger's Lua: every transition is one atomic call of one of these scripts.

**One library, loaded once.** The scripts are the functions of one Lua library
(:func:`library`, named by a hash of its code so that two toolq versions never
replace each other's). A server with functions (Redis >= 7, Valkey) loads it
once (``FUNCTION LOAD``) and runs a call as ``FCALL``: the prelude below (the
state tables, the helpers) is evaluated at load, not on every call. A server
without functions runs the same code as a script (:func:`script`, ``EVALSHA``),
where the prelude runs on every call. Measured on Valkey 9.1 (bench/RESULTS.md,
"Server cost"): the prelude cost ~5-10 µs of server time per script call.

**Keys.** Every script declares the keys it touches in KEYS, named by
:class:`toolq.core.keys.Keys` and so all under one hash tag (one Cluster slot):

- ``KEYS[1..6]`` of every script, in :func:`fixed_keys` order: the due set, the
  scheduler's wake list and ``sleep_until``, the stats hash, the tools set, and
  the state-index prefix;
- then the script's own: SUBMIT and CLAIM the operation's record (SUBMIT also
  the queue it pushes to), RENEW one record per lease, APPLY one record per item
  and then the queues its items push to, CLAIM_DUE the record prefix.

**History.** An operation's transitions are fields of its record: ``h1``,
``h2``, ... (JSON, :class:`toolq.core.record.HistoryEntry`), and ``hn``, how many.
Appending one is two more fields in the write the transition makes anyway, and
retention expires one key: as a list of its own the history cost every call
four more commands (three RPUSH, one EXPIRE; bench/RESULTS.md, "Server cost").

Two exceptions, on purpose:

- Keys a script can only name from data it reads are built in Lua from a
  tagged prefix passed in KEYS: the per-tool-per-state indexes (the tool and
  the current state are read from the record; ``IDX .. tool .. ':' .. state``)
  and, in CLAIM_DUE, the records of the refs it finds in the due set. The
  prefix carries the tag, so these keys land in the same slot as the rest.
- The Celery queue lists SUBMIT and APPLY ``LPUSH`` to are kombu's keys, named
  by the queue settings: they cannot carry the tag. They are declared in KEYS
  all the same; a Redis Cluster would refuse a script that pushes (CROSSSLOT).

**Outbox mode** (``broker_url`` set: the broker is not the ledger's Redis). The
scripts ``XADD`` each message, with its queue's name, to the ledger's outbox
stream (:attr:`toolq.core.keys.Keys.outbox`, tagged, declared in KEYS where the
queue would be) instead of pushing it: the transition and the intent to publish
stay one atomic step, and a relay (:mod:`toolq.services.relay`) publishes. The queue's
name comes as an argument (SUBMIT's last, APPLY's ``push_name`` blob); without
it a script pushes as before, with the same commands.

ARGV[1] is always the notify channel (a channel, not a key; the steps channel is
derived from it, as :attr:`toolq.core.keys.Keys.notify_steps` says). Time is passed in
by the caller (ms), so the scripts are deterministic and the clock injectable.

**States.** The state machine is :data:`toolq.core.states.ALLOWED`, rendered into the
prelude with ``SETTLED`` and ``INITIAL`` (one source, see :func:`lua_tables`):
SUBMIT creates only in an initial state, CLAIM's queued -> running and every
APPLY move go through ``allowed()``, and a quiet APPLY item (a field update)
must stay in the state it finds.

**Cheap on the server.** The server runs every call of every client, so the Lua
does as little as it can: no JSON decoding of arguments (APPLY's items come as
flat arguments, :data:`ITEM_HEAD`), history entries written as strings rather
than through cjson, no table built that a call does not use.
"""

from __future__ import annotations

import hashlib

# The texts live in three modules (the prelude, the calls on operations, the
# scheduler's); this one assembles them. They are names of this module too: the
# library is built from these names (bench/server_ablation.py edits them here).
from toolq.adapters.ledger.lua_calls import APPLY, CLAIM, ITEM_HEAD, RENEW, SUBMIT
from toolq.adapters.ledger.lua_prelude import FIXED, PRELUDE, WAKE_HORIZON_MS, lua_tables
from toolq.adapters.ledger.lua_schedule import CELL_LEASE, CLAIM_DUE, DUE_FIELDS, PLAN_SLEEP
from toolq.core.keys import Keys

__all__ = [
    "APPLY",
    "CELL_LEASE",
    "CLAIM",
    "CLAIM_DUE",
    "DUE_FIELDS",
    "FIXED",
    "ITEM_HEAD",
    "LIBRARY",
    "NAMES",
    "PLAN_SLEEP",
    "PRELUDE",
    "RENEW",
    "SUBMIT",
    "WAKE_HORIZON_MS",
    "fixed_keys",
    "function_name",
    "library",
    "lua_tables",
    "script",
]

#: The scripts, by the name callers use (the function is ``<library>_<name>``).
NAMES = ("submit", "claim", "renew", "apply", "claim_due", "plan_sleep", "cell_lease")


def fixed_keys(keys: Keys) -> list[str]:
    """The keys behind :data:`FIXED`, in its order (the contract tests check the pairing)."""
    return [
        keys.due,
        keys.wake,
        keys.sleep_until,
        keys.stats,
        keys.tools,
        keys.index_prefix,
        keys.dep_prefix,
    ]


_BODIES = {
    "submit": SUBMIT,
    "claim": CLAIM,
    "renew": RENEW,
    "apply": APPLY,
    "claim_due": CLAIM_DUE,
    "plan_sleep": PLAN_SLEEP,
    "cell_lease": CELL_LEASE,
}


def _function(name: str) -> str:
    """A script as a Lua function of (KEYS, ARGV) that starts from :func:`begin`."""
    return f"local function {name}(KEYS, ARGV)\nbegin(KEYS, ARGV)\n{_BODIES[name]}end\n"


#: The library's name: its code's hash, so that servers shared by two toolq versions
#: hold both libraries instead of one replacing the other's functions mid-deployment.
LIBRARY = (
    "toolq_"
    + hashlib.sha256((PRELUDE + "".join(_function(n) for n in NAMES)).encode()).hexdigest()[:12]
)


def function_name(name: str) -> str:
    """What ``FCALL`` names: the library's function for script ``name``."""
    return f"{LIBRARY}_{name}"


def library() -> str:
    """The code ``FUNCTION LOAD`` takes: the prelude once, then every script as a function."""
    parts = [f"#!lua name={LIBRARY}\n", PRELUDE]
    for name in NAMES:
        parts.append(_function(name))
        parts.append(f"redis.register_function('{function_name(name)}', {name})\n")
    return "".join(parts)


def script(name: str) -> str:
    """Script ``name`` for ``EVAL``/``EVALSHA``, on a server without functions."""
    return PRELUDE + _function(name) + f"return {name}(KEYS, ARGV)\n"
