"""How the ledger runs its Lua (issue 14): functions of one library, loaded once;
plain scripts on a server without functions; loaded again after a loss."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import fakeredis.aioredis
import pytest
import redis

from tests.contract.ops import NOW, QUEUE, history, submit
from toolq.adapters.ledger import Ledger, scripts
from toolq.adapters.ledger.aio import AsyncLedger
from toolq.adapters.ledger.store import Scripts
from toolq.core.states import State


class NoFunctions(fakeredis.FakeRedis):
    """A server that answers FUNCTION as Redis 6 does."""

    def function_load(self, *args: Any, **kwargs: Any) -> Any:
        raise redis.ResponseError("unknown command 'FUNCTION', with args beginning with: 'LOAD'")

    def fcall(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never reached
        raise AssertionError("FCALL on a server without functions")


def test_the_scripts_are_one_library_loaded_once_and_called_by_name(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    ledger = Ledger(fake_redis, prefix="p")
    assert submit(ledger, "a/1").outcome == "created"
    assert ledger.scripts.functions is True
    listed = repr(fake_redis.function_list(library=scripts.LIBRARY))
    assert all(scripts.function_name(n) in listed for n in scripts.NAMES), listed
    # the library's name is its code's: another toolq version loads beside it
    assert scripts.LIBRARY.startswith("toolq_") and scripts.LIBRARY in scripts.library()


def test_a_server_without_functions_runs_the_same_code_as_scripts() -> None:
    client = NoFunctions(server=fakeredis.FakeServer())
    ledger = Ledger(client, prefix="p")
    assert submit(ledger, "a/1").outcome == "created"
    assert ledger.scripts.functions is False
    assert ledger.claim("a/1", 1, "w1", NOW, 1000).outcome == "claimed"
    assert [h.to for h in history(ledger, "a/1")] == [State.QUEUED, State.RUNNING]
    assert client.lrange(QUEUE, 0, -1) == [b"run a/1"]


def test_a_server_that_lost_the_library_gets_it_again_on_the_next_call(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    ledger = Ledger(fake_redis, prefix="p")
    submit(ledger, "a/1")
    # Given a server that forgot the library (a restart without persistence, a flush)
    fake_redis.function_delete(scripts.LIBRARY)
    # When the ledger is used again, by the same process and by a new one
    assert ledger.claim("a/1", 1, "w1", NOW, 1000).outcome == "claimed"
    fake_redis.function_delete(scripts.LIBRARY)
    assert Scripts(fake_redis)("plan_sleep", ledger.calls.fixed, ["n", NOW, 5000]) == NOW + 1000
    # Then it was loaded again, and each call did what it says
    assert ledger.fields("a/1", "state") == {"state": "running"}


@pytest.mark.parametrize("functions", [True, False])
def test_the_async_ledger_runs_the_same_way_and_loads_again_after_a_loss(
    functions: bool,
) -> None:
    server = fakeredis.FakeServer()
    sync = fakeredis.FakeRedis(server=server)
    client = fakeredis.aioredis.FakeRedis(server=server)
    if not functions:  # as Redis 6 answers
        client.function_load = NoFunctions.function_load.__get__(client)  # type: ignore[method-assign]

    def operation(ref: str) -> dict[str, Any]:
        return dict(
            ref=ref, tool="t", args_json="{}", fp="f", call_id="", now_ms=NOW, max_attempts=3,
            deadline_ms=NOW + 60_000, state=State.QUEUED, due_ms=NOW + 1000, queue=QUEUE,
            message=f"run {ref}",
        )  # fmt: skip

    async def two_submits_around_a_loss() -> list[str]:
        ledger = AsyncLedger(client, prefix="p")
        first = await ledger.submit(**operation("a/1"))
        # Given a server that lost what the first call loaded (a flush, a restart)
        if functions:
            sync.function_delete(scripts.LIBRARY)
        else:
            sync.script_flush()
        second = await ledger.submit(**operation("a/2"))
        assert ledger.scripts.functions is functions
        return [first.outcome, second.outcome]

    assert asyncio.run(two_submits_around_a_loss()) == ["created", "created"]
    assert sync.lrange(QUEUE, 0, -1) == [b"run a/2", b"run a/1"]
