"""A worker holds a small reserve of messages beyond its pool's slots (issue 14).

So that the next message is already in the worker when a slot frees, instead of
fetched then (bench/RESULTS.md, "(b) I/O-bound"), and at most that many messages
wait behind busy slots. Real threads workers on the session's Valkey: every slot
runs a long call, the reserve waits in the worker (kombu's unacked hash), the rest
stays in the queue, and every call still runs once.
"""

from __future__ import annotations

import pytest

from tests.helpers import start_worker, stop_process, wait_until
from tests.integration.apps import runtime_app
from tests.integration.conftest import APP, effects
from toolq import ToolQueue
from toolq.core.keys import KOMBU_UNACKED
from toolq.core.states import State


@pytest.mark.parametrize(
    ("slots", "env", "reserved"),
    [
        (8, {}, 1),
        (2, {}, 0),
        (2, {"TOOLQ_WORKER__RESERVE": "2"}, 2),
        (8, {"TOOLQ_WORKER__RESERVE": "0"}, 0),
    ],
    ids=["default, 8 slots: one", "default, 2 slots: none", "set to two", "set to none"],
)
def test_a_worker_holds_its_reserve_and_no_more(
    rt: ToolQueue, module_redis_url: str, slots: int, env: dict[str, str], reserved: int
) -> None:
    r = rt.redis
    r.delete(runtime_app.GATE)  # the module's database: an earlier case opened it
    calls = slots + 3
    # Each call holds its slot until the gate opens (60 s at most), so what the worker
    # holds is looked at while it cannot change, however slowly the worker starts
    gated = {"mode": "gated", "sleep": 60.0}
    refs = [rt.submit("pay", gated).operation_ref for _ in range(calls)]
    queue = rt.app.messages.run(refs[0], 1)[0]
    w = start_worker(APP, module_redis_url, pool="threads", concurrency=slots, env=env)
    try:

        def running() -> int:
            return sum(rt.get(ref).state == State.RUNNING for ref in refs)

        held = slots + reserved
        assert wait_until(
            lambda: (
                running() == slots
                and r.hlen(KOMBU_UNACKED) == held
                and r.llen(queue) == calls - held
            ),
            20,
        ), (running(), r.hlen(KOMBU_UNACKED), r.llen(queue))
        r.set(runtime_app.GATE, "1")
        assert all(rt.wait(ref, timeout=60).ok for ref in refs)
        assert [effects(r, ref) for ref in refs] == [1] * calls
    finally:
        stop_process(w)
