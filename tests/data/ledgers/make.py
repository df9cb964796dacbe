"""Make the ledgers of earlier formats (``<format>.json`` here) from the commits that wrote them.

    .venv/bin/python tests/data/ledgers/make.py            # every format
    .venv/bin/python tests/data/ledgers/make.py 2          # one

For each earlier format (:data:`toolq.decisions.formats.DESCRIPTIONS`) it checks out
the last commit that wrote it (``git worktree add --detach`` into a temporary
directory), starts an embedded Valkey of its own, runs :data:`DRIVER` with that
commit's ``toolq`` first on ``sys.path`` (its code, this venv's packages), which
submits operations and runs their attempts in process (``tq.runtime.run_attempt``,
what a worker's task body calls) so that they end in the states of :data:`STATES`,
then dumps every key of the server (type, value, time to live) as JSON.
``tests/integration/test_upgrade.py`` loads each dump and migrates it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

#: The last commit that wrote each earlier format.
COMMITS = {
    1: "4d67393",  # before 5e258ec gave the keys a hash tag
    2: "b244b09",  # before 108ddd3 moved the history into the record (efd5336, its
    # child, does not run: its keys.py lost `history` while its store still used it)
}

#: The state each operation ``legacy/<name>`` is left in (DRIVER checks it).
STATES = {
    "succeeded": "succeeded",
    "queued-1": "queued",
    "queued-2": "queued",
    "retry": "waiting_retry",
    "verify": "verifying",
    "escalated": "escalated",
    "failed": "failed",
    "approval": "awaiting_approval",
}

DRIVER = r"""
import json, os, sys
import toolq
assert toolq.__file__.startswith(os.environ["OLD_SRC"]), toolq.__file__
from pydantic import BaseModel
from toolq import CallContext, ToolQueue, errors

tq = ToolQueue(redis_url=os.environ["TOOLQ_REDIS_URL"], name="legacy")
YEARS = 10 * 365 * 86400.0  # the dump is loaded long after it was made


class Args(BaseModel):
    n: int = 1


@tq.tool(writes=True, deadline=YEARS)
def legacy_pay(args: Args, ctx: CallContext) -> dict:
    if args.n == 2:
        raise errors.RateLimited(retry_after=1.0)
    if args.n == 3:
        raise errors.OutcomeUnknown()
    if args.n == 4:
        raise errors.NotFound()
    return {"paid": args.n}


@legacy_pay.verifier
def legacy_pay_found(ctx: CallContext) -> object:
    return None


@tq.tool(writes=True, deadline=YEARS, max_attempts=1)
def legacy_once(args: Args, ctx: CallContext) -> dict:
    raise errors.Unavailable()


@legacy_once.verifier
def legacy_once_found(ctx: CallContext) -> object:
    return None


@tq.tool(writes=True, deadline=YEARS, requires_approval=True)
def legacy_approve(args: Args, ctx: CallContext) -> dict:
    return {"approved": args.n}


@legacy_approve.verifier
def legacy_approve_found(ctx: CallContext) -> object:
    return None


plan = [
    ("succeeded", "legacy_pay", 1, True),
    ("queued-1", "legacy_pay", 5, False),
    ("queued-2", "legacy_pay", 6, False),
    ("retry", "legacy_pay", 2, True),
    ("verify", "legacy_pay", 3, True),
    ("escalated", "legacy_once", 1, True),
    ("failed", "legacy_pay", 4, True),
    ("approval", "legacy_approve", 7, False),
]
states = {}
for name, tool, n, run in plan:
    ref = "legacy/" + name
    tq.submit(tool, {"n": n}, operation_ref=ref, call_id="call-" + name)
    if run:
        tq.runtime.run_attempt(ref, 1)
    states[name] = tq.get(ref).state.value
print(json.dumps(states))
"""


def dump(client: redis.Redis) -> dict[str, Any]:
    """Every key of the server but kombu's bindings: type, value, milliseconds to live."""
    from toolq.core.text import as_text

    out: dict[str, Any] = {}
    for raw in sorted(client.scan_iter(count=1000)):
        key = as_text(raw)
        if key.startswith("_kombu."):
            continue
        kind = as_text(client.type(key))
        value: Any
        if kind == "string":
            value = as_text(client.get(key))
        elif kind == "hash":
            value = {as_text(k): as_text(v) for k, v in sorted(client.hgetall(key).items())}
        elif kind == "list":
            value = [as_text(v) for v in client.lrange(key, 0, -1)]
        elif kind == "set":
            value = sorted(as_text(v) for v in client.smembers(key))
        elif kind == "zset":
            pairs: list[Any] = list(client.zrange(key, 0, -1, withscores=True))
            value = [[as_text(m), s] for m, s in pairs]
        else:
            raise ValueError(f"{key}: a {kind}, which no earlier format wrote")
        out[key] = {"type": kind, "value": value, "pttl": client.pttl(key)}
    return out


def make(fmt: int) -> Path:
    sys.path.insert(0, str(ROOT))
    from toolq.adapters.embedded import EmbeddedServer

    commit = COMMITS[fmt]
    with tempfile.TemporaryDirectory(prefix=f"toolq-format-{fmt}-") as tmp:
        src = Path(tmp) / "src"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(src), commit],
            check=True,
            capture_output=True,
        )
        try:
            with EmbeddedServer(appendonly=False) as server:
                env = {
                    **os.environ,
                    "PYTHONPATH": str(src),
                    "OLD_SRC": str(src),
                    "TOOLQ_REDIS_URL": str(server.url),
                }
                env.pop("TOOLQ_PREFIX", None)
                ran = subprocess.run(
                    [sys.executable, "-c", DRIVER],
                    cwd=src,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if ran.returncode:
                    raise SystemExit(f"format {fmt} ({commit}):\n{ran.stderr}")
                states = json.loads(ran.stdout.strip().splitlines()[-1])
                want = {name: state for name, state in STATES.items()}
                if states != want:
                    raise SystemExit(f"format {fmt} ({commit}): states {states}, wanted {want}")
                client = redis.Redis.from_url(str(server.url))
                keys = dump(client)
                client.close()
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(src)],
                check=True,
                capture_output=True,
            )
    full = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", commit], check=True, capture_output=True, text=True
    ).stdout.strip()
    path = HERE / f"format-{fmt}.json"
    body = {
        "format": fmt,
        "commit": full,
        "made_by": "tests/data/ledgers/make.py",
        "states": STATES,
        "keys": keys,
    }
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    return path


if __name__ == "__main__":
    for arg in sys.argv[1:] or [str(f) for f in COMMITS]:
        print(make(int(arg)))
