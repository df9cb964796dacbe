"""``toolq demo`` end to end: the README's first command, at a size that fits a test."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO_ROOT, toolq_env
from toolq.edges.demo import SCENARIOS


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolq.edges.cli", "demo", "--ops", "12", "--timeout", "90", *args],
        cwd=REPO_ROOT,
        env=toolq_env(unset=("TOOLQ_STATE_DIR", "TOOLQ_APP")),
        capture_output=True,
        text=True,
        timeout=110,
    )


def test_demo_exits_0_with_exactly_one_side_effect_per_succeeded_write() -> None:
    res = _demo("--json")
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    effects = report["side_effects"]

    # Exactly one side effect at the provider per succeeded write, and none elsewhere
    assert report["ok"] is True
    assert effects["succeeded_writes"] > 0
    assert effects["exactly_one"] == effects["succeeded_writes"]
    assert effects["violations"] == []
    assert effects["total"] == effects["succeeded_writes"]
    assert report["unfinished"] == []
    # toolq never re-sent a committed write: the provider had nothing to deduplicate
    assert report["duplicates_prevented"]["provider_replays"] == 0

    # The misbehaviour happened and was recovered from
    assert report["worker_killed"]["final_state"] == "succeeded"
    unknowns = report["unknowns"]
    assert unknowns["causes"].get("LEASE_EXPIRED", 0) >= 1  # the SIGKILLed worker
    # crash, lost reply, timeout before commit (the kill may catch the last two first)
    assert sum(unknowns["causes"].values()) >= 3
    assert unknowns["found_committed"] >= 2
    assert unknowns["not_found_redispatched"] >= 1
    assert report["escalations"] == {"create_invoice": 1}
    assert set(report["by_state"]) == {"succeeded", "failed", "escalated"}
    actions = report["agent_actions"]
    assert actions.pop("redeliveries_injected") >= 1
    assert actions == {"approved": 1, "inputs_corrected": 1, "reread_after_conflict": 1}
    # A message delivered again (as past Redis's visibility timeout) never reached the tool
    assert report["duplicates_prevented"]["ledger_refused_deliveries"] >= 1
    assert report["pending_recovery_s"]["p95"] >= report["pending_recovery_s"]["p50"] > 0

    # Every scenario of the workload ran, and every operation it submitted finished
    scenarios = report["scenarios"]
    assert set(scenarios) == set(SCENARIOS) | {"read", "conflict_reread"}
    assert report["operations"] == sum(scenarios.values())
    assert sum(report["by_state"].values()) == report["operations"]


def test_demo_holds_without_the_providers_dedup_and_prints_a_report() -> None:
    # Without the provider's idempotency key check, only toolq prevents duplicates.
    res = _demo("--no-provider-dedup", "--seed", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "RESULT: OK" in res.stdout
    assert "with exactly one side effect" in res.stdout
    assert "SIGKILL calls-" in res.stderr  # progress goes to stderr
    assert "succeeded" in res.stderr
    # The demo starts its workers and scheduler itself: it waits for them instead of
    # warning that none is live (every run's first screen said so)
    assert "no live" not in res.stderr, res.stderr
    assert res.stderr.count("starting the scheduler and workers") == 1
