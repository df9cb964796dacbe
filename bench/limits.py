"""Limits per dependency (issue 28), judged by what a provider saw.

    python -m bench limits [rate|outage|concurrency|overhead|all] [--quick]
        [--calls N] [--seconds S] [--workers W] [--threads T] [--rate R]
        [--concurrency C] [--repeats K] [--json FILE] [--no-report] [--redis-url URL]

Real processes: the provider (:mod:`bench.limits_provider`, HTTP, threaded), ``W``
``toolq worker`` processes (threads pool) and one ``toolq scheduler`` on the
embedded Valkey (or ``--redis-url``; its database is flushed); the bench process
submits and waits. The tools are :mod:`bench.limits_app`'s; each run's limits go to
the workers as ``TOOLQ_DEPENDENCIES``.

- ``rate``: the provider allows ``R`` calls in any 1 s (sliding window) and answers
  429 ``Retry-After: 1`` beyond. (a) key with ``rate=R/s``: the most calls the
  provider saw in any 1-s window, and its 429s. (b) a key with no limits (the shared
  backoff alone): 429s per pause (the provider's runs of 429s), and attempts spent
  without a call reaching the provider.
- ``outage``: the provider answers 503 (no ``Retry-After``: ``Unavailable``, as a
  refused connection would be) for ``S`` seconds while ``--writes`` writes are queued:
  the calls that reached it while down, against ``breaker_failures`` + one probe per
  ``breaker_open``; then every write committed exactly once, none escalated.
- ``concurrency``: ``concurrency=C``, ``--calls`` calls the provider holds 1 s each:
  the most it held at once; one worker SIGKILLed while it holds a call: the time until
  ``C`` are in flight again, against the lease.
- ``overhead``: the no-op load (closed loop, a client process per run) on the commit
  this branch grew from (``--base``) against this tree with no key, a key with no
  limits, and a key with a generous rate; interleaved rounds, medians.

Each scenario prints its table, writes ``bench/results/limits-NAME.json`` and its
section of RESULTS.md (``--no-report``: neither; ``--json``: the raw result there).
Every process started is stopped on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench import procs, report
from bench.common import fmt, median, server
from bench.limits_provider import max_in_window, rejection_bursts

APP = "bench.limits_app:tq"
SCENARIOS = ("rate", "outage", "concurrency", "overhead")


# ---------------------------------------------------------------------------- plumbing


class ProviderClient:
    """The bench's side of the provider's control endpoints."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _req(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def configure(self, **cfg: Any) -> None:
        self._req("POST", "/_config", cfg)

    def down(self, down: bool) -> None:
        self._req("POST", "/_down", {"down": down})

    def stats(self) -> dict[str, Any]:
        return dict(self._req("GET", "/_stats"))

    def counts(self) -> dict[str, int]:
        return dict(self._req("GET", "/_counts"))


@dataclass
class Stack:
    """The provider, the workers and a scheduler, all real processes."""

    url: str
    provider: ProviderClient
    provider_url: str
    workers: list[procs.Child] = field(default_factory=list)
    children: list[procs.Child] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def provider_process(tag: str) -> Iterator[tuple[procs.Child, str]]:
    tmp = Path(tempfile.mkdtemp(prefix="toolq-limits-"))
    port_file = tmp / "port"
    child = procs.python_child(
        f"limits-provider{tag}", ["-m", "bench.limits_provider", "--port-file", str(port_file)]
    )
    try:
        if not procs.wait_for(lambda: port_file.exists() or not child.alive(), 30):
            raise RuntimeError("the provider did not start")
        if not child.alive():
            raise RuntimeError(f"the provider exited:\n{child.tail()}")
        yield child, f"http://127.0.0.1:{port_file.read_text().strip()}"
    finally:
        child.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def stack(
    url: str,
    *,
    workers: int,
    threads: int,
    dependencies: dict[str, dict[str, Any]],
    extra_env: dict[str, str] | None = None,
    tag: str = "",
) -> Iterator[Stack]:
    """Start the provider, ``workers`` workers (threads pool) and a scheduler on ``url``."""
    with provider_process(tag) as (_prov, purl):
        env = {
            "BENCH_PROVIDER_URL": purl,
            "TOOLQ_DEPENDENCIES": json.dumps(dependencies),
            **(extra_env or {}),
        }
        st = Stack(url, ProviderClient(purl), purl, env=env)
        try:
            for i in range(workers):
                w = procs.toolq_worker(
                    f"limits-worker{tag}-{i}",
                    APP,
                    url,
                    pool="threads",
                    concurrency=threads,
                    queues="toolq.calls,toolq.verify",
                    env=env,
                    hostname=f"limits{tag}-{i}@%h",
                )
                st.workers.append(w)
                st.children.append(w)
            st.children.append(procs.toolq_scheduler(f"limits-scheduler{tag}", APP, url, env))
            yield st
        finally:
            for ch in st.children:
                ch.stop()


def app_for(st: Stack) -> Any:
    """This process's client of the bench app, with the run's settings in its environment,
    once every worker of ``st`` has said it is up (its first beat)."""
    import os

    from toolq.adapters.liveness import worker_nodes

    os.environ.update(st.env)
    from bench import limits_app

    tq = limits_app.tq
    tq.configure(redis_url=st.url)
    pids = {w.pid for w in st.workers}

    def up() -> bool:
        for w in st.workers:
            if not w.alive():
                raise RuntimeError(f"worker {w.name} exited:\n{w.tail()}")
        beats = worker_nodes(tq.redis.hgetall(tq.ledger.keys.worker_nodes))
        return pids <= {n.pid for n in beats}

    if not procs.wait_for(up, 120, 0.2):
        raise RuntimeError(f"the workers did not start; see {procs.LOG_DIR}")
    return tq


class Progress:
    """A line every ``every`` seconds while a long run goes on."""

    def __init__(self, label: str, line: Callable[[], str], every: float = 5.0) -> None:
        self.label, self.line, self.every = label, line, every
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            with contextlib.suppress(Exception):
                print(f"  [{self.label}] {time.monotonic() - self.t0:6.1f} s  {self.line()}")

    def __enter__(self) -> Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=2)


def submit_all(tq: Any, tool: str, args: Sequence[dict[str, Any]], threads: int = 8) -> list[str]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda a: tq.submit(tool, a).operation_ref, args))


def wait_all(tq: Any, refs: Sequence[str], timeout: float, done: list[int]) -> dict[str, Any]:
    """Wait for every ref (until ``timeout`` s from now); ``done[0]`` counts them."""
    end = time.monotonic() + timeout
    lock = threading.Lock()

    def one(ref: str) -> None:
        with contextlib.suppress(TimeoutError):
            tq.wait(ref, timeout=max(0.1, end - time.monotonic()))
        with lock:
            done[0] += 1

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(one, refs))
    return {ref: tq.get(ref) for ref in refs}


def summarize_records(records: dict[str, Any]) -> dict[str, Any]:
    states: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    attempts: Counter[int] = Counter()
    limited_entries = 0
    for rec in records.values():
        if rec is None:
            states["missing"] += 1
            continue
        states[str(rec.state.value if hasattr(rec.state, "value") else rec.state)] += 1
        attempts[rec.attempt] += 1
        if rec.envelope is not None and not rec.envelope.ok:
            codes[rec.envelope.code] += 1
        limited_entries += sum(1 for h in rec.history if h.code == "DEPENDENCY_LIMITED")
    return {
        "states": dict(states),
        "error_codes": dict(codes),
        "attempts": {str(k): v for k, v in sorted(attempts.items())},
        "held_back_entries": limited_entries,
    }


def per_second(requests: Sequence[Sequence[Any]]) -> list[list[int]]:
    """Calls the provider saw in each second of the run: ``[accepted, refused]``."""
    if not requests:
        return []
    t0 = min(q[0] for q in requests)
    out: list[list[int]] = []
    for t, status, _, _ in requests:
        i = int(t - t0)
        out.extend([0, 0] for _ in range(i + 1 - len(out)))
        out[i][0 if status == 200 else 1] += 1
    return out


def dep_state(tq: Any, key: str) -> dict[str, str]:
    """The key's limiter hash as the ledger holds it (counters, breaker, pause)."""
    raw = tq.redis.hgetall(tq.ledger.keys.dep(key))
    return {k.decode(): v.decode() for k, v in raw.items()}


def per_ref(requests: Sequence[Sequence[Any]]) -> dict[str, Counter[int]]:
    out: dict[str, Counter[int]] = {}
    for _, status, ref, _ in requests:
        out.setdefault(ref, Counter())[status] += 1
    return out


def attempts_check(records: dict[str, Any], requests: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """Attempts against the provider's own count of each operation's calls.

    ``without_call``: attempts beyond the calls that reached the provider (an attempt
    spent while held back, e.g. on a 429 another call caused): target 0.
    ``on_own_429``: attempts after a 429 the operation itself got."""
    seen = per_ref(requests)
    without, own, ops_without = 0, 0, 0
    for ref, rec in records.items():
        if rec is None:
            continue
        c = seen.get(ref, Counter())
        calls = sum(c.values())
        extra = max(0, rec.attempt - calls)
        without += extra
        ops_without += 1 if extra else 0
        own += min(c[429] + c[503], max(0, rec.attempt - 1))
    return {"without_call": without, "ops_with_attempt_without_call": ops_without,
            "on_own_rejection": own}  # fmt: skip


def _counts_line(st: Stack, done: list[int], total: int) -> Callable[[], str]:
    def line() -> str:
        c = st.provider.counts()
        return (
            f"settled {done[0]}/{total}; provider: {c['requests']} calls, {c['429']} x 429, "
            f"{c['503']} x 503, {c['in_flight']} in flight, {c['committed']} writes"
        )

    return line


# ---------------------------------------------------------------------------- rate


def rate(url: str, a: argparse.Namespace) -> dict[str, Any]:
    r, calls = a.rate, a.calls
    key_rate = a.key_rate if a.key_rate is not None else float(r)
    deps = {"rated": {"rate": f"{key_rate:g}/s"}}
    res: dict[str, Any] = {"rate": r, "key_rate": key_rate, "calls": calls,
                           "workers": a.workers, "threads": a.threads,
                           "window": "sliding 1 s over accepted calls", "runs": {}}  # fmt: skip
    with stack(url, workers=a.workers, threads=a.threads, dependencies=deps, tag="-rate") as st:
        tq = app_for(st)
        for sub, key in (("limit", "rated"), ("backoff", "backoff")):
            st.provider.configure(rate=r, window=1.0, retry_after=1)
            print(f"rate ({sub}): {calls} calls, key {key!r}, provider {r}/s", flush=True)
            done = [0]
            t0 = time.monotonic()
            with Progress(f"rate {sub}", _counts_line(st, done, calls)):
                refs = submit_all(tq, "provider_read", [{"dep": key, "n": i} for i in range(calls)])
                records = wait_all(tq, refs, a.timeout, done)
            secs = time.monotonic() - t0
            s = st.provider.stats()
            reqs = s["requests"]
            statuses = [q[1] for q in sorted(reqs, key=lambda q: q[0])]
            bursts = rejection_bursts(statuses)
            ok_times = [q[0] for q in reqs if q[1] == 200]
            res["runs"][sub] = {
                "key": key,
                "seconds": secs,
                "requests": len(reqs),
                "accepted": len(ok_times),
                "n429": statuses.count(429),
                "max_in_1s": max_in_window([q[0] for q in reqs], 1.0),
                "max_accepted_in_1s": max_in_window(ok_times, 1.0),
                "pauses": len(bursts),
                "max_429_per_pause": max(bursts, default=0),
                "mean_429_per_pause": (sum(bursts) / len(bursts)) if bursts else 0.0,
                "bursts": bursts,
                "per_second": per_second(reqs),
                "rate_seen": len(ok_times) / (max(ok_times) - min(ok_times))
                if len(ok_times) > 1
                else 0.0,
                "attempts": attempts_check(records, reqs),
                "records": summarize_records(records),
                "dep_state": dep_state(tq, key),
            }
            print(render_rate_run(sub, res["runs"][sub]), flush=True)
    return res


def render_rate_run(sub: str, r: dict[str, Any]) -> str:
    return (
        f"  {sub}: {r['requests']} calls in {r['seconds']:.1f} s, max {r['max_in_1s']} in any 1 s, "
        f"{r['n429']} x 429 in {r['pauses']} pauses (max {r['max_429_per_pause']} per pause), "
        f"attempts without a call {r['attempts']['without_call']}, states {r['records']['states']}"
    )


def render_rate(res: dict[str, Any]) -> str:
    lim, bo = res["runs"]["limit"], res["runs"]["backoff"]
    r = res["rate"]
    rows = [
        (f"(a) `rate=\"{res['key_rate']:g}/s\"`: most calls in any 1-s window",
         f"≤ {res['key_rate']:g} ± 1",
         lim["max_in_1s"]),
        ("(a) 429s", "0", lim["n429"]),
        ("(a) calls/s the provider accepted (first to last)", f"≈ {r}", fmt(lim["rate_seen"])),
        ("(a) held back (`DEPENDENCY_LIMITED` entries)", "-",
         lim["records"]["held_back_entries"]),
        ("(b) no limit, shared backoff: 429s / pauses", "-", f"{bo['n429']} / {bo['pauses']}"),
        ("(b) 429s per pause, max (mean)", "≤ 2",
         f"{bo['max_429_per_pause']} ({bo['mean_429_per_pause']:.2f})"),
        ("(b) most calls in any 1-s window", "-", bo["max_in_1s"]),
        ("(b) attempts spent without a call reaching the provider", "0",
         bo["attempts"]["without_call"]),
        ("(b) attempts after a 429 the operation got itself", "-",
         bo["attempts"]["on_own_rejection"]),
        ("states (a) / (b)", "all succeeded",
         f"{lim['records']['states']} / {bo['records']['states']}"),
        ("seconds (a) / (b)", "-", f"{lim['seconds']:.1f} / {bo['seconds']:.1f}"),
    ]  # fmt: skip
    head = (
        f"## Limits per dependency (issue 28): rate\n\n{res['calls']:,} calls over "
        f"{res['workers']} workers (threads pool, {res['threads']} threads each) to a "
        f"provider that accepts {r} calls in any 1 s ({res['window']}) and answers 429 "
        "`Retry-After: 1` beyond.\n\n"
    )
    return head + report.table(("measure", "target", "result"), rows)


# ---------------------------------------------------------------------------- outage


def outage(url: str, a: argparse.Namespace) -> dict[str, Any]:
    k, window, opened = a.breaker_failures, a.breaker_window, a.breaker_open
    deps = {"down": {"breaker_failures": k, "breaker_window": window, "breaker_open": opened}}
    n, down_s = a.writes, a.seconds
    bound = k + math.ceil(down_s / opened)
    res: dict[str, Any] = {"writes": n, "down_s": down_s, "breaker": deps["down"],
                           "bound": bound, "workers": a.workers, "threads": a.threads,
                           "down_answer": "503 without Retry-After (Unavailable)"}  # fmt: skip
    with stack(url, workers=a.workers, threads=a.threads, dependencies=deps, tag="-out") as st:
        tq = app_for(st)
        st.provider.configure(rate=0)
        st.provider.down(True)
        print(f"outage: provider down {down_s:.0f} s, {n} writes, breaker {deps['down']}")
        done = [0]
        t0 = time.monotonic()
        with Progress("outage", _counts_line(st, done, n)):
            refs = submit_all(tq, "provider_write", [{"dep": "down", "n": i} for i in range(n)])
            time.sleep(max(0.0, down_s - (time.monotonic() - t0)))
            st.provider.down(False)
            print(f"  provider back after {time.monotonic() - t0:.1f} s", flush=True)
            records = wait_all(tq, refs, a.timeout + opened, done)
        s = st.provider.stats()
        res["dep_state"] = dep_state(tq, "down")
    start, end = s["down_periods"][0]
    reqs = s["requests"]
    while_down = [q for q in reqs if start <= q[0] < end]
    # The breaker can hold back only what is claimed after it opened: when its K-th
    # failure was recorded (the ledger's stamp, epoch ms; the provider's clock is the
    # machine's monotonic one). Calls already on their way then reach the provider
    # anyway: with more slots than K, more than K can (at most K + slots - 1). A call
    # is on its way if its attempt was claimed before the breaker opened, whenever it
    # reached the provider (a loaded machine can take tens of ms from claim to call).
    offset = time.time() - time.monotonic()
    opened_at = kth_failure_s(records, k)
    if opened_at is not None:
        opened_at -= offset
    claims = claim_times(records, offset)
    before = [q for q in while_down if claimed_before(claims.get(q[2], ()), q[0], opened_at)]
    commits = s["committed"]
    after = [q[0] for q in reqs if q[0] >= end and q[1] == 200]
    res.update(
        {
            "hits_while_down": len(while_down),
            "hit_times": [round(q[0] - start, 2) for q in while_down],
            "opened_after_s": None if opened_at is None else round(opened_at - start, 3),
            "hits_before_open": len(before),
            "hits_after_open": len(while_down) - len(before),
            "probes_bound": math.ceil(down_s / opened),
            "before_open_bound": k + a.workers * a.threads - 1,
            "writes_committed": sum(commits.values()),
            "refs_committed_once": sum(1 for r in refs if commits.get(r, 0) == 1),
            "refs_committed_twice_or_more": sum(1 for r in refs if commits.get(r, 0) > 1),
            "refs_not_committed": sum(1 for r in refs if commits.get(r, 0) == 0),
            "first_commit_after_s": (min(after) - end) if after else None,
            "last_commit_after_s": (max(after) - end) if after else None,
            "attempts": attempts_check(records, reqs),
            "records": summarize_records(records),
        }
    )
    print(render_outage(res), flush=True)
    return res


def claim_times(records: dict[str, Any], offset: float) -> dict[str, list[float]]:
    """Each operation's claims (its attempts going ``running``), on the provider's
    clock: epoch s minus ``offset``."""
    return {
        ref: sorted(h.at / 1000 - offset for h in rec.history if str(h.to) == "running")
        for ref, rec in records.items()
        if rec is not None
    }


#: A claim stamped up to this much after the call it made reached the provider is
#: still that call's (the two clocks are converted, not shared); an attempt's next
#: claim comes a retry's delay later, seconds.
CLAIM_SLACK_S = 0.05


def claimed_before(claims: Sequence[float], at: float, opened_at: float | None) -> bool:
    """Whether the call that reached the provider at ``at`` was claimed before the
    breaker opened (or it never did): the claim is the latest one at or before it."""
    if opened_at is None:
        return True
    made = [c for c in claims if c <= at + CLAIM_SLACK_S]
    return (max(made) if made else at) < opened_at


def kth_failure_s(records: dict[str, Any], k: int) -> float | None:
    """When (epoch s) the ledger recorded the ``k``-th failed attempt of these
    operations: a breaker of ``k`` failures is open from then (None: fewer)."""
    failed = sorted(
        h.at
        for rec in records.values()
        if rec is not None
        for h in rec.history
        if str(h.from_) == "running" and str(h.to) != "succeeded"
    )
    return failed[k - 1] / 1000 if len(failed) >= k else None


def _times(ts: Sequence[float], most: int = 16) -> str:
    shown = ", ".join(f"{t:g}" for t in ts[:most])
    return shown + (f", ... ({len(ts) - most} more)" if len(ts) > most else "")


def render_outage(res: dict[str, Any]) -> str:
    b = res["breaker"]
    rows = [
        ("calls reaching the provider while down", f"≤ {res['bound']}", res["hits_while_down"]),
        ("... at (s after it went down)", "-", _times(res["hit_times"])),
        ("... before the breaker opened (its failures and the calls already on their way)",
         f"≤ {res['before_open_bound']}", res["hits_before_open"]),
        ("... after it opened, at "
         + ("-" if res["opened_after_s"] is None else f"{res['opened_after_s']:.2f}")
         +
         " s (its probes)", f"≤ {res['probes_bound']}", res["hits_after_open"]),
        ("writes committed exactly once", f"{res['writes']}", res["refs_committed_once"]),
        ("committed twice or more / never", "0 / 0",
         f"{res['refs_committed_twice_or_more']} / {res['refs_not_committed']}"),
        ("states", "all succeeded", res["records"]["states"]),
        ("first / last commit after it came back (s)", "-",
         f"{fmt(res['first_commit_after_s'] or float('nan'))} / "
         f"{fmt(res['last_commit_after_s'] or float('nan'))}"),
        ("attempts per operation", "-", res["records"]["attempts"]),
        ("attempts spent without a call reaching the provider", "0",
         res["attempts"]["without_call"]),
    ]  # fmt: skip
    head = (
        f"## Limits per dependency (issue 28): outage\n\nThe provider answers "
        f"{res['down_answer']} for {res['down_s']:g} s; {res['writes']:,} writes are queued "
        f"then ({res['workers']} workers x {res['threads']} threads). Breaker: "
        f"{b['breaker_failures']} failures in {b['breaker_window']:g} s open it for "
        f"{b['breaker_open']:g} s, then one probe; the bound is {b['breaker_failures']} + "
        f"ceil({res['down_s']:g} / {b['breaker_open']:g}). The breaker opens when "
        f"failure {b['breaker_failures']} in its window is recorded: calls claimed before "
        f"that (up to one a slot) reach the provider anyway, so with more slots than "
        f"{b['breaker_failures']} the bound can be passed by calls already on their way; "
        f"after it opened only its probes may reach it.\n\n"
    )
    return head + report.table(("measure", "target", "result"), rows)


# ---------------------------------------------------------------------------- concurrency


def concurrency(url: str, a: argparse.Namespace) -> dict[str, Any]:
    c, calls, hold, lease = a.concurrency, a.calls, a.hold, a.lease
    deps = {"conc": {"concurrency": c}}
    extra = {"TOOLQ_LEASE__SECONDS": str(lease)}
    res: dict[str, Any] = {"concurrency": c, "calls": calls, "hold_s": hold, "lease_s": lease,
                           "workers": a.workers, "threads": a.threads}  # fmt: skip
    with stack(url, workers=a.workers, threads=a.threads, dependencies=deps,
               extra_env=extra, tag="-conc") as st:  # fmt: skip
        tq = app_for(st)
        st.provider.configure(rate=0)
        print(f"concurrency: {calls} calls held {hold:g} s, concurrency {c}, lease {lease:g} s")
        done = [0]
        kill: dict[str, Any] = {}
        with Progress("concurrency", _counts_line(st, done, calls)):
            refs = submit_all(
                tq, "provider_read", [{"dep": "conc", "n": i, "hold": hold} for i in range(calls)]
            )
            killer = threading.Thread(target=_kill_one, args=(st, a.kill_after, kill), daemon=True)
            killer.start()
            records = wait_all(tq, refs, a.timeout + lease, done)
            killer.join(timeout=5)
        s = st.provider.stats()
        res["dep_state"] = dep_state(tq, "conc")
    curve = s["curve"]
    res["max_in_flight"] = s["max_in_flight"]
    res["kill"] = kill
    if kill.get("at") is not None:
        # The killed worker's calls end at the provider ``hold`` s later at most (it
        # finishes them for nobody); its slots come back when their lease runs out.
        back = next((t for t, n in curve if t > kill["at"] + hold and n >= c), None)
        res["slot_back_after_s"] = None if back is None else back - kill["at"]
        res["in_flight_after_kill_min"] = min(
            (n for t, n in curve if kill["at"] + hold < t < (back or math.inf)), default=None
        )
    res["attempts"] = attempts_check(records, s["requests"])
    res["records"] = summarize_records(records)
    res["seconds"] = (curve[-1][0] - curve[0][0]) if curve else 0.0
    print(render_concurrency(res), flush=True)
    return res


def _kill_one(st: Stack, after: float, out: dict[str, Any]) -> None:
    """SIGKILL a worker while the provider holds one of its calls, ``after`` s in."""
    time.sleep(after)
    by_pid = {w.pid: w for w in st.workers}
    for _ in range(200):
        s = st.provider.stats()
        holding = [(int(p), n) for p, n in s["in_flight_by_pid"].items() if int(p) in by_pid]
        if holding:
            pid, n = holding[0]
            by_pid[pid].kill()
            out.update({"at": st.provider.stats()["now"], "pid": pid, "held": n})
            print(f"  SIGKILLed worker pid {pid} holding {n} call(s)", flush=True)
            return
        time.sleep(0.05)


def render_concurrency(res: dict[str, Any]) -> str:
    k = res.get("kill") or {}
    back = res.get("slot_back_after_s")
    rows = [
        ("most calls the provider held at once", f"≤ {res['concurrency']}",
         res["max_in_flight"]),
        ("worker SIGKILLed holding", "-", f"{k.get('held', '-')} call(s)"),
        ("its slot back (again {} in flight) after".format(res["concurrency"]),
         f"≤ lease ({res['lease_s']:g} s)", "-" if back is None else f"{back:.1f} s"),
        ("states", "all succeeded", res["records"]["states"]),
        ("attempts per operation", "-", res["records"]["attempts"]),
        ("held back (`DEPENDENCY_LIMITED` entries)", "-", res["records"]["held_back_entries"]),
        ("seconds, first to last call", f"≥ {res['calls'] * res['hold_s'] / res['concurrency']:g}",
         f"{res['seconds']:.1f}"),
    ]  # fmt: skip
    head = (
        f"## Limits per dependency (issue 28): concurrency\n\n`concurrency={res['concurrency']}`, "
        f"{res['calls']} calls the provider holds {res['hold_s']:g} s each, {res['workers']} "
        f"workers x {res['threads']} threads, lease {res['lease_s']:g} s; one worker SIGKILLed "
        "while the provider holds a call of its.\n\n"
    )
    return head + report.table(("measure", "target", "result"), rows)


# ---------------------------------------------------------------------------- overhead

SIDES = {
    # name: (tree, app, tool); "base" runs the commit this branch grew from
    "base": ("base", "bench.apps:tq", "noop"),
    "no key": ("here", APP, "noop"),
    "key, no limits": ("here", APP, "noop_keyed"),
    "key, generous rate": ("here", APP, "noop_rated"),
}


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=procs.REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


@contextlib.contextmanager
def base_tree(rev: str) -> Iterator[Path]:
    """A copy of ``rev``'s files (``git archive``), with this tree's load runner in it."""
    tmp = Path(tempfile.mkdtemp(prefix="toolq-limits-base-"))
    try:
        archive = subprocess.run(
            ["git", "archive", rev], cwd=procs.REPO_ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        shutil.copy(procs.REPO_ROOT / "bench" / "limits_load.py", tmp / "bench")
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def overhead(url: str, a: argparse.Namespace) -> dict[str, Any]:
    base = a.base or _git("merge-base", "HEAD", "main")
    db_base = urlunsplit(urlsplit(url)._replace(path="/1"))
    here = _git("rev-parse", "HEAD")
    import redis

    with contextlib.closing(redis.Redis.from_url(db_base)) as rc:
        rc.flushdb()
        server_pid = int(rc.info("server").get("process_id", 0))
    db_base = urlunsplit(urlsplit(url)._replace(path="/1"))
    res: dict[str, Any] = {"base": base, "here": here, "calls": a.calls, "repeats": a.repeats,
                           "threads": a.threads, "client_concurrency": 32,
                           "runs": {s: [] for s in SIDES}}  # fmt: skip
    children: list[procs.Child] = []
    with base_tree(base) as tree:
        try:
            roots = {"base": tree, "here": procs.REPO_ROOT}
            urls = {"base": db_base, "here": url}
            apps = {"base": "bench.apps:tq", "here": APP}
            groups: dict[str, list[procs.Child]] = {}
            for t in ("base", "here"):
                w = procs.toolq_worker(f"limits-ovh-worker-{t}", apps[t], urls[t], pool="threads",
                                       concurrency=a.threads, queues="toolq.calls",
                                       root=roots[t])  # fmt: skip
                sch = procs.toolq_scheduler(f"limits-ovh-sched-{t}", apps[t], urls[t],
                                            root=roots[t])  # fmt: skip
                groups[t] = [w, sch]
                children += groups[t]
            names = list(SIDES)
            print(f"overhead: {base[:8]} vs {here[:8]}, {a.calls} calls x {a.repeats} rounds")
            for r in range(a.repeats):
                order = names[r % len(names) :] + names[: r % len(names)]
                for side in order:
                    t, app, tool = SIDES[side]
                    pids = [ch.pid for ch in groups[t]] + ([server_pid] if server_pid else [])
                    run = _load_run(roots[t], app, tool, urls[t], a.calls, pids)
                    cpu_s = run["pids_cpu_s"] + run["client_cpu_s"]
                    run["cpu_ms_per_call"] = cpu_s * 1000 / a.calls
                    res["runs"][side].append(run)
                    print(f"  round {r + 1}/{a.repeats} {side:20s} {run['rate']:8.1f} calls/s "
                          f"cpu {run['cpu_ms_per_call']:.2f} ms/call "
                          f"(errors {run['errors']}, failures {run['failures']})",
                          flush=True)  # fmt: skip
        finally:
            for ch in children:
                ch.stop()
    med = {s: median([r["rate"] for r in runs]) for s, runs in res["runs"].items()}
    cpu = {s: median([r["cpu_ms_per_call"] for r in runs]) for s, runs in res["runs"].items()}
    res["median_rate"], res["median_cpu_ms"] = med, cpu
    res["ratio_no_key_vs_base"] = med["no key"] / med["base"] if med["base"] else float("nan")
    print(render_overhead(res), flush=True)
    return res


#: Calls each client process makes before it measures (fewer when it measures fewer).
LOAD_WARMUP = 200


def _load_run(
    root: Path, app: str, tool: str, url: str, calls: int, pids: Sequence[int]
) -> dict[str, Any]:
    """One client process's run; ``pids``: the worker and scheduler whose CPU to count."""
    argv = [sys.executable, "-m", "bench.limits_load", "--app", app, "--tool", tool,
            "--url", url, "--calls", str(calls), "--warmup", str(min(LOAD_WARMUP, calls)),
            "--pids", ",".join(map(str, pids))]  # fmt: skip
    out = subprocess.run(
        argv, cwd=root, env=procs.child_env(None, root), capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"load run failed ({root}):\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def render_overhead(res: dict[str, Any]) -> str:
    med, cpu = res["median_rate"], res["median_cpu_ms"]
    rows = []
    for side in SIDES:
        runs = res["runs"][side]
        rates = [r["rate"] for r in runs]
        rows.append(
            (side, f"{fmt(med[side])} ({fmt(min(rates))}-{fmt(max(rates))})",
             f"{med[side] / med['no key']:.2f}" if med["no key"] else "-",
             f"{cpu[side]:.2f}", f"{cpu[side] - cpu['no key']:+.2f}")
        )  # fmt: skip
    head = (
        f"## Limits per dependency (issue 28): overhead\n\nThe no-op load, closed loop, 32 "
        f"client threads in a client process per run, one worker (threads pool, "
        f"{res['threads']} threads) and a scheduler per tree; {res['calls']:,} calls x "
        f"{res['repeats']} rounds, the four sides interleaved (order rotated each round); "
        f"medians (min-max). `base` is `{res['base'][:8]}` (`--base`; by default where this "
        "branch left main, before issue 28), the others "
        f"this tree (`{res['here'][:8]}`). CPU: worker + scheduler + client process + "
        "server, per call. "
        "Indicative only: 2 noisy CPUs shared with other jobs.\n\n"
        f"**no key / base: {res['ratio_no_key_vs_base']:.2f}** (target ≥ 0.9).\n\n"
    )
    return head + report.table(
        ("side", "calls/s", "vs no key", "CPU ms/call", "CPU vs no key"), rows
    )


# ---------------------------------------------------------------------------- main

QUICK: dict[str, dict[str, Any]] = {
    # the key below the provider's rate: at equal rates a call's jitter between its claim
    # and its request can put rate + 1 in the provider's window (a 429), see RESULTS.md
    "rate": {"calls": 12, "rate": 3, "key_rate": 2.0, "workers": 2, "threads": 4},
    "outage": {"writes": 12, "seconds": 6.0, "breaker_failures": 3, "breaker_window": 10.0,
               "breaker_open": 2.0, "workers": 2, "threads": 4},
    "concurrency": {"calls": 12, "concurrency": 2, "hold": 0.5, "lease": 3.0, "workers": 2,
                    "threads": 4, "kill_after": 1.0},
    "overhead": {"calls": 50, "repeats": 1, "threads": 4},
}  # fmt: skip

FULL: dict[str, dict[str, Any]] = {
    "rate": {"calls": 2000, "rate": 20, "key_rate": None, "workers": 4, "threads": 8},
    "outage": {"writes": 500, "seconds": 60.0, "breaker_failures": 5, "breaker_window": 30.0,
               "breaker_open": 30.0, "workers": 4, "threads": 8},
    "concurrency": {"calls": 200, "concurrency": 5, "hold": 1.0, "lease": 15.0, "workers": 4,
                    "threads": 8, "kill_after": 10.0},
    "overhead": {"calls": 3000, "repeats": 5, "threads": 8},
}  # fmt: skip

RENDER = {
    "rate": render_rate,
    "outage": render_outage,
    "concurrency": render_concurrency,
    "overhead": render_overhead,
}
RUN = {"rate": rate, "outage": outage, "concurrency": concurrency, "overhead": overhead}


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench limits", description=__doc__.split("\n")[0])
    ap.add_argument("scenario", nargs="?", default="all", choices=("all", *SCENARIOS))
    ap.add_argument("--quick", action="store_true", help="tiny sizes (seconds, for CI)")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--calls", type=int, help="rate: 2000; concurrency: 200; overhead: 3000")
    ap.add_argument("--writes", type=int, help="outage: queued writes (500)")
    ap.add_argument("--seconds", type=float, help="outage: how long the provider is down (60)")
    ap.add_argument("--workers", type=int, help="worker processes (4)")
    ap.add_argument("--threads", type=int, help="threads per worker (8)")
    ap.add_argument("--rate", type=int, help="rate: the provider's and the key's calls/s (20)")
    ap.add_argument("--key-rate", type=float, help="rate: the key's calls/s (default: --rate)")
    ap.add_argument("--concurrency", type=int, help="concurrency: the key's limit (5)")
    ap.add_argument("--hold", type=float, help="concurrency: seconds per call (1)")
    ap.add_argument("--lease", type=float, help="concurrency: the workers' lease, s (15)")
    ap.add_argument("--kill-after", type=float, help="concurrency: SIGKILL a worker after (10 s)")
    ap.add_argument("--breaker-failures", type=int, help="outage (5)")
    ap.add_argument("--breaker-window", type=float, help="outage, s (30)")
    ap.add_argument("--breaker-open", type=float, help="outage, s (30)")
    ap.add_argument("--repeats", type=int, help="overhead: rounds (5)")
    ap.add_argument("--base", default=None, help="overhead: the commit to compare with")
    ap.add_argument("--timeout", type=float, default=None, help="most seconds to wait for calls")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw result here")
    ap.add_argument("--no-report", action="store_true", help="leave RESULTS.md and results/")
    return ap.parse_args(argv)


def _fill(a: argparse.Namespace, scenario: str) -> argparse.Namespace:
    sizes = (QUICK if a.quick else FULL)[scenario]
    b = argparse.Namespace(**vars(a))
    for k, v in sizes.items():
        if getattr(b, k, None) is None:
            setattr(b, k, v)
    if b.timeout is None:
        b.timeout = 120.0 if a.quick else 900.0
    return b


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # unwinds every context manager: children are stopped

    signal.signal(signal.SIGTERM, on_term)
    scenarios = list(SCENARIOS) if a.scenario == "all" else [a.scenario]
    out: dict[str, Any] = {}
    with server(a.redis_url, appendonly=False) as srv:
        for sc in scenarios:
            srv.flush()
            b = _fill(a, sc)
            res = RUN[sc](srv.url, b)
            res["quick"] = bool(a.quick)
            out[sc] = res
            if not a.no_report:
                report.update(f"limits-{sc}", RENDER[sc](res), res)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
