"""``toolq up`` restarts a child that exits and gives up only on a crash loop
(toolq.process.supervise, the decision; toolq.edges.cli.stack.Supervisor, its use)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from toolq.edges.cli.stack import Supervisor
from toolq.process.supervise import Action, ChildRecord, RestartPolicy

NOW = 1000.0

# The table of the module docstring, row by row: exits (seconds before NOW, this one
# last), then the decision and its delay.
TABLE = [
    ([0], Action.RESTART, 0.5),
    ([1, 0], Action.RESTART, 1.0),
    ([2, 1, 0], Action.RESTART, 2.0),
    ([3, 2, 1, 0], Action.RESTART, 4.0),
    ([4, 3, 2, 1, 0], Action.GIVE_UP, 0.0),  # 5 exits in 60 s: a crash loop
    ([59, 40, 20, 10, 0], Action.GIVE_UP, 0.0),
    ([70, 65, 62, 61, 0], Action.RESTART, 0.5),  # the earlier ones are past the window
    ([120, 90, 61, 30, 0], Action.RESTART, 1.0),  # two within it
    ([], Action.RESTART, 0.5),  # no history given: this exit counts
]


@pytest.mark.parametrize(("ago", "action", "delay"), TABLE)
def test_restart_policy_table(ago: list[float], action: Action, delay: float) -> None:
    d = RestartPolicy().decide([NOW - a for a in ago], NOW)
    assert (d.action, d.delay) == (action, delay)


def test_the_backoff_is_capped() -> None:
    policy = RestartPolicy(loop_exits=20)
    delays = [policy.decide([NOW] * n, NOW).delay for n in range(1, 10)]
    assert delays == [0.5, 1, 2, 4, 8, 10, 10, 10, 10]


# ----------------------------------------------------------------- the supervisor's use


@dataclass
class FakePopen:
    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


@dataclass
class FakeChild:
    name: str
    popen: FakePopen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self.popen.returncode is None


@dataclass
class FakeStack:
    children: list[FakeChild]
    restarted: list[str] = field(default_factory=list)
    reaped: list[str] = field(default_factory=list)
    next_pid: int = 500

    def restart(self, child: FakeChild) -> int:
        self.restarted.append(child.name)
        self.next_pid += 1
        child.popen = FakePopen(self.next_pid)
        return self.next_pid

    def supervised(self) -> list[FakeChild]:
        return self.children

    def reap(self, child: FakeChild) -> None:
        self.reaped.append(child.name)


def _supervisor() -> tuple[Supervisor, FakeStack, list[dict[str, Any]]]:
    stack = FakeStack([FakeChild("calls-1", FakePopen(10)), FakeChild("api", FakePopen(11))])
    saved: list[dict[str, Any]] = []
    return Supervisor(stack, saved.append), stack, saved


def test_a_child_that_exits_is_restarted_after_the_delay_and_recorded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sup, stack, _ = _supervisor()
    stack.children[0].popen.returncode = -9

    assert sup.step(NOW)
    rec = sup.records["calls-1"]
    assert (rec.state, rec.last_exit_code, rec.restarts) == ("restarting", -9, 0)
    assert capsys.readouterr().err.strip() == (
        "toolq up: calls-1 exited (code -9); restarting in 0.5 s (restart 1)"
    )
    assert not sup.step(NOW + 0.4) and stack.restarted == []  # not before its delay

    assert sup.step(NOW + 0.5)
    assert stack.restarted == ["calls-1"]
    assert sup.records["calls-1"].as_json() | {"last_exit_at": None} == {
        "pid": 501,
        "state": "running",
        "restarts": 1,
        "last_exit_code": -9,
        "last_exit_at": None,
    }
    assert sup.records["api"].state == "running"  # the rest was never touched


def test_a_crash_loop_fails_that_child_only(capsys: pytest.CaptureFixture[str]) -> None:
    sup, stack, _ = _supervisor()
    now = NOW
    for _ in range(4):
        stack.children[0].popen.returncode = 1
        sup.step(now)
        now += 10
        sup.step(now)
    assert sup.records["calls-1"].restarts == 4
    stack.children[0].popen.returncode = 1
    sup.step(now)  # the fifth exit within 60 s

    assert sup.records["calls-1"].state == "failed"
    assert stack.reaped == ["calls-1"]
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "toolq up: calls-1 exited (code 1), 5 times in 60 s; not restarting it again "
        "(see its errors above); the rest keeps serving"
    )
    assert not sup.step(now + 100) and stack.restarted.count("calls-1") == 4
    assert sup.records["api"].state == "running"


def test_records_are_saved_as_the_state_file_holds_them() -> None:
    sup, _, saved = _supervisor()
    sup.save()
    assert saved == [
        {
            "calls-1": ChildRecord("calls-1", 10).as_json(),
            "api": ChildRecord("api", 11).as_json(),
        }
    ]


def test_a_child_that_cannot_be_started_again_counts_as_an_exit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sup, stack, _ = _supervisor()

    def no_fork(child: FakeChild) -> int:
        raise OSError(24, "Too many open files")

    stack.restart = no_fork  # type: ignore[method-assign]
    stack.children[0].popen.returncode = -9
    sup.step(NOW)
    sup.step(NOW + 0.5)
    rec = sup.records["calls-1"]
    assert (rec.state, rec.restarts, len(rec.exits)) == ("restarting", 1, 2)
    err = capsys.readouterr().err
    assert "toolq up: cannot start calls-1 again (OSError: Too many open files)" in err
    assert "restarting in 1 s (restart 2)" in err
