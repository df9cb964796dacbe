"""Running in the foreground: Ctrl-C and SIGTERM (:class:`Interrupts`), and restarting
the children of ``toolq up`` that exit (:class:`Supervisor`)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import click

from toolq.core.errors import ToolqError
from toolq.process.supervise import Action, ChildRecord, RestartPolicy


class Interrupts:
    """The first SIGINT or SIGTERM raises KeyboardInterrupt (so ``finally`` stops the stack);
    a later one, while stopping, calls ``hurry`` instead of cutting the stop short."""

    def __init__(self, hurry: Callable[[], None] | None = None) -> None:
        self.hurry = hurry
        self.fired = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        if self.hurry is not None:
            self.hurry()

    def __enter__(self) -> Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Supervisor:
    """Restart each child of ``stack`` that exits, as :class:`RestartPolicy` decides, and
    give up on one in a crash loop while the rest keeps serving. ``save`` is handed each
    child's record (:class:`ChildRecord`) after every change: ``toolq status`` reads them
    from the state file."""

    def __init__(
        self,
        stack: Any,
        save: Callable[[dict[str, Any]], object],
        policy: RestartPolicy | None = None,
        poll: float = 0.2,
    ) -> None:
        self.stack = stack
        self.policy = policy or RestartPolicy()
        self.poll = poll
        self._save = save
        self.records = {c.name: ChildRecord(c.name, c.pid) for c in stack.supervised()}
        self._due: dict[str, float] = {}  # child name -> when to start it again

    def save(self) -> None:
        self._save({name: r.as_json() for name, r in self.records.items()})

    def run(self) -> int:
        """Until interrupted (KeyboardInterrupt); 1 when every child has failed."""
        while True:
            if self.step(time.monotonic()):
                self.save()
            if all(r.state == "failed" for r in self.records.values()):
                click.echo("toolq up: every process has failed; stopping", err=True)
                return 1
            time.sleep(self.poll)

    def step(self, now: float) -> bool:
        """Look at every child once; whether a record changed."""
        changed = False
        for child in self.stack.supervised():
            rec = self.records[child.name]
            if rec.state == "running" and child.popen is not None and not child.running:
                self._exited(child, rec, now)
                changed = True
            elif rec.state == "restarting" and now >= self._due[child.name]:
                rec.restarts += 1
                rec.state = "running"
                changed = True
                try:
                    rec.pid = self.stack.restart(child)
                except (OSError, ToolqError) as exc:  # no fork, no log file, no PING:
                    why = getattr(exc, "strerror", None) or exc  # an exit like any other
                    click.echo(
                        f"toolq up: cannot start {child.name} again ({type(exc).__name__}: {why})",
                        err=True,
                    )
                    self._exited(child, rec, now)
        return changed

    def _exited(self, child: Any, rec: ChildRecord, now: float) -> None:
        code = child.popen.returncode
        rec.exited(code, now, time.time())
        decision = self.policy.decide(rec.exits, now)
        if decision.action is Action.GIVE_UP:
            rec.state = "failed"
            self.stack.reap(child)  # what is left of its process group
            click.echo(
                f"toolq up: {child.name} exited (code {code}), {decision.recent} times in "
                f"{self.policy.window:g} s; not restarting it again (see its errors above); "
                "the rest keeps serving",
                err=True,
            )
            return
        rec.state = "restarting"
        self._due[child.name] = now + decision.delay
        click.echo(
            f"toolq up: {child.name} exited (code {code}); restarting in "
            f"{decision.delay:g} s (restart {rec.restarts + 1})",
            err=True,
        )
