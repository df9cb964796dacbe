"""bench/server_ablation.py's variants still fit the scripts (issue 14): every edit
matches the current Lua exactly once, a variant is loaded under a name of its own
and runs, and the module is itself again afterwards. On fakeredis' Lua, no server."""

from __future__ import annotations

import fakeredis
import pytest

from bench import server_ablation as ab
from tests.contract.ops import NOW, history, submit
from toolq.adapters.ledger import Ledger, scripts
from toolq.core.states import State
from toolq.decisions.recovery.transition import Transition


def test_with_no_edits_the_name_is_the_shipped_librarys() -> None:
    # The bench names a variant's library as the module names its own: if the module
    # changes how, a variant would load under a name FCALL does not call.
    assert ab.library_name() == scripts.LIBRARY


@pytest.mark.parametrize("variant", ab.VARIANTS, ids=lambda v: v.name)
def test_each_edit_matches_the_scripts_once_and_changes_the_library(variant: ab.Variant) -> None:
    shipped = {name: getattr(scripts, name) for name in (*ab.TEXTS, "LIBRARY")}
    texts = ab.edited(variant)  # raises when an edit matches 0 or 2+ times
    assert (texts == {n: shipped[n] for n in ab.TEXTS}) == (variant.name == "baseline")
    with ab.loaded_as(variant) as name:
        assert scripts.function_name("submit") == f"{name}_submit"
        assert (name == shipped["LIBRARY"]) == (variant.name == "baseline")
        for e in variant.edits:
            assert e.old not in scripts.library() or e.new.endswith(e.old)
    assert {name: getattr(scripts, name) for name in shipped} == shipped


def test_an_edit_that_no_longer_matches_is_refused() -> None:
    stale = ab.Variant("stale", "", (ab.Edit("CLAIM", "redis.call('NOPE')", ""),))
    with pytest.raises(AssertionError, match="holds 0"):
        ab.edited(stale)


@pytest.mark.parametrize("variant", ab.VARIANTS, ids=lambda v: v.name)
def test_each_variant_loads_and_runs_a_call_dropping_only_its_piece(
    fake_redis: fakeredis.FakeRedis, variant: ab.Variant
) -> None:
    with ab.loaded_as(variant):
        ledger = Ledger(fake_redis, prefix="p")
        steps = fake_redis.pubsub()
        steps.ssubscribe(ledger.keys.notify_steps)
        assert submit(ledger, "a/1").outcome == "created"
        claim = ledger.claim("a/1", 1, "w1", NOW + 1, 30_000, "run")
        assert claim.outcome == "claimed"
        due = fake_redis.zscore(ledger.keys.due, "a/1")
        done = Transition(
            ref="a/1", states=(State.RUNNING,), to=State.SUCCEEDED, by="w1",
            remove_due=True, stats=("succeeded",),
        )  # fmt: skip
        assert ledger.apply_one(done, NOW + 2) == "ok"
    keys, gone = ledger.keys, set(variant.edits)
    heard = []
    for _ in range(5):  # the subscribe confirmation reads as None too
        if (m := steps.get_sharded_message(ignore_subscribe_messages=True)) is not None:
            heard.append(m["data"].split(b" ")[0])
    steps.close()
    assert heard == ([] if ab.NO_STEPS[0] in gone else [b"queued", b"running"])
    assert fake_redis.hget(keys.op("a/1"), "state") == b"succeeded"
    assert (len(history(ledger, "a/1")) == 3) == (ab.NO_HISTORY[0] not in gone)
    assert fake_redis.exists(keys.index("send", "succeeded")) == (ab.NO_INDEXES[0] not in gone)
    assert fake_redis.exists(keys.stats) == (ab.NO_STATS[0] not in gone)
    # the claim's lease in the due set: its score, or SUBMIT's (the unclaimed check) left
    assert (due == NOW + 1 + 30_000) == (ab.NO_LEASE_DUE[0] not in gone)
