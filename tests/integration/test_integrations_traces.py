"""toolq's spans under each framework's own tool span (issue 30; docs/integrations.md, "Traces").

One real agent run per framework, with the framework's scripted or fake model
(as its own adapter test drives it), and the MCP server with the SDK's
in-memory client. The test process records every OpenTelemetry span in an
``InMemorySpanExporter`` (:func:`spans`); the framework's tool span is made by
the framework (Pydantic AI's instrumentation, the Anthropic client's, the MCP
SDK's middleware), by an agents-to-OpenTelemetry bridge (OpenAI Agents SDK:
its own tracing otherwise), or by an OpenTelemetry callback handler
(LangChain). Each test finds toolq's ``submit`` span a child of that span.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from agents import Agent, Runner
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tracing import Span as AgentsSpan
from agents.tracing import Trace as AgentsTrace
from agents.tracing import TracingProcessor, set_trace_processors
from agents.tracing.processors import default_processor
from agents.tracing.span_data import FunctionSpanData
from anthropic import AsyncAnthropic
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langgraph.checkpoint.memory import InMemorySaver
from mcp import Client
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings

from tests.helpers import start_scheduler, start_worker, stop_processes, wait_until
from tests.integration.agents_fixtures import effects, run_async
from tests.integration.apps import traced_agents_app
from tests.integration.apps.traced_app import SPANS_ENV
from tests.integration.test_integrations_anthropic import Claude, use
from tests.integration.test_integrations_langchain import ScriptedChat, call
from tests.otel import in_memory
from toolq import ToolQueue
from toolq.edges.mcp_server import create_server
from toolq.integrations import anthropic as toolq_anthropic
from toolq.integrations import langchain as toolq_langchain
from toolq.integrations import openai_agents
from toolq.integrations import pydantic_ai as toolq_pydantic_ai

NOTIFY = {"to": "ops", "text": "hi"}


@pytest.fixture(scope="module")
def spans_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spans") / "spans.jsonl"


@pytest.fixture(scope="module")
def agents_tq(module_redis_url: str, spans_file: Path) -> Iterator[ToolQueue]:
    """The adapters' app on this module's database, with a worker and a scheduler that
    write their spans to :func:`spans_file`."""
    tq = traced_agents_app.tq
    tq.configure(redis_url=module_redis_url)
    env = {SPANS_ENV: str(spans_file)}
    procs = [
        start_worker(traced_agents_app.APP, module_redis_url, env=env),
        start_scheduler(traced_agents_app.APP, module_redis_url, env=env),
    ]
    yield tq
    stop_processes(procs, timeout=5)
    tq.close()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Every span the test process ends, in this test (the global tracer provider)."""
    with in_memory() as exporter:
        yield exporter


@pytest.fixture
def provider(spans: InMemorySpanExporter) -> TracerProvider:
    made = trace.get_tracer_provider()
    assert isinstance(made, TracerProvider)
    return made


def attempts_of(spans_file: Path, ref: str) -> list[dict[str, Any]]:
    """The workers' attempt spans of ``ref`` (once the call settled, they have ended)."""
    lines = spans_file.read_text().splitlines() if spans_file.exists() else []
    return [
        s
        for s in map(json.loads, lines)
        if s["name"].startswith("execute_tool ")
        and s["attributes"].get("toolq.operation_ref") == ref
        and "toolq.check" not in s["attributes"]
    ]


def assert_attempts_under(spans_file: Path, submit: ReadableSpan, count: int) -> None:
    """``count`` attempts of the submit's operation ran in a worker, each its child."""
    assert submit.attributes is not None and submit.context is not None
    ref = str(submit.attributes["toolq.operation_ref"])
    # an attempt's span ends after it recorded the outcome the call was answered with
    assert wait_until(lambda: len(attempts_of(spans_file, ref)) >= count, 10)
    found = attempts_of(spans_file, ref)
    assert sorted(s["attributes"]["toolq.attempt"] for s in found) == list(range(1, count + 1))
    for s in found:
        assert s["trace_id"] == f"{submit.context.trace_id:032x}"
        assert s["parent_id"] == f"{submit.context.span_id:016x}"


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [s for s in exporter.get_finished_spans() if s.name == name]
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


def assert_child(child: ReadableSpan, parent: ReadableSpan) -> None:
    assert child.parent is not None and parent.context is not None
    assert child.context is not None and child.context.trace_id == parent.context.trace_id
    assert child.parent.span_id == parent.context.span_id


# --------------------------------------------------------------------------- Pydantic AI


def test_pydantic_ai_tool_span_is_the_parent_of_the_submit(
    agents_tq: ToolQueue, spans: InMemorySpanExporter, spans_file: Path, provider: TracerProvider
) -> None:
    turns = iter(
        [
            ModelResponse(parts=[ToolCallPart("notify", NOTIFY, tool_call_id="call_pai_1")]),
            ModelResponse(parts=[TextPart("sent")]),
        ]
    )

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return next(turns)

    conversation = f"conv-{uuid.uuid4().hex[:12]}"
    agent = PydanticAgent(
        FunctionModel(respond),
        toolsets=[toolq_pydantic_ai.toolset(agents_tq)],
        capabilities=[Instrumentation(InstrumentationSettings(tracer_provider=provider))],
    )
    run_async(agents_tq, lambda: agent.run("go", conversation_id=conversation))

    tool_span = one(spans, "execute_tool notify")  # pydantic-ai's own (instrumentation v5)
    assert tool_span.attributes is not None
    assert tool_span.attributes["gen_ai.tool.call.id"] == "call_pai_1"
    submit = one(spans, "submit notify")
    assert_attempts_under(spans_file, submit, 2)  # rate limited once, retried
    assert_child(submit, tool_span)
    assert submit.attributes is not None
    assert submit.attributes["toolq.operation_ref"] == f"{conversation}/call_pai_1"


# --------------------------------------------------------------------------- Anthropic


def test_anthropic_tool_runner_span_is_the_parent_of_the_submit(
    agents_tq: ToolQueue, spans: InMemorySpanExporter, spans_file: Path, provider: TracerProvider
) -> None:
    claude = Claude([use("toolu_traced_1", "notify", NOTIFY)])

    async def body() -> None:
        client = AsyncAnthropic(
            api_key="sk-ant-test",
            base_url="http://anthropic.test",
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(claude)),
            open_telemetry={"tracer_provider": provider},
        )
        runner = client.beta.messages.tool_runner(
            model="claude-test",
            max_tokens=256,
            messages=[{"role": "user", "content": "go"}],
            tools=toolq_anthropic.tools(agents_tq),
        )
        async for _ in runner:
            pass
        await client.close()

    run_async(agents_tq, body)

    tool_span = one(spans, "anthropic.custom_tool_use notify")
    submit = one(spans, "submit notify")
    assert_attempts_under(spans_file, submit, 2)  # rate limited once, retried
    assert_child(submit, tool_span)
    assert submit.attributes is not None
    assert submit.attributes["toolq.operation_ref"] == "toolu_traced_1"


# --------------------------------------------------------------------------- MCP


def test_mcp_request_span_is_the_parent_of_the_submit(
    agents_tq: ToolQueue, spans: InMemorySpanExporter, spans_file: Path
) -> None:
    server = create_server(agents_tq, wait_seconds=15)
    ref = f"mcp-traced-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with Client(server) as client:
            with trace.get_tracer("test").start_as_current_span("the agent's turn"):
                await client.call_tool("notify", NOTIFY, meta={"operation_ref": ref})

    anyio.run(main)

    turn = one(spans, "the agent's turn")
    request = next(
        s
        for s in spans.get_finished_spans()
        if s.name == "tools/call notify" and s.kind is trace.SpanKind.SERVER
    )
    submit = one(spans, "submit notify")
    assert_attempts_under(spans_file, submit, 2)  # rate limited once, retried
    assert_child(submit, request)
    # the client sent its context in the request's _meta: the server's span is in its trace
    assert request.context is not None and turn.context is not None
    assert request.context.trace_id == turn.context.trace_id
    assert request.attributes is not None and "jsonrpc.request.id" in request.attributes
    assert effects(agents_tq, ref) == 1


# --------------------------------------------------------------------------- OpenAI Agents SDK


class Recorded(TracingProcessor):
    """The Agents SDK's spans, as a trace processor sees them."""

    def __init__(self) -> None:
        self.spans: list[AgentsSpan[Any]] = []

    def on_trace_start(self, trace: AgentsTrace) -> None:
        pass

    def on_trace_end(self, trace: AgentsTrace) -> None:
        pass

    def on_span_start(self, span: AgentsSpan[Any]) -> None:
        self.spans.append(span)

    def on_span_end(self, span: AgentsSpan[Any]) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass

    def function(self, name: str) -> AgentsSpan[Any]:
        (found,) = [
            s
            for s in self.spans
            if isinstance(s.span_data, FunctionSpanData) and s.span_data.name == name
        ]
        return found


class Bridge(Recorded):
    """An agents-to-OpenTelemetry bridge as OpenInference's and Logfire's are: one OTel
    span per agents span, current while the agents span is."""

    def __init__(self) -> None:
        super().__init__()
        self.open: dict[str, tuple[Any, object]] = {}

    def on_span_start(self, span: AgentsSpan[Any]) -> None:
        super().on_span_start(span)
        parent = self.open.get(span.parent_id or "")
        ctx = trace.set_span_in_context(parent[0]) if parent else None
        name = getattr(span.span_data, "name", None) or span.span_data.type
        otel_span = trace.get_tracer("bridge").start_span(f"agents {name}", context=ctx)
        self.open[span.span_id] = (
            otel_span,
            otel_context.attach(trace.set_span_in_context(otel_span)),
        )

    def on_span_end(self, span: AgentsSpan[Any]) -> None:
        otel_span, token = self.open.pop(span.span_id)
        otel_context.detach(token)  # type: ignore[arg-type]
        otel_span.end()


@pytest.fixture
def agents_tracing() -> Iterator[None]:
    yield
    set_trace_processors([default_processor()])


def run_agents(tq: ToolQueue, processor: TracingProcessor, call_id: str) -> None:
    set_trace_processors([processor])
    model = ScriptedModel(
        [[function_call("notify", NOTIFY, call_id=call_id)], [assistant_message("sent")]]
    )
    agent = Agent(name="agent", model=model, tools=openai_agents.tools(tq))
    run_async(tq, lambda: Runner.run(agent, "go"))


def test_openai_agents_function_span_is_the_parent_of_the_submit_through_a_bridge(
    agents_tq: ToolQueue, spans: InMemorySpanExporter, spans_file: Path, agents_tracing: None
) -> None:
    bridge = Bridge()
    run_agents(agents_tq, bridge, "call_oai_bridged")

    function = bridge.function("notify")
    tool_span = one(spans, "agents notify")
    submit = one(spans, "submit notify")
    assert_attempts_under(spans_file, submit, 2)  # rate limited once, retried
    assert_child(submit, tool_span)
    assert submit.attributes is not None
    assert submit.attributes["openai_agents.span_id"] == function.span_id
    assert submit.attributes["openai_agents.trace_id"] == function.trace_id


def test_openai_agents_trace_is_the_trace_of_the_submit_without_a_bridge(
    agents_tq: ToolQueue, spans: InMemorySpanExporter, spans_file: Path, agents_tracing: None
) -> None:
    # No OpenTelemetry span is current in the tool: toolq's trace is the agents trace's id,
    # under the function span's id, so one agent run's calls are one trace
    recorded = Recorded()
    run_agents(agents_tq, recorded, "call_oai_plain")

    function = recorded.function("notify")
    submit = one(spans, "submit notify")
    assert_attempts_under(spans_file, submit, 2)  # rate limited once, retried
    assert submit.context is not None and submit.parent is not None
    assert f"trace_{submit.context.trace_id:032x}" == function.trace_id
    assert function.span_id.startswith(f"span_{submit.parent.span_id:016x}")
    assert submit.attributes is not None
    assert submit.attributes["openai_agents.span_id"] == function.span_id


# --------------------------------------------------------------------------- LangChain


class OtelToolRuns(BaseCallbackHandler):
    """An OpenTelemetry callback handler as Langfuse's is: a span per tool run, current
    while the tool runs (inline, so in the tool's context)."""

    run_inline = True

    def __init__(self) -> None:
        self.open: dict[uuid.UUID, tuple[Any, object]] = {}
        self.runs: dict[str, uuid.UUID] = {}

    def on_tool_start(
        self, serialized: dict[str, Any], input_str: str, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        name = serialized.get("name", "tool")
        span = trace.get_tracer("handler").start_span(f"tool {name}")
        self.open[run_id] = (span, otel_context.attach(trace.set_span_in_context(span)))
        self.runs[name] = run_id

    def on_tool_end(self, output: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        span, token = self.open.pop(run_id)
        otel_context.detach(token)  # type: ignore[arg-type]
        span.end()


def test_langchain_tool_run_span_is_the_parent_of_the_submit(
    agents_tq: ToolQueue, spans: InMemorySpanExporter, spans_file: Path
) -> None:
    handler = OtelToolRuns()
    model = ScriptedChat(messages=iter([call("notify", NOTIFY, "call_lc_1"), "sent"]), received=[])
    agent = create_agent(
        model, tools=toolq_langchain.tools(agents_tq), checkpointer=InMemorySaver()
    )
    thread = f"t-{uuid.uuid4().hex[:12]}"
    config: Any = {"configurable": {"thread_id": thread}, "callbacks": [handler]}
    run_async(agents_tq, lambda: agent.ainvoke({"messages": [("user", "go")]}, config))

    tool_span = one(spans, "tool notify")
    submit = one(spans, "submit notify")
    assert_attempts_under(spans_file, submit, 2)  # rate limited once, retried
    assert_child(submit, tool_span)
    assert submit.attributes is not None
    assert submit.attributes["langchain.run_id"] == str(handler.runs["notify"])
    assert submit.attributes["toolq.operation_ref"] == f"{thread}/call_lc_1"
