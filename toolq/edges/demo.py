"""``toolq demo``: the real stack against a provider that misbehaves on purpose.

An embedded Valkey, the scheduler, two calls workers and a verify worker run
as real processes (:class:`toolq.edges.stack.Stack`); the example invoice provider
(:mod:`toolq.examples.provider`) runs in a thread of this process. A simulated
agent submits a workload through :class:`toolq.ToolQueue` and acts on what the
ledger says — corrects input, has an operator approve, rereads after a
conflict — while the provider rate-limits, loses replies, times out before
committing, and one calls worker is SIGKILLed in the middle of a write.

The report is read from the ledger and from the provider's own records; the
demo fails if any succeeded write has other than exactly one side effect, if
a write that did not succeed has one, or if any operation is left unfinished.
"""

from __future__ import annotations

import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from toolq.adapters import liveness
from toolq.client.queue import ToolQueue
from toolq.core.record import OperationRecord
from toolq.core.states import PENDING_RECOVERY, TERMINAL, State
from toolq.edges.stack import Stack, StackConfig
from toolq.examples.provider import InvoiceProvider, ProviderConfig

APP = "toolq.examples.invoices:tq"
WRITE, READ = "create_invoice", "get_invoice"
#: scenario -> (customer, amount, what it shows)
SCENARIOS: dict[str, tuple[str, float, str]] = {
    "normal": ("acme", 120.0, "plain success"),
    "crash": ("cust_crash", 310.0, "worker SIGKILLed after the provider committed"),
    "ratelimit": ("cust_ratelimit", 80.0, "429 + Retry-After, retried by the scheduler"),
    "lostreply": ("cust_lostreply", 95.0, "committed, reply lost -> verified, found"),
    "slow_precommit": ("cust_slow_precommit", 60.0, "timeout before commit -> not found -> re-run"),
    "invalid": ("globex", -5.0, "422 -> needs_input -> agent corrects the amount"),
    "conflict": ("cust_conflict", 45.0, "409 -> failed -> agent rereads, new operation"),
    "approval": ("initech", 250_000.0, "over the limit -> awaiting_approval -> approved"),
    "down": ("cust_down", 70.0, "503 every time -> attempts exhausted -> escalated"),
}


@dataclass
class DemoOptions:
    ops: int = 60
    seed: int = 7
    timeout: float = 120.0
    calls_workers: int = 2
    lease_seconds: float = 3.0
    provider_timeout: float = 1.5
    provider_dedup: bool = True
    progress: bool = True


@dataclass
class Op:
    ref: str
    tool: str
    scenario: str
    args: dict[str, Any]
    handled: bool = False
    redelivered: bool = False


@dataclass
class Run:
    """What the agent did, for the report."""

    ops: dict[str, Op] = field(default_factory=dict)
    killed: dict[str, Any] = field(default_factory=dict)
    actions: Counter[str] = field(default_factory=Counter)


def plan(ops: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """The writes to submit, as (scenario, args): every fault at least once, one crash."""
    rng = random.Random(seed)
    writes = ops - ops // 6
    faults = [s for s in SCENARIOS if s not in ("normal", "crash")]
    each = max(1, writes // 12)
    names = [s for s in faults for _ in range(each)]
    names += ["normal"] * max(0, writes - 1 - len(names))
    rng.shuffle(names)
    names.insert(min(2, len(names)), "crash")  # early, so recovery overlaps the rest
    out = []
    for i, name in enumerate(names[: max(writes, 1)]):
        customer, amount, _ = SCENARIOS[name]
        if name == "normal":
            customer, amount = rng.choice(["acme", "globex", "umbrella", "hooli"]), amount + i
        out.append((name, {"customer": customer, "amount": amount, "currency": "EUR"}))
    return out


class Agent:
    """Submits the workload and acts on every state the ledger reports."""

    def __init__(
        self, tq: ToolQueue, stack: Stack, provider: InvoiceProvider, opts: DemoOptions, err: TextIO
    ) -> None:
        self.tq, self.stack, self.provider, self.opts, self.err = tq, stack, provider, opts, err
        self.run = Run()
        self.reads_wanted = opts.ops // 6
        self.started = time.monotonic()

    def submit(self, tool: str, scenario: str, args: dict[str, Any], ref: str | None = None) -> str:
        sub = self.tq.submit(tool, args, operation_ref=ref)
        self.run.ops[sub.operation_ref] = Op(sub.operation_ref, tool, scenario, args)
        return sub.operation_ref

    def states(self) -> dict[str, str]:
        pipe = self.tq.redis.pipeline(transaction=False)
        refs = list(self.run.ops)
        for ref in refs:
            pipe.hget(self.tq.ledger.keys.op(ref), "state")
        return {
            r: (v.decode() if v else "missing") for r, v in zip(refs, pipe.execute(), strict=True)
        }

    def drive(self) -> bool:
        """Run the workload; True when every operation finished within the timeout."""
        todo = plan(self.opts.ops, self.opts.seed)
        gap = min(0.15, 8.0 / max(1, len(todo)))
        next_submit, last_progress = time.monotonic(), 0.0
        deadline = self.started + self.opts.timeout
        while time.monotonic() < deadline:
            if todo and time.monotonic() >= next_submit:
                scenario, args = todo.pop(0)
                self.submit(WRITE, scenario, args, ref=f"demo-{len(self.run.ops) + 1:04d}")
                next_submit = time.monotonic() + gap
            states = self.states()
            self.act(states)
            # act() may have started follow-ups that `states` does not cover yet
            done = len(states) == len(self.run.ops) and not todo
            done = done and all(s in TERMINAL for s in states.values())
            done = done and self.duplicates_seen() >= self.run.actions["redeliveries_injected"]
            if done:
                self.progress(states, 0)
                return True
            if time.monotonic() - last_progress >= 1.0:
                last_progress = time.monotonic()
                self.progress(states, len(todo))
            time.sleep(0.05)
        return False

    def _reads_due(self) -> bool:
        made = sum(1 for o in self.run.ops.values() if o.tool == READ)
        return made < self.reads_wanted

    def act(self, states: dict[str, str]) -> None:
        for ref, state in states.items():
            op = self.run.ops[ref]
            if op.scenario == "crash" and not self.run.killed and state == State.RUNNING:
                self.kill_mid_write(ref)
            if state == State.SUCCEEDED and op.scenario == "normal" and not op.redelivered:
                self.redeliver(op)
            if op.handled:
                continue
            if state == State.NEEDS_INPUT:
                fixed = {**op.args, "amount": abs(float(op.args["amount"])) + 10}
                self.tq.provide_input(ref, fixed)
                op.handled = True
                self.run.actions["inputs_corrected"] += 1
            elif state == State.AWAITING_APPROVAL:
                self.tq.approve(ref)
                op.handled = True
                self.run.actions["approved"] += 1
            elif state == State.FAILED and op.scenario == "conflict":
                env = self.tq.ledger.envelope(ref)
                version = getattr(env, "current_state_ref", None)
                if version and version.isdigit():
                    self.submit(
                        WRITE,
                        "conflict_reread",
                        {**op.args, "customer_version": int(version)},
                        f"{ref}-reread",
                    )
                    self.run.actions["reread_after_conflict"] += 1
                op.handled = True
            elif state == State.SUCCEEDED and op.tool == WRITE and self._reads_due():
                env = self.tq.ledger.envelope(ref)
                result = getattr(env, "result", None)
                if isinstance(result, dict) and "id" in result:
                    self.submit(READ, "read", {"invoice_id": result["id"]}, f"{ref}-read")
                op.handled = True

    def redeliver(self, op: Op) -> None:
        """Deliver a finished write's message again, as Redis does past its visibility
        timeout: the ledger claim must refuse it without calling the tool."""
        if not self.run.killed or self.run.actions["redeliveries_injected"] >= 2:
            return  # after the kill, so the killed worker cannot swallow the copy
        rec = self.tq.ledger.fields(op.ref, "attempt")
        queue, message = self.tq.app.messages.run(op.ref, int(rec.get("attempt") or 1))
        if self.tq.app.topology.publishes_via_outbox:  # the broker is not the ledger
            self.tq.redis.xadd(
                self.tq.ledger.keys_of(op.ref).outbox, {"queue": queue, "message": message}
            )
        else:
            self.tq.redis.lpush(queue, message)
        op.redelivered = True
        self.run.actions["redeliveries_injected"] += 1

    def duplicates_seen(self) -> int:
        stats = self.tq.ledger.stats()
        return sum(v for k, v in stats.items() if k.endswith("|duplicates_prevented"))

    def kill_mid_write(self, ref: str) -> None:
        """SIGKILL the worker inside create_invoice, once the provider has committed."""
        if not self.provider.find(ref):
            return
        holder = self.tq.ledger.fields(ref, "lease_holder").get("lease_holder", "")
        parts = holder.split(":")
        if len(parts) < 3 or not parts[1].isdigit():
            return
        index = self.stack.worker_of(int(parts[1]))
        if index is None:
            return
        name = self.stack.workers[index].name
        pid = self.stack.kill_worker(index)
        self.run.killed = {
            "ref": ref,
            "worker": name,
            "pid": pid,
            "at_s": round(time.monotonic() - self.started, 2),
        }
        self.say(
            f"SIGKILL {name} (pid {pid}) while it was inside create_invoice for {ref}, "
            "after the provider committed; starting a replacement"
        )
        self.stack.restart_worker(index)

    def progress(self, states: dict[str, str], left: int) -> None:
        counts = Counter(states.values())
        order = [s.value for s in State]
        parts = [f"{s} {counts[s]}" for s in order if counts.get(s)]
        self.say(f"submitted {len(states)} ({left} to go) | " + "  ".join(parts))

    def say(self, text: str) -> None:
        if self.opts.progress:
            print(f"[{time.monotonic() - self.started:6.1f}s] {text}", file=self.err, flush=True)


# --------------------------------------------------------------------------- the report


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def recovery_seconds(rec: OperationRecord, now_ms: int) -> float:
    """Time the operation spent in pending-recovery states, from its history."""
    total = 0
    hist = rec.history
    for i, h in enumerate(hist):
        if h.to in PENDING_RECOVERY:
            end = hist[i + 1].at if i + 1 < len(hist) else now_ms
            total += max(0, end - h.at)
    return total / 1000


def _killed(run: Run | None, records: list[OperationRecord]) -> dict[str, Any]:
    if not run or not run.killed:
        return {}
    final = {r.operation_ref: str(r.state) for r in records}
    return {**run.killed, "final_state": final.get(run.killed["ref"], "missing")}


def build_report(
    records: list[OperationRecord],
    effects: dict[str, Any],
    stats: dict[str, int],
    run: Run | None = None,
) -> dict[str, Any]:
    """The demo's findings, from the ledger's records and the provider's own log."""
    now_ms = int(time.time() * 1000)
    per_ref = Counter(e["operation_ref"] for e in effects.get("effects", []))
    by_state = Counter(str(r.state) for r in records)
    by_tool_state = Counter(f"{r.tool}|{r.state}" for r in records)
    writes = [r for r in records if r.tool == WRITE]
    succeeded = [r for r in writes if r.state == State.SUCCEEDED]
    problems = [
        {
            "operation_ref": r.operation_ref,
            "state": str(r.state),
            "side_effects": per_ref[r.operation_ref],
        }
        for r in writes
        if per_ref[r.operation_ref] != (1 if r.state == State.SUCCEEDED else 0)
    ]
    unfinished = [r.operation_ref for r in records if r.state not in TERMINAL]
    verified = [r for r in records if any(h.to == State.VERIFYING for h in r.history)]
    pairs = [(a.to, b.to) for r in records for a, b in zip(r.history, r.history[1:], strict=False)]
    # what sent each into verification (not its checks, which stay in it)
    causes = Counter(
        h.code or "?"
        for r in records
        for h in r.history
        if h.to == State.VERIFYING and h.from_ != State.VERIFYING
    )
    in_recovery = [s for s in (recovery_seconds(r, now_ms) for r in records) if s > 0]
    escalations: dict[str, int] = {}
    for key, value in stats.items():
        tool, _, name = key.partition("|")
        if name == "escalated" and value:
            escalations[tool] = value
    return {
        "ok": not problems and not unfinished,
        "operations": len(records),
        "by_state": dict(sorted(by_state.items())),
        "by_tool_state": dict(sorted(by_tool_state.items())),
        "unknowns": {
            "operations_verified": len(verified),
            "causes": dict(causes),
            "found_committed": pairs.count((State.VERIFYING, State.SUCCEEDED)),
            "not_found_redispatched": pairs.count((State.VERIFYING, State.QUEUED)),
            "escalated": pairs.count((State.VERIFYING, State.ESCALATED)),
        },
        "duplicates_prevented": {
            "ledger_refused_deliveries": sum(
                v for k, v in stats.items() if k.endswith("|duplicates_prevented")
            ),
            "provider_replays": len(effects.get("replays", [])),
        },
        "side_effects": {
            "succeeded_writes": len(succeeded),
            "exactly_one": sum(1 for r in succeeded if per_ref[r.operation_ref] == 1),
            "total": sum(per_ref.values()),
            "violations": problems,
        },
        "pending_recovery_s": {
            "operations": len(in_recovery),
            "p50": round(_pct(in_recovery, 50), 3),
            "p95": round(_pct(in_recovery, 95), 3),
            "max": round(max(in_recovery, default=0.0), 3),
        },
        "escalations": escalations,
        "unfinished": unfinished,
        "worker_killed": _killed(run, records),
        "agent_actions": dict(run.actions) if run else {},
        "scenarios": dict(Counter(o.scenario for o in run.ops.values())) if run else {},
    }


# --------------------------------------------------------------------------- running it


def wait_for_beats(
    tq: ToolQueue, stack: Stack, queues: tuple[str, ...], timeout: float = 60.0
) -> None:
    """Wait until the workers the demo started beat on ``queues`` and its scheduler
    beats, so the first submits do not warn about processes still starting (a
    submit's "no live worker" warning is for a stack nobody started). Gives up
    after ``timeout`` or when a child exited: the warnings then say what is true."""
    keys = tq.ledger.keys
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stack.exited():
        pipe = tq.redis.pipeline(transaction=False)
        pipe.hgetall(keys.workers)
        pipe.hvals(keys.schedulers)
        workers, schedulers = pipe.execute()
        beats = liveness.worker_beats(workers)
        now_ms = int(time.time() * 1000)
        scheds = [int(float(v)) for v in schedulers]
        if not any(liveness.assess(q, beats.get(q), scheds, now_ms) for q in queues):
            return
        time.sleep(0.1)


def run_demo(opts: DemoOptions, err: TextIO = sys.stderr) -> dict[str, Any]:
    """Start everything, run the workload, stop everything; returns the report."""
    from toolq.examples import invoices

    started = time.monotonic()
    provider = InvoiceProvider(
        ProviderConfig(dedup=opts.provider_dedup, precommit_stall=opts.provider_timeout + 1.0)
    )
    logs = Path(tempfile.mkdtemp(prefix="toolq-demo-"))
    stack = Stack(
        StackConfig(
            app=APP,
            calls_workers=opts.calls_workers,
            verify_workers=1,
            log_dir=logs,
            loglevel="WARNING",
            env={
                "TOOLQ_EXAMPLE_PROVIDER_URL": "",  # set below, once the provider listens
                "TOOLQ_EXAMPLE_PROVIDER_TIMEOUT": str(opts.provider_timeout),
                "TOOLQ_LEASE__SECONDS": str(opts.lease_seconds),
                "TOOLQ_RECOVERY__UNCLAIMED_AFTER": "5",
                "TOOLQ_SCHEDULER__MAX_SLEEP": "1",
            },
        )
    )
    ok = False
    try:
        provider.start()
        stack.config.env["TOOLQ_EXAMPLE_PROVIDER_URL"] = provider.url
        stack.start()
        tq = invoices.tq  # this process only submits and reads: the workers run the tools
        tq.configure(redis_url=stack.redis_url)
        recovery = tq.settings.recovery.model_copy(update={"unclaimed_after": 5.0})
        tq.app.settings = tq.settings.model_copy(update={"recovery": recovery})
        agent = Agent(tq, stack, provider, opts, err)
        agent.say("starting the scheduler and workers…")
        wait_for_beats(tq, stack, (tq.settings.queues.calls, tq.settings.queues.verify))
        agent.say(
            f"stack up: valkey {stack.redis_url}, scheduler, {opts.calls_workers} calls "
            f"workers, 1 verify worker; provider {provider.url}"
        )
        agent.drive()
        records = [r for r in (tq.get(ref) for ref in agent.run.ops) if r is not None]
        report = build_report(records, provider.effects(), tq.ledger.stats(), agent.run)
        report["duration_s"] = round(time.monotonic() - started, 2)
        report["seed"], report["logs"] = opts.seed, str(logs)
        ok = bool(report["ok"])
        tq.close()
        return report
    finally:
        stack.stop()
        provider.stop()
        if ok:
            shutil.rmtree(logs, ignore_errors=True)
        else:
            print(f"worker and scheduler logs kept in {logs}", file=err)
