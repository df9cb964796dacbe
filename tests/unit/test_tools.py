"""Tools and their options: ``def`` and ``async def`` tools, options declared once,
registration that refuses what cannot run, and the ref limit from the settings.

Async tools run on one event loop per thread (``toolq.core.tools.thread_loop``);
these tests call ``Tool.invoke``/``Tool.lookup`` directly, as a worker does.
The end-to-end run with real worker processes is
``tests/integration/test_async_tools.py``.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import fakeredis
import pytest
from pydantic import BaseModel, ValidationError

from toolq import CallContext, Jitter, State, ToolOptions, ToolQueue
from toolq.core import errors
from toolq.core.settings import LeaseSettings, LimitSettings, ToolqSettings
from toolq.core.tools import Tool, thread_loop


class Args(BaseModel):
    n: int = 1


def ctx_for(tool: Tool[Any], ref: str = "r/1") -> CallContext:
    return CallContext(
        operation_ref=ref,
        tool=tool.name,
        call_id=None,
        attempt=1,
        max_attempts=tool.options.max_attempts,
        approved=False,
        args=Args(),
    )


def invoke(tool: Tool[Any], n: int = 1) -> Any:
    ctx = ctx_for(tool)
    return tool.invoke(Args(n=n), ctx)


@pytest.fixture
def tq() -> Iterator[ToolQueue]:
    q = ToolQueue(redis_url="redis://fake:6379/0")
    yield q
    q.close()


# --------------------------------------------------------------------------- invoke


def test_sync_tools_are_called_with_what_they_take(tq: ToolQueue) -> None:
    @tq.tool
    def both(args: Args, ctx: CallContext) -> tuple[int, str]:
        return args.n, ctx.operation_ref

    @tq.tool
    def args_only(args: Args) -> int:
        return args.n * 2

    @tq.tool
    def nothing() -> str:
        return "none"

    assert invoke(both, 3) == (3, "r/1")
    assert invoke(args_only, 3) == 6
    assert invoke(nothing) == "none"


def test_an_async_tool_is_awaited_and_its_verifier_too(tq: ToolQueue) -> None:
    @tq.tool
    async def pay(args: Args, ctx: CallContext) -> dict[str, Any]:
        await asyncio.sleep(0)  # a real suspension, not only a coroutine that returns
        return {"paid": args.n, "ref": ctx.operation_ref}

    @pay.verifier
    async def find(ctx: CallContext) -> dict[str, Any] | None:
        await asyncio.sleep(0)
        return {"found": ctx.operation_ref} if ctx.operation_ref == "r/1" else None

    assert invoke(pay, 5) == {"paid": 5, "ref": "r/1"}
    assert pay.lookup(ctx_for(pay)) == {"found": "r/1"}
    assert pay.lookup(ctx_for(pay, "r/other")) is None
    assert pay.verification_tool == "find"


def test_a_sync_verifier_is_called_by_lookup_and_no_verifier_is_a_lookup_error(
    tq: ToolQueue,
) -> None:
    @tq.tool
    def write(args: Args) -> int:
        return args.n

    with pytest.raises(LookupError, match="no verifier"):
        write.lookup(ctx_for(write))

    @write.verifier
    def find(ctx: CallContext) -> str:
        return ctx.operation_ref

    assert write.lookup(ctx_for(write)) == "r/1"


def test_calling_a_tool_directly_returns_what_the_function_returns(tq: ToolQueue) -> None:
    @tq.tool
    async def pay(args: Args) -> int:
        return args.n

    coro = pay(Args(n=4))
    assert asyncio.iscoroutine(coro)
    assert asyncio.run(coro) == 4


def test_an_async_tool_failure_propagates_and_the_loop_stays_usable(tq: ToolQueue) -> None:
    @tq.tool
    async def flaky(args: Args) -> int:
        await asyncio.sleep(0)
        if args.n < 0:
            raise errors.RateLimited(retry_after=1.0)
        return args.n

    with pytest.raises(errors.RateLimited):
        invoke(flaky, -1)
    assert invoke(flaky, 2) == 2


def test_one_loop_per_thread_reused_across_calls(tq: ToolQueue) -> None:
    @tq.tool
    async def which_loop(args: Args) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    here = invoke(which_loop)
    assert invoke(which_loop) is here is thread_loop()
    assert not here.is_running()  # only while a tool runs

    # Two threads at once: each its own loop, neither this thread's.
    barrier = threading.Barrier(2, timeout=10)
    loops: dict[str, list[asyncio.AbstractEventLoop]] = {}

    def serve(name: str) -> None:
        first = invoke(which_loop)
        barrier.wait()  # both threads alive: their loops cannot be one reused object
        loops[name] = [first, invoke(which_loop)]

    threads = [threading.Thread(target=serve, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)

    (a1, a2), (b1, b2) = loops["a"], loops["b"]
    assert a1 is a2 and b1 is b2
    assert len({id(a1), id(b1), id(here)}) == 3
    # A thread's loop is closed when the thread ends; this thread's is still open.
    assert a1.is_closed() and b1.is_closed()
    assert not here.is_closed()


def test_an_async_tool_from_inside_a_running_loop_is_refused_clearly(tq: ToolQueue) -> None:
    @tq.tool
    async def pay(args: Args) -> int:
        return args.n

    async def from_async_code() -> None:
        # filterwarnings=error: a coroutine left un-awaited would fail this test.
        with pytest.raises(RuntimeError, match="running event loop; await it there"):
            invoke(pay)

    asyncio.run(from_async_code())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_gets_a_loop_of_its_own(tq: ToolQueue) -> None:
    """As in a prefork pool: the parent's loop shares its epoll with the child."""

    @tq.tool
    async def which_loop(args: Args) -> int:
        await asyncio.sleep(0)
        return id(asyncio.get_running_loop())

    parent_loop = invoke(which_loop)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            child_loop = invoke(which_loop)
            os.write(write, b"new" if child_loop != parent_loop else b"same")
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as r:
        answer = r.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert answer == b"new"
    assert invoke(which_loop) == parent_loop  # the parent's loop is untouched


# --------------------------------------------------------------------------- registration


def test_registration_refuses_an_async_generator_tool(tq: ToolQueue) -> None:
    with pytest.raises(TypeError, match="async generator cannot be a tool"):

        @tq.tool
        async def stream(args: Args) -> AsyncIterator[int]:
            yield args.n

    assert "stream" not in tq.registry


def test_registration_refuses_a_tool_that_cannot_take_args_and_ctx(tq: ToolQueue) -> None:
    with pytest.raises(TypeError, match=r"called as three\(args\) or three\(args, ctx\)"):

        @tq.tool
        def three(args: Args, ctx: CallContext, extra: int) -> int:
            return 0

    # A keyword-only extra with a default is fine: the tool gets (args) only.
    @tq.tool
    def keyword(args: Args, *, scale: int = 2) -> int:
        return args.n * scale

    assert invoke(keyword, 3) == 6


@pytest.mark.parametrize(
    "verifier",
    [
        lambda: None,
        lambda ctx, other: None,
    ],
    ids=["no-parameter", "two-parameters"],
)
def test_a_verifier_with_the_wrong_arity_is_refused_when_registered(
    tq: ToolQueue, verifier: Any
) -> None:
    @tq.tool
    def write(args: Args) -> int:
        return args.n

    with pytest.raises(TypeError, match="called with one argument, the CallContext"):
        write.verifier(verifier)
    assert write.verify_fn is None


def test_a_generator_verifier_is_refused(tq: ToolQueue) -> None:
    @tq.tool
    def write(args: Args) -> int:
        return args.n

    async def agen(ctx: CallContext) -> AsyncIterator[int]:
        yield 1

    def gen(ctx: CallContext) -> Iterator[int]:
        yield 1

    for fn in (agen, gen):
        with pytest.raises(TypeError, match="generator cannot be a verifier"):
            write.verifier(fn)


# --------------------------------------------------------------------------- options


def test_options_are_validated_once_by_the_model(tq: ToolQueue) -> None:
    @tq.tool(
        writes=False,
        max_attempts=3,
        deadline=120,
        jitter=Jitter(kind="none"),
        safe_details=["sku", "region"],
        idempotent=False,
    )
    def read(args: Args) -> int:
        """Read a thing.

        More text that is not the description.
        """
        return args.n

    o = read.options
    assert isinstance(o, ToolOptions)
    assert (o.writes, o.max_attempts, o.deadline, o.idempotent) == (False, 3, 120.0, False)
    assert o.jitter == Jitter(kind="none")
    assert o.safe_details == frozenset({"sku", "region"})
    assert o.description == "Read a thing."
    assert not read.writes
    with pytest.raises(ValidationError):
        o.max_attempts = 9  # type: ignore[misc]


def test_defaults_and_an_explicit_description(tq: ToolQueue) -> None:
    @tq.tool(description="Explicit.")
    def documented(args: Args) -> int:
        """Docstring."""
        return args.n

    @tq.tool(description=None)
    def fallback(args: Args) -> int:
        """From the docstring."""
        return args.n

    assert documented.options.description == "Explicit."
    assert fallback.options.description == "From the docstring."
    assert documented.options.model_copy(update={"description": ""}) == ToolOptions()
    assert ToolOptions().jitter == Jitter()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_attempt": 3}, "unknown option 'max_attempt'"),
        ({"max_attempts": 0}, "option max_attempts=0: Input should be greater than or equal to 1"),
        ({"writes": "no"}, "option writes='no'"),
        ({"deadline": 0}, "option deadline=0"),
        ({"consistency_window": float("inf")}, "option consistency_window=inf"),
        ({"verify_backoff": -1.0}, "option verify_backoff=-1.0"),
        ({"safe_details": "sku"}, "option safe_details='sku'"),
        ({"safe_details": [1]}, "option safe_details.0=1"),
        ({"jitter": "full"}, "option jitter='full'"),
    ],
)
def test_a_bad_option_is_refused_at_registration_naming_it(
    tq: ToolQueue, options: dict[str, Any], named: str
) -> None:
    # Refused by tq.tool(...) itself, before any function is decorated.
    with pytest.raises(ValueError, match=r"^tool options: ") as info:
        tq.tool(**options)
    assert named in str(info.value)
    assert len(tq.registry) == 0


def test_the_error_names_the_tool_when_it_is_given(tq: ToolQueue) -> None:
    with pytest.raises(ValueError, match=r"^tool pay: option max_attempts=0.*; unknown option"):
        tq.tool(name="pay", max_attempts=0, retries=2)


def test_tool_options_can_be_built_directly() -> None:
    o = ToolOptions(max_attempts=2, safe_details=frozenset({"k"}))
    assert o.max_attempts == 2 and o.safe_details == frozenset({"k"})
    with pytest.raises(ValidationError):
        ToolOptions(max_attempts=0)


# --------------------------------------------------------------------------- settings


@pytest.fixture
def limited(fake_redis: fakeredis.FakeRedis) -> Iterator[ToolQueue]:
    settings = ToolqSettings(limits=LimitSettings(max_ref_length=40))
    q = ToolQueue(redis_url="redis://fake:6379/0", settings=settings)
    q.app._redis = fake_redis

    @q.tool(writes=False)
    def read(args: Args) -> int:
        return args.n

    yield q
    q.close()


def test_a_ref_one_over_the_limit_is_refused_and_one_at_it_accepted(limited: ToolQueue) -> None:
    at, over = "r" * 40, "r" * 41
    assert limited.submit("read", {}, operation_ref=at).operation_ref == at
    with pytest.raises(errors.InvalidArguments, match="operation_ref must be 1-40 characters"):
        limited.submit("read", {}, operation_ref=over)
    assert limited.get(over) is None


@pytest.mark.parametrize("ref", ["./fz/ab/target", "fz/../ab", "fz//ab", "/fz", "fz/", ".."])
def test_a_ref_with_an_empty_dot_or_dot_dot_segment_is_refused(
    limited: ToolQueue, ref: str
) -> None:
    assert limited.submit("read", {}, operation_ref="fz/ab/target").created
    with pytest.raises(
        errors.InvalidArguments, match=re.escape("none empty, '.' or '..'")
    ) as refused:
        limited.submit("read", {}, operation_ref=ref)
    assert refused.value.field_errors[0].field == "operation_ref"
    assert limited.get(ref) is None
    with pytest.raises(errors.InvalidArguments):
        limited.submit("read", {}, run_id=ref.strip("/") or ".", step="..")


class Amount(BaseModel):
    amount: float


@pytest.mark.parametrize("amount", [float("inf"), float("-inf"), float("nan")])
def test_arguments_json_cannot_carry_are_refused_not_stored(
    limited: ToolQueue, amount: float
) -> None:
    @limited.tool(writes=True)
    def pay(args: Amount, ctx: CallContext) -> None: ...

    # json.dumps wrote them as Infinity/NaN: not JSON, in the ledger and the message
    with pytest.raises(errors.InvalidArguments, match="not JSON-serialisable"):
        limited.submit("pay", {"amount": amount}, operation_ref="pay/1")
    assert limited.get("pay/1") is None


def test_a_call_id_one_over_the_limit_is_refused(limited: ToolQueue) -> None:
    assert limited.submit("read", {}, operation_ref="c/1", call_id="c" * 40).created
    with pytest.raises(errors.InvalidArguments, match="call_id must be a string of at most 40"):
        limited.submit("read", {}, operation_ref="c/2", call_id="c" * 41)
    assert limited.get("c/2") is None


@pytest.mark.parametrize("call_id", ["x\ny", "tab\there", "a\u2028b", "\x00", "\ud800"])
def test_a_call_id_no_envelope_can_carry_is_refused_and_nothing_written(
    limited: ToolQueue, call_id: str
) -> None:
    # It was taken; every envelope of the operation then failed to build in the worker
    # (a ValidationError past the task), and the read ran again at each lease expiry
    with pytest.raises(errors.InvalidArguments, match="on one line, without control"):
        limited.submit("read", {}, operation_ref="cid/1", call_id=call_id)
    assert limited.get("cid/1") is None


@pytest.mark.parametrize("call_id", ["", "a b", "toolu_01A/é", "c" * 40])
def test_a_call_id_taken_settles_with_it(limited: ToolQueue, call_id: str) -> None:
    ref = limited.submit("read", {}, operation_ref="cid/2", call_id=call_id).operation_ref
    limited.runtime.run_attempt(ref, 1)
    rec = limited.get(ref)
    assert rec is not None and rec.state is State.SUCCEEDED
    assert rec.envelope is not None and rec.envelope.call_id == (call_id or None)


@pytest.mark.parametrize(
    ("ref", "ok"),
    [
        ("fz/ab/target", True),
        ("a", True),
        ("run_1/step.2", True),
        ("...", True),
        ("..a/.b/a..", True),
        ("v1.2/x#y:z@w+q=r-s", True),
        ("./fz/ab/target", False),
        ("../fz/ab/target", False),
        ("fz/./ab", False),
        ("fz/../ab", False),
        ("fz/ab/.", False),
        ("fz/ab/..", False),
        (".", False),
        ("..", False),
        ("/fz/ab", False),
        ("fz/ab/", False),
        ("fz//ab", False),
        ("/", False),
        ("", False),
        ("a b", False),
        ("a%2e", False),
    ],
)
def test_a_ref_has_no_empty_dot_or_dot_dot_segment(ref: str, ok: bool) -> None:
    """Location: /v1/operations/./fz/ab/target resolves to fz/ab/target in every client."""
    limits = LimitSettings()
    assert limits.is_ref(ref) is ok
    # The JSON Schema pattern says the same (as a JSON Schema reader, Python's re, reads it).
    assert (re.search(limits.ref_pattern, ref) is not None) is ok


def test_the_ref_pattern_is_built_from_the_setting() -> None:
    limits = LimitSettings(max_ref_length=36)
    assert limits.is_ref("a" * 36)
    assert not limits.is_ref("a" * 37)
    assert not limits.is_ref("a b")
    assert not limits.is_ref("ab\n")  # fullmatch: no trailing newline slips in
    with pytest.raises(ValidationError):
        LimitSettings(max_ref_length=201)  # the envelope carries at most 200


def test_the_lease_renewal_period_comes_from_the_settings() -> None:
    settings = ToolqSettings(lease=LeaseSettings(seconds=6.0))
    q = ToolQueue(redis_url="redis://fake:6379/0", settings=settings)
    try:
        assert q.runtime.leases.renew_every == settings.lease.renew_every == 2.0
    finally:
        q.close()


def test_is_async_is_asked_once_per_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """The asyncio pool asks ``is_async`` at every call: ``inspect`` runs once per
    function, and a function put in its place is asked again."""
    from toolq.core.tools import tool as tool_module

    asked: list[Any] = []
    real = tool_module._is_coroutine_fn

    def counting(fn: Any) -> bool:
        asked.append(fn)
        return real(fn)

    monkeypatch.setattr(tool_module, "_is_coroutine_fn", counting)

    async def afn(args: Args, ctx: CallContext) -> int:
        return args.n

    def sfn(args: Args, ctx: CallContext) -> int:
        return args.n

    t = Tool("t_once", afn, Args, ToolOptions())
    assert all(t.is_async for _ in range(5))
    assert asked == [afn]
    t.fn = sfn
    assert not t.is_async and not t.is_async
    assert asked == [afn, sfn]


def test_a_callable_without_a_name_is_refused_asking_for_one(tq: ToolQueue) -> None:
    class Lookup:
        def __call__(self, args: Args) -> int:
            return args.n

    # It had no __name__ (AttributeError); an int name reached re (TypeError)
    with pytest.raises(ValueError, match=r"tool name None is not an identifier \(name= gives"):
        tq.tool(Lookup())
    with pytest.raises(ValueError, match="tool name 5 is not an identifier"):
        tq.tool(name=5)(Lookup())  # type: ignore[arg-type]
    assert invoke(tq.tool(name="lookup")(Lookup()), 4) == 4


@pytest.mark.parametrize("name", [5, None, ["echo"], b"echo"])
def test_a_tool_name_that_is_not_a_string_is_an_unknown_tool(tq: ToolQueue, name: Any) -> None:
    # It was TypeError: 'int' object is not subscriptable (or unhashable type: 'list')
    with pytest.raises(errors.UnknownTool):
        tq.submit(name, {})


class Hook(BaseModel):
    on_done: Callable[[int], int] = abs


def test_arguments_without_a_json_schema_are_refused_at_registration(tq: ToolQueue) -> None:
    # Registered, such a tool made MCP's tools/list answer "internal error" for every tool
    with pytest.raises(TypeError, match=r"tool hook: its arguments \(Hook\) have no JSON Schema"):

        @tq.tool
        def hook(args: Hook) -> int:
            return args.on_done(1)

    assert "hook" not in tq.registry


class Marker(BaseModel):
    model_config = {"arbitrary_types_allowed": True}
    tag: Any = object()  # no JSON for the default: its schema leaves it out, with a warning


def test_a_default_without_json_is_registered_without_a_warning(tq: ToolQueue) -> None:
    # The check above must not turn pydantic's schema warning into an import-time one
    # (an error under filterwarnings=error, as here)
    @tq.tool
    def mark(args: Marker) -> None:
        return None

    assert "mark" in tq.registry


class TreeNode(BaseModel):
    name: str
    children: list[TreeNode] = []


def test_a_recursive_arguments_model_has_its_object_at_the_top_of_its_schema(
    tq: ToolQueue,
) -> None:
    # pydantic answers {"$ref": "#/$defs/TreeNode", "$defs": ...} for a recursive model:
    # no "type": "object" at the top, which MCP requires of a tool's inputSchema
    @tq.tool(name="tree")
    def tree(args: TreeNode) -> dict[str, Any]:
        return {}

    schema = tq.registry.get("tree").input_schema()
    assert schema["type"] == "object" and "$ref" not in schema
    assert set(schema["properties"]) == {"name", "children"}
    # the references inside still resolve
    assert schema["properties"]["children"]["items"] == {"$ref": "#/$defs/TreeNode"}
    assert schema["$defs"]["TreeNode"]["type"] == "object"


class Plain(BaseModel):
    n: int


def test_a_plain_arguments_model_keeps_its_schema_as_pydantic_makes_it(tq: ToolQueue) -> None:
    @tq.tool(name="plain")
    def plain(args: Plain) -> dict[str, Any]:
        return {}

    assert tq.registry.get("plain").input_schema() == Plain.model_json_schema()
