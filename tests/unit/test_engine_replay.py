"""Replay: a recorded turn re-run from its effects (model responses and tool results served
from the record) reproduces the same effects; a changed engine shows up as divergence."""

from __future__ import annotations

import dataclasses

import anthropic
import pytest
from pydantic import BaseModel

from consumers.engine import (
    AgentSpec,
    KafkaEffectSink,
    ModelCallEffect,
    Ok,
    RecordingSink,
    ReplayClient,
    Tool,
    ToolCallEffect,
    ToolRegistry,
    TurnInput,
    effects_from_envelopes,
    rerun,
    run_turn,
)
from consumers.engine.replay import compare_effects
from consumers.engine.testing import ScriptedModel, text, tool_use
from deploy.simulator import serve_simulator
from streams.envelope import decode, encode
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings

DATASET = "3fa85f64"


class DatasetArgs(BaseModel):
    dataset_id: str
    sql: str = ""
    title: str = ""


def counting_tools(counter: list[str]) -> ToolRegistry:
    def describe(args: DatasetArgs, ctx):
        counter.append("describe")
        return Ok(data={"columns": [{"name": "state", "sample_values": ["LA"]}]})

    def query(args: DatasetArgs, ctx):
        counter.append("query")
        return Ok(rows=[{"facility": "Refinery", "state": "LA", "n": 1}])

    def display_map(args: DatasetArgs, ctx):
        counter.append("map")
        return Ok(data={"shown": True})

    return ToolRegistry([Tool("describe_dataset", "Describe", DatasetArgs, describe),
                         Tool("query_dataset", "Query", DatasetArgs, query),
                         Tool("display_map", "Map", DatasetArgs, display_map)])


@pytest.fixture(scope="module")
def sim_url():
    with serve_simulator() as url:
        yield url


def spec_for(tools: ToolRegistry, model: str = "claude-sonnet-4-5", *fallbacks: str,
             **kw) -> AgentSpec:
    return AgentSpec("assistant", "You are the Voice assistant.", tools, model,
                     fallback_models=fallbacks, **kw)


TURN = TurnInput("cnv-7:turn-1", f"Show Louisiana facilities on a map. ID: {DATASET}",
                 conversation_id="cnv-7")


async def test_rerun_reproduces_the_recorded_effects_without_calling_model_or_tools(sim_url):
    client = anthropic.AsyncAnthropic(base_url=sim_url, api_key="sim", max_retries=0)
    ran: list[str] = []
    spec = spec_for(counting_tools(ran), "sim-fail-429", "claude-sonnet-4-5")
    sink = RecordingSink()
    original = await run_turn(spec, TURN, client, sink)
    assert original.end_reason == "end_turn" and ran == ["describe", "query", "map"]
    assert sink.of(ModelCallEffect)[0].error_type == "RateLimitError"  # fallback recorded too

    result, replayed, divergences = await rerun(spec, TURN, sink.effects)
    assert divergences == []
    assert ran == ["describe", "query", "map"]  # no tool ran again
    assert result.final_text == original.final_text
    assert result.messages_appended == original.messages_appended
    assert [e.key for e in replayed.effects] == [e.key for e in sink.effects]
    assert len(replayed.effects) == len(sink.effects)


async def test_a_changed_engine_shows_up_as_divergence():
    model = ScriptedModel([[tool_use("describe_dataset", {"dataset_id": "a"})],
                           [tool_use("describe_dataset", {"dataset_id": "b"})],
                           [text("Done.")]])
    spec = spec_for(counting_tools([]))
    sink = RecordingSink()
    await run_turn(spec, TurnInput("t-div", "go"), model, sink)

    _, _, same = await rerun(spec, TurnInput("t-div", "go"), sink.effects)
    assert same == []
    _, _, fewer = await rerun(dataclasses.replace(spec, max_agentic_turns=2),
                              TurnInput("t-div", "go"), sink.effects)
    assert any("not replayed" in d for d in fewer)
    assert any("effects, replay produced" in d for d in fewer)
    _, _, other_model = await rerun(dataclasses.replace(spec, model="claude-haiku-4-5"),
                                    TurnInput("t-div", "go"), sink.effects)
    assert any("asked 'claude-haiku-4-5', recorded 'claude-sonnet-4-5'" in d
               for d in other_model)
    # a tool whose recorded result changed gives a different chain
    tampered = [e.model_copy(update={"result": {**e.result, "text": "changed"}})
                if isinstance(e, ToolCallEffect) and e.tool_call_id == "toolu_scripted_1" else e
                for e in sink.effects]
    assert compare_effects(sink.effects, tampered)


async def test_replay_from_sealed_kafka_records(sim_url):
    """What ``voice replay --rerun`` does: read the records back, open them, re-run."""

    class Tee:
        def __init__(self, *sinks):
            self.sinks = sinks

        async def emit(self, effect):
            for s in self.sinks:
                await s.emit(effect)

        async def drain(self):
            for s in self.sinks:
                await s.drain()

    class FakeProducer:
        def __init__(self):
            self.wire = []

        async def send(self, topic, env):
            self.wire.append(encode(env))

    client = anthropic.AsyncAnthropic(base_url=sim_url, api_key="sim", max_retries=0)
    sealer = Sealer(MemoryKeyStore())
    producer, memory = FakeProducer(), RecordingSink()
    kafka = KafkaEffectSink(producer, VoiceSettings(topic_prefix="r."), "wf-1", sealer)
    spec = spec_for(counting_tools([]))
    original = await run_turn(spec, TURN, client, Tee(kafka, memory))

    recorded = effects_from_envelopes([decode(*w) for w in producer.wire], sealer)
    assert {type(e) for e in recorded} == {ModelCallEffect, ToolCallEffect}
    replay_client = ReplayClient(recorded)
    assert replay_client.remaining == original.model_calls
    result, replayed, divergences = await rerun(spec, TURN, recorded)
    assert divergences == []
    assert result.final_text == original.final_text
    assert compare_effects(memory.effects, replayed.effects) == []
