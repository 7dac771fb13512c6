"""Figures of the agent engine's loop (issue 4), in-process, model at zero latency.

- ``engine.bare_tool_call`` (baseline): the cheap tool (``add``) called as a plain Python
  function with validated arguments, one call at a time.
- ``engine.iteration_overhead``: one loop iteration of ``run_turn`` — a model call answered at
  once by a scripted fake model (a ``tool_use`` of ``add``), the tool dispatched, its effects
  made into their sealed, encoded records — measured between consecutive model calls of a
  turn, excluding Kafka (the records are encoded but not produced). Beside it: the same
  loop with effects only kept in memory (``RecordingSink``: the loop alone), with an async
  tool (no thread hop), and with every effect produced and acked on the run's broker the way
  the worker does it (``KafkaEffectSink``), plus the records a turn produces.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel

from bench.harness import Context, Result, benchmark, latency_summary
from consumers.engine import (
    AgentSpec,
    KafkaEffectSink,
    Ok,
    RecordingSink,
    Tool,
    ToolContext,
    ToolRegistry,
    TurnInput,
    run_turn,
)
from consumers.engine.effects import to_record
from consumers.engine.model import ModelRequest, ModelResponse, StreamCallbacks
from consumers.engine.types import Usage
from streams import tracing
from streams.envelope import Envelope, encode
from streams.producer import RecordProducer
from streams.sealing import MemoryKeyStore, Sealer
from streams.topics import AGENT, TELEMETRY, create_topics, topic_name

TOOL_ITERATIONS = 20
"""Tool-using iterations per turn (then one final answer)."""
TURNS = 100
KAFKA_TURNS = 20
WARMUP_TURNS = 5
CONVERSATION = "cnv-0123456789abcdef"
REPLY = ("I heard 1 concern: the crossing by the school feels unsafe for children. "
         "I propose a new issue for a light at the crossing.")


class AddArgs(BaseModel):
    a: int
    b: int


def add(args: AddArgs, ctx: ToolContext) -> Ok:  # noqa: ARG001
    """The cheap tool: one addition, one row."""
    return Ok(rows=({"sum": args.a + args.b},))


async def add_async(args: AddArgs, ctx: ToolContext) -> Ok:  # noqa: ARG001
    return Ok(rows=({"sum": args.a + args.b},))


class ZeroModel:
    """A scripted ``ModelPort`` at zero latency: ``iterations`` tool uses, then a reply.

    Responses are built once; each call only streams the text to the callbacks, as the SDK
    adapter does, and notes when it was called (``marks``).
    """

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.calls = 0
        self.marks: list[float] = []
        self._responses = [
            ModelResponse([{"type": "text", "text": "Let me check."},
                           {"type": "tool_use", "id": f"toolu_{i:04d}", "name": "add",
                            "input": {"a": i, "b": 1}}],
                          "tool_use", "claude-sonnet-4-5", Usage(1200 + 40 * i, 30),
                          f"msg_{i}")
            for i in range(iterations)]
        self._responses.append(ModelResponse([{"type": "text", "text": REPLY}], "end_turn",
                                             "claude-sonnet-4-5", Usage(2000, 60), "msg_end"))

    async def stream(self, request: ModelRequest, callbacks: StreamCallbacks) -> ModelResponse:
        self.marks.append(time.perf_counter())
        response = self._responses[min(self.calls, len(self._responses) - 1)]
        self.calls += 1
        for block in response.content:
            if block["type"] == "text" and callbacks.on_text is not None:
                await callbacks.on_text(block["text"])
            elif block["type"] == "tool_use" and callbacks.on_tool_start is not None:
                await callbacks.on_tool_start(block["name"])
        return response


class EncodingSink:
    """Everything ``KafkaEffectSink`` does but the produce: record, sealing, envelope, encode."""

    def __init__(self, workflow: str, sealer: Sealer, settings: Any) -> None:
        self.workflow, self.sealer = workflow, sealer
        self.agent_topic = topic_name(settings, AGENT)
        self.count = 0
        self.kinds: Counter[str] = Counter()

    async def emit(self, effect: Any) -> None:
        record = to_record(effect, self.workflow, self.sealer)
        env = Envelope(record=record, key=self.workflow, source="/voice/engine",
                       subject=effect.turn_id, correlation=self.workflow, id=effect.key)
        encode(env)
        self.count += 1
        self.kinds[type(effect).__name__] += 1


def _spec(tool_run: Callable[..., Any]) -> AgentSpec:
    tools = ToolRegistry([Tool("add", "Add two integers.", AddArgs, tool_run)])
    return AgentSpec(name="bench-agent", identity="You add numbers.", tools=tools,
                     model="claude-sonnet-4-5", fallback_models=(),
                     max_agentic_turns=TOOL_ITERATIONS + 5, loop_guard_threshold=1000,
                     failed_approach_threshold=1000)


def _sealer() -> Sealer:
    sealer = Sealer(MemoryKeyStore())
    sealer.create(CONVERSATION)
    return sealer


async def _turns(spec: AgentSpec, n: int, make_sink: Callable[[str], Any]
                 ) -> tuple[list[float], list[Any]]:
    """Per-iteration samples (between consecutive model calls of the tool-using iterations)."""
    samples: list[float] = []
    sinks = []
    for t in range(n):
        model = ZeroModel(TOOL_ITERATIONS)
        turn = f"{CONVERSATION}:turn-{2 * t + 2}"
        sink = make_sink(turn)
        result = await run_turn(spec, TurnInput(turn_id=turn, user_message="Add some numbers.",
                                                conversation_id=CONVERSATION), model, sink)
        if result.end_reason != "end_turn" or model.calls != TOOL_ITERATIONS + 1:
            raise RuntimeError(f"turn ended {result.end_reason} after {model.calls} calls: "
                               f"{result.errors}")
        samples += [b - a for a, b in zip(model.marks, model.marks[1:], strict=False)]
        sinks.append(sink)
    return samples, sinks


def traced_turns(spec: AgentSpec, n: int, make_sink: Callable[[str], Any]) -> list[float]:
    """``_turns`` as a worker without an exporter runs them: the SDK's tracer provider
    installed (no span processor), each turn inside a ``process`` span of a traced record."""
    provider = TracerProvider()
    tracing.install(provider)
    incoming = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

    async def go() -> list[float]:
        with tracing.continued("process bench", incoming):
            await _turns(spec, WARMUP_TURNS, make_sink)
            samples, _ = await _turns(spec, n, make_sink)
        return samples

    try:
        return asyncio.run(go())
    finally:
        tracing.install(None)
        provider.shutdown()


def _per_turn_effects(spec: AgentSpec, tool_iterations: int) -> dict[str, int]:
    """Effects (= records) of one turn with ``tool_iterations`` tool calls, by kind."""

    async def go() -> RecordingSink:
        sink = RecordingSink()
        model = ZeroModel(tool_iterations)
        await run_turn(spec, TurnInput(turn_id=f"{CONVERSATION}:turn-2", user_message="Add.",
                                       conversation_id=CONVERSATION), model, sink)
        return sink

    sink = asyncio.run(go())
    kinds = Counter(type(e).__name__ for e in sink.effects)
    return {"total": len(sink.effects), **dict(sorted(kinds.items()))}


@benchmark("engine.bare_tool_call")
def bare_tool_call(ctx: Context) -> Result:
    """The cheap tool called as a plain Python function (validated args), one at a time."""
    args = AddArgs(a=1, b=2)
    tctx = ToolContext(principal=None, agent_name="bench-agent", turn_id="t", tool_use_id="u")
    for _ in range(1000):
        add(args, tctx)
    samples = []
    clock = time.perf_counter
    for i in range(ctx.records):
        a = AddArgs(a=i, b=1)
        t0 = clock()
        add(a, tctx)
        samples.append(clock() - t0)
    return {**latency_summary(samples, digits=6), "tool": "add (sync, returns Ok with 1 row)"}


@benchmark("engine.iteration_overhead", baseline="engine.bare_tool_call",
           compare=("p50_ms", "p99_ms"))
def iteration_overhead(ctx: Context) -> Result:
    """One run_turn loop iteration (zero-latency model, one cheap tool), Kafka excluded."""
    sealer = _sealer()
    sync_spec, async_spec = _spec(add), _spec(add_async)

    def encoding(turn: str) -> EncodingSink:
        return EncodingSink(turn, sealer, ctx.settings)

    asyncio.run(_turns(sync_spec, WARMUP_TURNS, encoding))
    encoded, sinks = asyncio.run(_turns(sync_spec, TURNS, encoding))
    traced = traced_turns(sync_spec, TURNS, encoding)
    memory, _ = asyncio.run(_turns(sync_spec, TURNS, lambda _t: RecordingSink()))
    async_tool, _ = asyncio.run(_turns(async_spec, TURNS, encoding))

    # The same loop with every effect produced and acked on the broker, as the worker does.
    settings = ctx.settings.model_copy(update={
        "topic_prefix": f"{ctx.settings.topic_prefix}voice.bench.{ctx.run_id}.engine."})
    created = create_topics(settings)
    ctx.created_topics.extend(created)

    async def with_kafka() -> list[float]:
        producer = RecordProducer(settings)
        try:
            await _turns(sync_spec, 2, lambda t: KafkaEffectSink(producer, settings, t, sealer))
            out, _ = await _turns(sync_spec, KAFKA_TURNS,
                                  lambda t: KafkaEffectSink(producer, settings, t, sealer))
            return out
        finally:
            producer.close()

    kafka = asyncio.run(with_kafka())
    per_iteration = sinks[0].count / (TOOL_ITERATIONS + 1)
    return {
        **latency_summary(encoded),
        "turns": TURNS, "tool_iterations_per_turn": TOOL_ITERATIONS,
        "what": "model call (zero latency) → tool dispatched (sync tool, thread hop) → effects "
                "made into sealed, encoded records; not produced",
        "loop_only": latency_summary(memory),
        "traced_no_exporter": {**latency_summary(traced),
                               "what": "the same, inside a request's trace with the SDK's "
                                       "tracer provider and no exporter (a worker without "
                                       "OTEL_EXPORTER_OTLP_ENDPOINT): spans made, "
                                       "traceparent encoded in every record"},
        "async_tool": latency_summary(async_tool),
        "with_kafka_acks": {**latency_summary(kafka), "turns": KAFKA_TURNS,
                            "topic": topic_name(settings, AGENT),
                            "telemetry_topic": topic_name(settings, TELEMETRY)},
        "records_per_iteration": round(per_iteration, 2),
        "records_per_turn_20_tools": _per_turn_effects(sync_spec, TOOL_ITERATIONS),
        "records_per_turn_1_tool": _per_turn_effects(sync_spec, 1),
    }
