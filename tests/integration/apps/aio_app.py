"""Tools for ``tests/integration/test_aio.py`` (the async client) and ``bench/aio_bench.py``.

A tool that must still be running at some point of a test waits on a gate
file (``gate``): the test opens it when it is ready, with no timing guess, and
the gate works while Redis itself is being restarted.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from toolq import CallContext, ToolQueue
from toolq.core.settings import LeaseSettings, ToolqSettings

#: How long a gated tool waits for its gate before giving up (a test that forgot it).
GATE_PATIENCE_S = 60.0


def make() -> ToolQueue:
    """A ToolQueue with this module's tools (a test on a server of its own makes one)."""
    q = ToolQueue(settings=ToolqSettings(lease=LeaseSettings(seconds=5.0)))

    @q.tool(writes=False)
    def sleepy(args: Nap) -> dict[str, float]:
        """Sleep, then answer: a stand-in for an I/O-bound call."""
        time.sleep(args.seconds)
        return {"slept": args.seconds}

    @q.tool(writes=False)
    def gated(args: Gate, ctx: CallContext) -> dict[str, str]:
        """Wait for the gate file, report the progress steps, then answer."""
        _wait_for(Path(args.gate))
        for i, fraction in enumerate(args.steps):
            if i:
                # Past the publisher's rate limit (0.1 s), so that every step travels.
                time.sleep(0.15)
            ctx.progress(fraction, f"step {i + 1}")
        return {"ref": ctx.operation_ref}

    return q


class Nap(BaseModel):
    seconds: float = 0.1


class Gate(BaseModel):
    gate: str
    steps: list[float] = []


def _wait_for(gate: Path) -> None:
    deadline = time.monotonic() + GATE_PATIENCE_S
    while not gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        time.sleep(0.01)


tq = make()
celery_app = tq.celery
