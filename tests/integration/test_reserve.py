"""A worker holds a small reserve of messages beyond its pool's slots (issue 14).

So that the next message is already in the worker when a slot frees, instead of
fetched then (bench/RESULTS.md, "(b) I/O-bound"), and at most that many messages
wait behind busy slots. A real threads worker of two slots on the session's Valkey:
two long calls run, the reserve waits in the worker (kombu's unacked hash), the rest
stays in the queue, and every call still runs once.
"""

from __future__ import annotations

import pytest

from tests.helpers import start_worker, stop_process, wait_until
from tests.integration.conftest import APP, effects
from toolq import ToolQueue
from toolq.keys import KOMBU_UNACKED
from toolq.states import State

CALLS = 4


@pytest.mark.parametrize(
    ("env", "reserved"),
    [({}, 1), ({"TOOLQ_WORKER__RESERVE": "0"}, 0), ({"TOOLQ_WORKER__RESERVE": "2"}, 2)],
    ids=["default: one per eight slots, rounded up", "none", "two"],
)
def test_a_worker_holds_its_reserve_and_no_more(
    rt: ToolQueue, module_redis_url: str, env: dict[str, str], reserved: int
) -> None:
    r = rt.redis
    refs = [rt.submit("pay", {"sleep": 3.0}).operation_ref for _ in range(CALLS)]
    queue = rt.app.messages.run(refs[0], 1)[0]
    w = start_worker(APP, module_redis_url, pool="threads", concurrency=2, env=env)
    try:

        def running() -> int:
            return sum(rt.get(ref).state == State.RUNNING for ref in refs)

        # Two slots busy; the worker holds them and its reserve; the queue the rest.
        held = 2 + reserved
        assert wait_until(
            lambda: (
                running() == 2 and r.hlen(KOMBU_UNACKED) == held and r.llen(queue) == CALLS - held
            ),
            20,
        ), (running(), r.hlen(KOMBU_UNACKED), r.llen(queue))
        assert all(rt.wait(ref, timeout=60).ok for ref in refs)
        assert [effects(r, ref) for ref in refs] == [1] * CALLS
    finally:
        stop_process(w)
