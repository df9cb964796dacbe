"""Limits per dependency, the pure parts (issue 28): the declaration's lookup and merge,
and the limiter's decisions as tables (toolq.decisions.deps; the scripts follow them:
tests/contract/test_deps_scripts.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from toolq.core import errors
from toolq.core.cells import cell_of
from toolq.core.deps import (
    DEFAULT_LIMITS,
    Limits,
    dep_cell,
    limits_for,
    limits_row,
    limits_table,
    merged,
)
from toolq.core.settings import ToolqSettings
from toolq.core.states import State
from toolq.core.tools import ToolOptions
from toolq.decisions.deps import DepState, admit, after_outcome, hold_due, signal_of
from toolq.decisions.recovery.actions import for_decision
from toolq.decisions.recovery.moves import Messages, Policy
from toolq.decisions.recovery.policy import Action, Decision, Snapshot, Timeouts, decide

NOW = 1_000_000


def test_a_key_uses_its_own_limits_else_its_heads_else_the_defaults() -> None:
    declared = {"stripe": Limits(rate="20/s"), "stripe:big": Limits(rate="50/s")}
    assert limits_for("stripe", declared) == ("stripe", declared["stripe"])
    assert limits_for("stripe:acct_1", declared) == ("stripe", declared["stripe"])
    assert limits_for("stripe:big", declared) == ("stripe:big", declared["stripe:big"])
    assert limits_for("email", declared) == (None, DEFAULT_LIMITS)


def test_settings_win_field_by_field_over_code() -> None:
    code = Limits(rate="20/s", concurrency=5)
    settings = ToolqSettings.model_validate({"dependencies": {"stripe": {"rate": "5/s"}}})
    got = merged(code, settings.dependencies["stripe"])
    assert (got.rate, got.concurrency) == ("5/s", 5)
    assert merged(None, None) == DEFAULT_LIMITS


def test_the_settings_refuse_a_bad_key_or_rate() -> None:
    with pytest.raises(ValueError, match="dependency key"):
        ToolqSettings.model_validate({"dependencies": {"a b": {}}})
    with pytest.raises(ValueError, match="rate"):
        ToolqSettings.model_validate({"dependencies": {"k": {"rate": "fast"}}})


def test_the_env_variable_declares_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLQ_DEPENDENCIES", '{"stripe": {"rate": "20/s", "concurrency": 5}}')
    assert ToolqSettings().dependencies == {"stripe": Limits(rate="20/s", concurrency=5)}


def test_the_scripts_table() -> None:
    assert limits_table({}) == ""
    assert limits_table({"s": Limits(rate="20/s", burst=3)}) == (
        '{"s":["20/s",50.0,3,0,5,30000,30000]}'
    )


def test_a_tools_dependency_option_is_a_key_or_a_function() -> None:
    assert ToolOptions.parse({"dependency": "stripe"}).dependency == "stripe"
    assert callable(ToolOptions.parse({"dependency": lambda a: "x"}).dependency)
    with pytest.raises(ValueError, match="dependency"):
        ToolOptions.parse({"dependency": "a b"})
    with pytest.raises(ValueError, match="dependency"):
        ToolOptions.parse({"dependency": 3})


@pytest.mark.parametrize("key", ["stripe", "stripe:acct_1", "a", "x" * 100])
@pytest.mark.parametrize("cells", [1, 7, 256])
def test_the_dep_cell_is_the_cells_hash(key: str, cells: int) -> None:
    assert dep_cell(key, cells) == cell_of(key, cells)


def _admit(s: DepState, slot: int | None = None, **kw: int) -> tuple[str | None, int]:
    args = {"interval_ms": 100, "burst": 1, "concurrency": 0} | kw
    a = admit(s, ref="r", now=NOW, lease_ms=1_000, live_slots=[("a", NOW + 5), ("b", NOW + 9)],
              slot=slot, **args)  # fmt: skip
    return a.reason, a.not_before


@pytest.mark.parametrize(
    ("state", "slot", "kw", "want"),
    [
        (DepState(), None, {}, (None, 0)),
        (DepState(paused_until=NOW + 5), None, {}, ("paused", NOW + 5)),
        (DepState(breaker="open", open_until=NOW + 7), None, {}, ("breaker_open", NOW + 7)),
        (DepState(breaker="open", open_until=NOW), None, {}, (None, 0)),
        (DepState(breaker="half_open", probe="x", probe_until=NOW + 3), None, {},
         ("half_open", NOW + 3)),
        (DepState(breaker="half_open", probe="r", probe_until=NOW + 3), None, {}, (None, 0)),
        (DepState(), None, {"concurrency": 2}, ("concurrency", NOW + 5)),
        (DepState(), None, {"concurrency": 3}, (None, 0)),
        (DepState(tat=NOW + 100), None, {}, ("rate", NOW + 100)),
        (DepState(tat=NOW + 100), None, {"burst": 2}, (None, 0)),
        (DepState(tat=NOW + 500), NOW, {}, (None, 0)),  # its reserved slot
        (DepState(tat=NOW + 500), NOW + 300, {}, ("rate", NOW + 300)),  # too early
        (DepState(tat=NOW + 500, atat=NOW + 50), NOW, {}, ("rate", NOW + 500)),  # late comer
        (DepState(tat=NOW + 500), NOW - 10_000, {}, ("rate", NOW + 500)),  # stale slot
        # a pause over: the first call probes alone, the others wait for its lease
        (DepState(paused_until=NOW - 1, resume=True), None, {}, (None, 0)),
        (DepState(resume=True, probe="x", probe_until=NOW + 3), None, {}, ("paused", NOW + 3)),
        (DepState(resume=True, probe="x", probe_until=NOW - 1), None, {}, (None, 0)),
    ],
)  # fmt: skip
def test_admission(state: DepState, slot: int | None, kw: dict[str, int], want: object) -> None:
    assert _admit(state, slot, **kw) == want


def test_a_call_over_the_rate_reserves_and_moves_the_schedule_on() -> None:
    a = admit(DepState(tat=NOW + 100), ref="r", now=NOW, lease_ms=1, interval_ms=100, burst=1,
              concurrency=0, live_slots=[], slot=None)  # fmt: skip
    assert (a.reason, a.reserve, a.state.tat) == ("rate", NOW + 100, NOW + 200)
    ok = admit(DepState(), ref="r", now=NOW, lease_ms=1, interval_ms=100, burst=1,
               concurrency=0, live_slots=[], slot=None)  # fmt: skip
    assert (ok.reason, ok.state.tat, ok.state.atat) == (None, NOW + 100, NOW + 100)


def test_the_half_open_probe_is_recorded() -> None:
    a = admit(DepState(breaker="open", open_until=NOW - 1), ref="p", now=NOW, lease_ms=500,
              interval_ms=0, burst=1, concurrency=0, live_slots=[], slot=None)  # fmt: skip
    assert (a.reason, a.probe, a.state.probe, a.state.probe_until) == (None, True, "p", NOW + 500)


@pytest.mark.parametrize(
    ("exc", "signal"),
    [
        (errors.RateLimited(retry_after=1), "pause"),
        (errors.Unavailable(), "down"),
        (errors.OutcomeUnknown(), "failure"),
        (TimeoutError(), "failure"),
        (errors.NotFound(), None),
        (ValueError(), None),
    ],
)
def test_which_outcome_tells_the_key_what(exc: BaseException, signal: str | None) -> None:
    assert signal_of(exc) == signal


BR = {"breaker_failures": 2, "breaker_window_ms": 1_000, "breaker_open_ms": 5_000}


@pytest.mark.parametrize(
    ("state", "signal", "succeeded", "want"),
    [
        (DepState(), "pause", False, DepState(paused_until=NOW + 9, resume=True)),
        (DepState(paused_until=NOW + 20), "pause", False,
         DepState(paused_until=NOW + 20, resume=True)),
        (DepState(), "down", False,
         DepState(paused_until=NOW + 9, fails=1, fails_since=NOW, resume=True)),
        # the probe after a pause: its success ends the pause's watch, a 429 keeps it
        (DepState(resume=True, probe="r"), None, True, DepState()),
        (DepState(resume=True, probe="r"), "pause", False,
         DepState(paused_until=NOW + 9, resume=True)),
        (DepState(resume=True, probe="other"), None, True, DepState(resume=True, probe="other")),
        (DepState(fails=1, fails_since=NOW - 10), "failure", False,
         DepState(fails=2, fails_since=NOW - 10, breaker="open", open_until=NOW + 5_000)),
        (DepState(fails=1, fails_since=NOW - 5_000), "failure", False,
         DepState(fails=1, fails_since=NOW)),  # the window passed: counting starts again
        (DepState(breaker="half_open", probe="r"), None, True, DepState()),
        (DepState(breaker="half_open", probe="r"), "failure", False,
         DepState(breaker="open", open_until=NOW + 5_000)),
        (DepState(breaker="half_open", probe="other"), None, True,
         DepState(breaker="half_open", probe="other")),
        (DepState(fails=1, fails_since=NOW), None, True, DepState(fails=1, fails_since=NOW)),
    ],
)  # fmt: skip
def test_after_an_outcome(
    state: DepState, signal: str | None, succeeded: bool, want: DepState
) -> None:
    got = after_outcome(state, ref="r", now=NOW, signal=signal, due=NOW + 9,  # type: ignore[arg-type]
                        succeeded=succeeded, **BR)  # fmt: skip
    assert got == want


@pytest.mark.parametrize(
    ("nb", "reason", "frac", "deadline", "want"),
    [
        (NOW + 100, "rate", 0.9, 0, NOW + 100),  # reserved slots are spaced already
        (NOW + 10_000, "paused", 0.5, 0, NOW + 10_000 + 1_000),
        (NOW + 10, "concurrency", 0.5, 0, NOW + 10 + 50),  # at least 100 ms of spread
        (NOW + 100_000, "breaker_open", 0.999, 0, NOW + 100_000 + 4_995),  # at most 5 s
        (NOW + 10_000, "paused", 0.5, NOW + 5_000, NOW + 5_001),  # wakes for the deadline
    ],
)
def test_when_a_held_call_comes_back(
    nb: int, reason: str, frac: float, deadline: int, want: int
) -> None:
    assert hold_due(nb, NOW, reason, frac, deadline) == want  # type: ignore[arg-type]


def test_a_replaced_state_is_a_new_one() -> None:
    s = DepState()
    assert replace(s, tat=1) != s


def _readme_section() -> str:
    from tests.helpers import REPO_ROOT

    text = (REPO_ROOT / "README.md").read_text()
    start = text.index("## Limits per dependency")
    return text[start : text.index("\n## ", start + 1)]


def test_the_readmes_example_declares_what_it_says() -> None:
    """The README's "Limits per dependency" example, run as written."""
    import re

    section = _readme_section()
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None
    scope: dict[str, object] = {}
    exec(compile(found.group(1), "README.md", "exec"), scope)
    tq = scope["tq"]
    assert tq.app.registry.limits == {"stripe": Limits(rate="20/s", concurrency=5)}  # type: ignore[attr-defined]
    op = tq.app.new_operation("charge", {"account": "acct_1", "cents": 5})  # type: ignore[attr-defined]
    assert op.extra == (("dep", "stripe:acct_1"),)


def test_the_readmes_settings_line_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    found = re.search(r"TOOLQ_DEPENDENCIES='([^']*)'", _readme_section())
    assert found is not None
    monkeypatch.setenv("TOOLQ_DEPENDENCIES", found.group(1))
    assert ToolqSettings().dependencies == {"stripe": Limits(rate="5/s")}


def _held(**kw: int) -> Snapshot:
    base = dict(ref="r", state=State.WAITING_RETRY, tool="t", attempt=3, max_attempts=3,
                deadline_ms=0, lease_until_ms=0, entered_ms=NOW, vlease_until_ms=0, vholder="",
                vcheck=0, retry_due_ms=NOW + 50_000, repubs=2, rev=7, dep_held="rate")  # fmt: skip
    base.update(kw)
    return Snapshot(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("snap", "action", "code"),
    [
        # its last attempt, not spent: sent again (its due, not retry_due, says when)
        (_held(), Action.RELEASE, None),
        (_held(deadline_ms=NOW - 1), Action.ESCALATE, "DEADLINE_EXCEEDED"),
    ],
)
def test_the_scheduler_sends_a_held_call_again_with_the_same_attempt(
    snap: Snapshot, action: Action, code: str | None
) -> None:
    t = Timeouts(1_000, 60_000, 60_000)
    assert decide(snap, NOW, t) == Decision(action, code=code)


def test_a_release_republishes_the_same_attempt_and_clears_the_hold() -> None:
    s = _held()
    policy = Policy(1_000, 60_000, 60_000, 3_600)
    messages = Messages(run=lambda ref, n: ("q", f"{ref}#{n}"), verify=lambda r, a, v: ("v", ""))
    t = for_decision(Decision(Action.RELEASE), s, None, "", NOW, policy, messages)
    assert t is not None
    assert (t.to, t.attempt_incr, t.push, t.delete) == (
        State.QUEUED,
        0,
        ("q", "r#3"),
        ("dep_held",),
    )
    assert t.expect == {"*": {"rev": "7"}}


@pytest.mark.parametrize(
    ("limits", "share", "row"),
    [
        (Limits(rate="20/s", burst=4, concurrency=8), 1, [50.0, 4, 8]),
        (Limits(rate="20/s", burst=4, concurrency=8), 4, [200.0, 1, 2]),
        (Limits(rate="20/s", concurrency=5), 16, [800.0, 1, 1]),  # one per cell at least
        (Limits(), 4, [0, 1, 0]),
    ],
)
def test_each_cell_gets_its_share_of_a_keys_limits(
    limits: Limits, share: int, row: list[object]
) -> None:
    # cells mode: the cells limit a key's calls each on its own, so each gets a share
    got = limits_row(limits, share)
    assert [got[1], got[2], got[3]] == row
