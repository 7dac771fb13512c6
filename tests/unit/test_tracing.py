"""Tracing without a broker: the W3C ``traceparent`` through the envelope codec, the edge's
request span, a worker's ``process`` span, the engine's GenAI spans and the telemetry rows.

Spans go to the SDK's ``InMemorySpanExporter`` (a provider installed for each test and
removed after), so every assertion is on the spans as they would be exported.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from fastapi.testclient import TestClient
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id
from pydantic import BaseModel

from api.frame.sse import event_stream
from api.frame.tracing import TraceRequests
from consumers.engine import (
    AgentSpec,
    Err,
    KafkaEffectSink,
    ModelError,
    Ok,
    Tool,
    ToolRegistry,
    TurnInput,
    run_turn,
)
from consumers.engine.testing import ScriptedModel, text, tool_use
from consumers.frame.failures import RecordGuard, consume
from schemas.agent import ModelCallRecorded, ToolCallRecorded
from schemas.conversation import ConversationStarted
from streams import tracing
from streams.envelope import Envelope, decode, encode
from streams.retry import RetryPolicy
from streams.settings import VoiceSettings
from telemetry.rows import RawRecord, map_record

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
SETTINGS = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", topic_prefix="tr.")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    return format_trace_id(ctx.trace_id), format_span_id(ctx.span_id)


def started() -> ConversationStarted:
    return ConversationStarted(conversation="cnv-1", owner="alice")


# --- the codec -------------------------------------------------------------------------------


def test_a_record_produced_inside_a_span_carries_its_traceparent(spans):
    with tracing.continued("op", {"traceparent": TRACEPARENT}) as span:
        _, _, headers = encode(Envelope(record=started(), key="cnv-1", source="/t"))
    sent = dict(headers)["traceparent"].decode()
    assert sent.split("-")[1] == TRACE  # the caller's trace
    assert sent.split("-")[2] == format_span_id(span.get_span_context().span_id) != PARENT
    k, v, h = encode(Envelope(record=started(), key="cnv-1", source="/t"))
    assert "traceparent" not in dict(h)  # outside a trace: no header
    assert decode(k, v, headers).traceparent == sent


def test_a_decoded_traceparent_is_produced_again_as_it_came():
    env = Envelope(record=started(), key="cnv-1", source="/t", traceparent=TRACEPARENT)
    k, v, h = encode(env)
    assert dict(h)["traceparent"] == TRACEPARENT.encode()
    assert decode(k, v, h).traceparent == TRACEPARENT


@pytest.mark.parametrize("bad", [b"garbage", b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01",
                                 b"\xff\xfe"])
def test_a_malformed_traceparent_never_refuses_a_record_and_is_not_continued(spans, bad):
    k, v, h = encode(Envelope(record=started(), key="cnv-1", source="/t"))
    headers = [*h, ("traceparent", bad)]
    assert decode(k, v, headers).record == started()  # still a record
    assert tracing.carried(headers) is None
    assert tracing.ids_of(bad.decode("latin-1")) == (None, None)
    with tracing.continued("op", headers) as span:  # a fresh trace instead
        assert format_trace_id(span.get_span_context().trace_id) != TRACE


def test_a_failure_marks_its_span_by_type_and_never_records_its_message(spans):
    with pytest.raises(ValueError), tracing.span("step"):
        raise ValueError("my neighbour Ann Smith at 12 Oak Street said …")
    [step] = spans.get_finished_spans()
    assert step.status.status_code == StatusCode.ERROR
    assert step.attributes["error.type"] == "ValueError"
    assert step.events == ()  # no exception event: its message could quote someone


def test_every_events_row_names_the_span_its_record_was_produced_in():
    k, v, h = encode(Envelope(record=started(), key="cnv-1", source="/t",
                              traceparent=TRACEPARENT))
    [row] = map_record(RawRecord("tr.voice.commands", 0, 1, k, v, h)).as_dicts("events")
    assert (row["trace_id"], row["span_id"]) == (TRACE, PARENT)
    garbage = RawRecord("tr.voice.commands", 0, 2, b"k", b"\xff", [("traceparent",
                                                                       TRACEPARENT.encode())])
    [row] = map_record(garbage).as_dicts("events")
    assert row["ce_type"] == "undecodable" and (row["trace_id"], row["span_id"]) == (TRACE,
                                                                                      PARENT)
    k, v, h = encode(Envelope(record=started(), key="cnv-1", source="/t"))
    [row] = map_record(RawRecord("tr.voice.commands", 0, 3, k, v, h)).as_dicts("events")
    assert (row["trace_id"], row["span_id"]) == (None, None)


def test_ids_of_a_traceparent():
    assert tracing.ids_of(TRACEPARENT) == (TRACE, PARENT)
    assert tracing.ids_of(None) == (None, None)


CONFIGURED = """
from streams import tracing
provider = tracing.configure("voice-test")
print("disabled" if provider is None else provider.resource.attributes["service.name"])
"""


@pytest.mark.parametrize(("env", "out"), [
    ({}, "voice-test"), ({"OTEL_SERVICE_NAME": "edge-eu"}, "edge-eu"),
    ({"OTEL_SDK_DISABLED": "true"}, "disabled"),
])
def test_configure_names_the_service_and_honours_otel_sdk_disabled(env, out):
    # In a process of its own: the global tracer provider can be set once per process.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", CONFIGURED], env={**clean, **env},
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == out


def test_spans_are_exported_only_with_an_endpoint(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.otlp_exporter() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    exporter = tracing.otlp_exporter()
    assert isinstance(exporter, OTLPSpanExporter)
    assert exporter._endpoint == "http://collector:4318/v1/traces"
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:4318/t")
    assert tracing.otlp_exporter()._endpoint == "http://other:4318/t"


# --- the edge --------------------------------------------------------------------------------


def edge_app(seen: list[str | None]) -> FastAPI:
    app = FastAPI()

    @app.get("/items/{item_id}")
    async def item(item_id: str) -> dict[str, str]:
        seen.append(tracing.current_traceparent())
        return {"id": item_id}

    @app.get("/broken")
    async def broken() -> dict[str, str]:
        raise RuntimeError("boom")

    @app.get("/events/{topic}", response_class=Response, response_model=None)
    async def events(topic: str) -> EventSourceResponse:
        async def endless() -> AsyncIterator[ServerSentEvent]:
            yield ServerSentEvent(comment="open")
            while True:
                await asyncio.sleep(3600)
                yield ServerSentEvent(comment="keep-alive")  # never reached

        return event_stream(endless())

    app.add_middleware(TraceRequests)
    return app


def test_the_edge_continues_the_callers_trace_and_names_the_route(spans):
    seen: list[str | None] = []
    with TestClient(edge_app(seen)) as client:
        assert client.get("/items/abc", headers={"traceparent": TRACEPARENT}).status_code == 200
    [server] = named(spans, "GET")
    assert server.name == "GET /items/{item_id}"  # the template, never the id
    assert server.kind == SpanKind.SERVER and server.parent is not None
    assert format_span_id(server.parent.span_id) == PARENT
    assert hex_ids(server)[0] == TRACE
    assert server.attributes["http.route"] == "/items/{item_id}"
    assert server.attributes["http.response.status_code"] == 200
    # What the route produces carries the server span: the worker continues from it.
    assert seen == [f"00-{TRACE}-{hex_ids(server)[1]}-01"]


def test_the_edge_starts_a_trace_when_the_request_has_none_or_a_bad_one(spans):
    seen: list[str | None] = []
    with TestClient(edge_app(seen)) as client:
        assert client.get("/items/a").status_code == 200
        assert client.get("/items/b", headers={"traceparent": "nonsense"}).status_code == 200
    first, second = named(spans, "GET /items")
    assert first.parent is None and second.parent is None
    assert hex_ids(first)[0] != hex_ids(second)[0]
    assert all(tp is not None and tp.split("-")[1] != TRACE for tp in seen)


def test_a_streams_span_ends_when_its_response_starts_not_with_the_stream(spans):
    with TestClient(edge_app([])) as client, client.stream("GET", "/events/news") as r:
        assert r.status_code == 200
        next(r.iter_lines())  # the stream is open, and stays open
        [server] = named(spans, "GET /events")
        assert server.name == "GET /events/{topic}"
        assert server.attributes["http.response.status_code"] == 200
        assert server.status.status_code != StatusCode.ERROR


def test_the_edge_app_leaves_request_spans_to_trace_requests(tmp_path):
    """FastAPI's own telemetry (on once a process has a tracer provider, as every Voice
    process does) would add a second server span per request and wrap every stream's
    messages: the edge's app turns it off."""
    from api.app import create_app

    app = create_app(VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1",
                                   state_dir=tmp_path))
    provider = TracerProvider()
    app._native_telemetry.config["tracer_provider"] = provider  # configured, as in production
    assert not app._native_telemetry.enabled()


def test_a_failing_route_marks_its_span_in_error(spans):
    with TestClient(edge_app([]), raise_server_exceptions=False) as client:
        assert client.get("/broken").status_code == 500
    [server] = named(spans, "GET /broken")
    assert server.status.status_code == StatusCode.ERROR


# --- the worker's consumers ------------------------------------------------------------------


class _Message:
    def __init__(self, offset: int, env: Envelope) -> None:
        self.partition, self.offset, self.topic = 3, offset, "tr.voice.conversations"
        self.key, self.value, headers = encode(env)
        self.headers = list(headers)


class _Event:
    def __init__(self, message: _Message) -> None:
        self.message = message

    def ack(self) -> bool:
        return True


async def _events(*events: _Event) -> AsyncIterator[_Event]:
    for e in events:
        yield e


def test_a_consumer_continues_the_trace_of_a_traced_record_and_starts_none_otherwise(spans):
    traced = _Event(_Message(1, Envelope(record=started(), key="cnv-1", source="/t",
                                         traceparent=TRACEPARENT)))
    untraced = _Event(_Message(2, Envelope(record=started(), key="cnv-1", source="/t")))
    produced: list[str | None] = []

    async def dispatch(raw: Any, event: Any) -> None:
        # What a handler produces: the envelope codec takes the current span's context.
        _, _, headers = encode(Envelope(record=started(), key="cnv-1", source="/w"))
        produced.append(dict(headers).get("traceparent", b"").decode() or None)

    async def halt(exc: BaseException) -> None:
        raise AssertionError(exc)

    guard = RecordGuard("agent", lambda: None, RetryPolicy(1, 0, 0))  # type: ignore[arg-type,return-value]
    asyncio.run(consume(_events(traced, untraced), "tr.voice.conversations", guard, dispatch,
                        False, halt))
    [process] = spans.get_finished_spans()
    assert process.name == "process tr.voice.conversations"
    assert process.kind == SpanKind.CONSUMER
    assert format_span_id(process.parent.span_id) == PARENT and hex_ids(process)[0] == TRACE
    assert process.attributes["messaging.kafka.offset"] == 1
    assert produced == [f"00-{TRACE}-{hex_ids(process)[1]}-01", None]


# --- the engine ------------------------------------------------------------------------------


class LookupArgs(BaseModel):
    query: str


def registry() -> ToolRegistry:
    def lookup(args: LookupArgs, ctx: Any) -> Ok | Err:
        if args.query == "fail":
            return Err("no such thing", "not_found")
        return Ok(data={"found": args.query})

    return ToolRegistry([Tool("lookup", "Look something up", LookupArgs, lookup)])


class Sender:
    """A ``RecordSender`` that encodes as the producer does (in the task the sink made)."""

    def __init__(self) -> None:
        self.sent: list[tuple[Envelope, dict[str, bytes]]] = []

    async def send(self, topic: str, env: Envelope) -> None:
        _, _, headers = encode(env)
        self.sent.append((env, dict(headers)))


def spec() -> AgentSpec:
    return AgentSpec(name="assistant", identity="You help.", tools=registry(),
                     model="claude-sonnet-4-5", fallback_models=("claude-haiku-4-5",))


async def test_a_turn_is_an_agent_span_with_chat_and_execute_tool_children(spans):
    model = ScriptedModel([
        ModelError("OVERLOADED", "busy", error_type="OverloadedError", fallback=True),
        [tool_use("lookup", {"query": "oak street"}), tool_use("lookup", {"query": "fail"})],
        [text("Found it.")],
    ])
    sender = Sender()
    sink = KafkaEffectSink(sender, SETTINGS, "cnv-1:turn-1", tenant="acme")
    with tracing.continued("process tr.voice.workflows", {"traceparent": TRACEPARENT}):
        result = await run_turn(spec(), TurnInput("cnv-1:turn-1", "where?"), model, sink)
    assert result.end_reason == "end_turn"

    [agent] = named(spans, "invoke_agent")
    assert agent.name == "invoke_agent assistant" and hex_ids(agent)[0] == TRACE
    assert agent.attributes["gen_ai.agent.name"] == "assistant"
    chats = named(spans, "chat ")
    # Each step starts at the primary model; the first fell back to the next one.
    assert [c.name for c in chats] == ["chat claude-sonnet-4-5", "chat claude-haiku-4-5",
                                       "chat claude-sonnet-4-5"]
    assert all(c.parent.span_id == agent.context.span_id and c.kind == SpanKind.CLIENT
               for c in chats)
    overloaded, tools_call, final = chats
    assert overloaded.status.status_code == StatusCode.ERROR
    assert overloaded.attributes["error.type"] == "OverloadedError"
    a = final.attributes
    assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["gen_ai.system"],
            a["gen_ai.request.model"]) == ("chat", "anthropic", "anthropic", "claude-sonnet-4-5")
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("end_turn",)
    assert tuple(tools_call.attributes["gen_ai.response.finish_reasons"]) == ("tool_use",)
    assert tools_call.attributes["voice.fallback_used"] is True
    assert a["voice.fallback_used"] is False

    ok, err = named(spans, "execute_tool")
    assert ok.name == err.name == "execute_tool lookup"
    assert all(t.parent.span_id == agent.context.span_id for t in (ok, err))
    assert ok.attributes["gen_ai.tool.name"] == "lookup"
    assert ok.attributes["gen_ai.tool.call.id"] != err.attributes["gen_ai.tool.call.id"]
    assert ok.status.status_code != StatusCode.ERROR
    assert (err.status.status_code, err.attributes["error.type"]) == (StatusCode.ERROR,
                                                                      "not_found")
    # Nothing anyone wrote is on a span: only names, models, counts and ids.
    assert not any("oak street" in str(v) or "where?" in str(v)
                   for s in spans.get_finished_spans() for v in s.attributes.values())

    # Each call's record carries its own span's traceparent; the sink's rows name that span.
    by_id = {hex_ids(s)[1]: s for s in spans.get_finished_spans()}
    calls = [(env, h) for env, h in sender.sent
             if isinstance(env.record, (ModelCallRecorded, ToolCallRecorded))]
    assert len(calls) == 5
    for env, headers in calls:
        trace_id, span_id = tracing.ids_of(headers["traceparent"].decode())
        assert trace_id == TRACE
        span = by_id[span_id]
        if isinstance(env.record, ModelCallRecorded):
            assert span.name == f"chat {env.record.request_model}"
        else:
            assert span.name == "execute_tool lookup"
            assert span.attributes["gen_ai.tool.call.id"] == env.record.tool_call_id
        k, v, h = encode(Envelope(record=env.record, key=env.key, source=env.source,
                                  id=env.id, traceparent=headers["traceparent"].decode()))
        rows = map_record(RawRecord("tr.voice.agent", 0, 1, k, v, h))
        table = "model_calls" if isinstance(env.record, ModelCallRecorded) else "tool_calls"
        [row] = rows.as_dicts(table)
        assert (row["trace_id"], row["span_id"]) == (TRACE, span_id)


async def test_without_a_provider_the_engine_passes_the_incoming_trace_along():
    tracing.install(None)  # the API's no-op provider: OTEL_SDK_DISABLED, or a library use
    sender = Sender()
    sink = KafkaEffectSink(sender, SETTINGS, "wf-1")
    with tracing.continued("process", {"traceparent": TRACEPARENT}):
        await run_turn(spec(), TurnInput("wf-1", "hi"), ScriptedModel([[text("hello")]]), sink)
    assert {h.get("traceparent") for _, h in sender.sent} == {TRACEPARENT.encode()}


# --- a process that exports no spans ---------------------------------------------------------


def traceparents_under(provider: Any, incoming: str | None) -> list[str | None]:
    """What records produced in a consumer's span and in a child span of it would carry."""
    tracing.install(provider)
    try:
        seen = []
        with tracing.continued("process voice.commands", {"traceparent": incoming}
                               if incoming else None, attributes={"messaging.system": "kafka"}):
            seen.append(tracing.current_traceparent())
            with tracing.span("child", attributes={"n": 1}):
                seen.append(tracing.current_traceparent())
            seen.append(tracing.current_traceparent())
        seen.append(tracing.current_traceparent())  # outside: nothing
        return seen
    finally:
        tracing.install(None)


def shape(traceparents: list[str | None], incoming: str | None) -> list[tuple[Any, ...]]:
    """Each traceparent as (version, same trace as the incoming one, flags), and which of them
    share a span id — what the ids are, not their random values."""
    spans = [tp.split("-")[2] if tp else None for tp in traceparents]
    out = []
    for tp, sid in zip(traceparents, spans, strict=True):
        if tp is None:
            out.append((None,))
            continue
        version, trace_id, span_id, flags = tp.split("-")
        out.append((version, incoming is not None and trace_id == incoming.split("-")[1],
                    len(trace_id), len(span_id), flags, spans.index(sid),
                    incoming is not None and span_id == incoming.split("-")[2]))
    return out


@pytest.mark.parametrize("incoming", [None, TRACEPARENT, f"00-{TRACE}-{PARENT}-00",
                                      f"00-{TRACE}-{PARENT}-03", f"00-{TRACE}-{PARENT}-ff",
                                      "00-not-a-trace-01"])
def test_without_an_exporter_records_carry_the_traceparents_the_sdk_would_give(incoming):
    # IdsOnly (no exporter: nothing recorded) and the SDK's provider: the same trace continued,
    # the same flags, a new span id for each span — only the random ids differ.
    ids_only = traceparents_under(tracing.IdsOnly(None), incoming)
    sdk = traceparents_under(TracerProvider(), incoming)
    assert shape(ids_only, incoming) == shape(sdk, incoming)
    assert ids_only[0] is not None and ids_only[1] != ids_only[0] and ids_only[2] == ids_only[0]
    if incoming == TRACEPARENT:
        assert ids_only[0].startswith(f"00-{TRACE}-") and ids_only[0].endswith("-01")
    if incoming is None:  # a new trace each time: sampled, its trace id random
        assert ids_only[0].endswith("-03")
        again = traceparents_under(tracing.IdsOnly(None), incoming)
        assert again[0].split("-")[1] != ids_only[0].split("-")[1]


def test_without_an_exporter_nothing_is_recorded_and_a_failure_is_still_raised():
    tracing.install(tracing.IdsOnly(None))
    try:
        with pytest.raises(ValueError), tracing.span("step") as current:
            assert not current.is_recording()
            assert tracing.current_traceparent() is not None
            raise ValueError("words of someone")
        assert tracing.current_traceparent() is None, "the span is no longer current"
    finally:
        tracing.install(None)


CONFIGURED_KIND = """
from streams import tracing
print(type(tracing.configure("voice-test")).__name__)
"""


@pytest.mark.parametrize(("env", "kind"), [
    ({}, "IdsOnly"), ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, "TracerProvider"),
])
def test_configure_records_spans_only_for_an_exporter(env, kind):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", CONFIGURED_KIND], env={**clean, **env},
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == kind
