"""History budget and summaries (compaction model through the simulator), and the context
guard: compact the largest old tool results at 80 %, stop at 95 %, calibrated estimates."""

from __future__ import annotations

import json

import anthropic
import pytest
from pydantic import BaseModel

from consumers.engine import (
    AgentSpec,
    HistorySummary,
    ModelCallEffect,
    Ok,
    RecordingSink,
    TelemetryEffect,
    Tool,
    ToolRegistry,
    TurnInput,
    run_turn,
)
from consumers.engine.history import (
    IMAGE_TOKENS,
    Calibration,
    ContextGuard,
    choose_cut,
    estimate_tokens,
    transcript,
)
from consumers.engine.testing import ScriptedModel, text, tool_use
from deploy.simulator import serve_simulator


@pytest.fixture(scope="module")
def sim_url():
    with serve_simulator() as url:
        yield url


def long_history(exchanges: int, size: int = 400) -> list[dict]:
    out: list[dict] = []
    for i in range(exchanges):
        out.append({"role": "user", "content": f"question {i}: " + "lorem ipsum " * (size // 12)})
        out.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]})
    return out


def _compact(obj: object) -> int:
    text = json.dumps(obj, ensure_ascii=False, default=str, separators=(",", ":"))
    return (len(text) + 3) // 4


@pytest.mark.parametrize("obj", [
    [{"role": "user", "content": "Grüße aus Köln, 你好, emoji 🎉, \u2028 and \x01\x1f\x7f"}],
    [{"role": "user", "content": [{"type": "text", "text": 'quotes " and \\ and \n\t'}]}],
    [{"type": "tool_use", "id": "t", "name": "n", "input": {"a": [1, 2.5, None, True]}}],
    {"nested": {"deep": [[[]], {}]}},
    [{"text": '"type":"image" inside a string is text, not a block'}],
])
def test_estimate_counts_the_characters_of_the_compact_json(obj):
    assert estimate_tokens(obj) == _compact(obj)


@pytest.mark.parametrize("obj", [
    {1: "a key that is not a string"},
    [{"n": 2 ** 70}],
    [{"text": "a lone surrogate \ud800"}],
    [{"when": object.__new__(Calibration)}],  # not JSON: its str(), as before
])
def test_estimate_of_what_orjson_refuses_is_the_standard_librarys(obj):
    assert estimate_tokens(obj) == _compact(obj)


def test_an_image_block_counts_as_image_tokens_not_its_base64():
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "A" * 400_000}}
    msgs = [{"role": "user", "content": [image, {"type": "text", "text": "what is this?"}]}]
    bare = [{"role": "user", "content": [{"type": "image"},
                                         {"type": "text", "text": "what is this?"}]}]
    assert estimate_tokens(msgs) == _compact(bare) + IMAGE_TOKENS


def test_estimate_and_calibration():
    assert estimate_tokens("x" * 400) == 100
    assert estimate_tokens([{"a": "b"}]) == (len('[{"a":"b"}]') + 3) // 4  # compact JSON
    c = Calibration()
    assert c.apply(1000) == 1000
    c.observe(1000, 1500)
    assert c.apply(1000) == 1500
    c.observe(100, 100_000)
    assert c.ratio == 4.0  # clamped: one odd call must not make the guard absurd
    c.observe(0, 10)
    assert c.ratio == 4.0


def test_context_guard_thresholds():
    g = ContextGuard(context_window=11_000, max_output_tokens=1_000)
    assert g.limit == 10_000
    assert (g.assess(7_999), g.assess(8_000), g.assess(9_499), g.assess(9_500)) == (
        "ok", "compact", "compact", "stop")


def test_cut_never_separates_a_tool_result_from_its_call():
    h = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "r"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
        {"role": "user", "content": [{"type": "text", "text": "c"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "x",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2",
                                      "content": "r"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "d"}]},
    ]
    assert choose_cut(h, keep=3) == 4   # no user text in the last 3: the nearest older one
    assert choose_cut(h, keep=4) == 4
    assert choose_cut(h, keep=100) == 4
    assert choose_cut(h[:4], keep=2) == 0  # nothing to summarise without splitting
    assert "[2] tool result (t1): r" in transcript(h)


async def test_over_budget_history_is_summarised_by_the_compaction_model(sim_url):
    client = anthropic.AsyncAnthropic(base_url=sim_url, api_key="sim", max_retries=0)
    spec = AgentSpec("assistant", "You help.", ToolRegistry(), "claude-sonnet-4-5",
                     compaction_model="claude-haiku-4-5", history_token_budget=500,
                     history_recent_keep=4, history_raw_share=1.0)
    history = long_history(10)
    sink = RecordingSink()
    result = await run_turn(spec, TurnInput("t-sum", "what did I ask first?", history=history),
                            client, sink)
    assert result.end_reason == "end_turn"
    compaction, reply = sink.of(ModelCallEffect)
    assert (compaction.agent_name, compaction.request_model) == ("compaction", "claude-haiku-4-5")
    assert compaction.cost_usd > 0 and result.cost_usd == pytest.approx(
        compaction.cost_usd + reply.cost_usd)
    summary = result.summary
    assert summary is not None and summary.summary_through == 16  # the last 4 stay raw
    assert summary.text.startswith("Summary: [0] user: question 0:")
    events = [t for t in sink.of(TelemetryEffect) if t.name == "history_summarised"]
    assert events[0].attributes["summary_through"] == 16

    # a stored summary that still covers the right prefix is reused: no compaction call
    model = ScriptedModel([[text("fine")]])
    sink2 = RecordingSink()
    stored = HistorySummary("Summary: the user asked ten questions.", 16)
    r2 = await run_turn(spec, TurnInput("t-sum2", "and then?", history=history, summary=stored),
                        model, sink2)
    assert r2.summary == stored and not r2.summarised and len(model.requests) == 1
    assert result.summarised
    msgs = model.requests[0].messages
    assert msgs[0]["content"][0]["text"].startswith("[CONVERSATION SUMMARY of messages 0-15]")
    assert "the user asked ten questions" in msgs[0]["content"][0]["text"]
    assert msgs[0]["content"][1]["text"] == history[16]["content"]
    assert msgs[1:4] == history[17:20]
    assert "question 3:" not in json.dumps(msgs)  # the old part is gone
    # a stored summary that, with what follows it, is over the budget is updated
    # incrementally: from itself and the messages after it, never the whole history again
    model = ScriptedModel([[text("Summary: new")], [text("fine")]])
    r3 = await run_turn(spec, TurnInput("t-sum3", "and?", history=history,
                                        summary=HistorySummary("old", 8)), model, RecordingSink())
    assert r3.summary == HistorySummary("Summary: new", 16) and r3.summarised
    assert "[agent: compaction]" in model.requests[0].system[0]["text"]
    seen = model.requests[0].messages[0]["content"]  # nothing truncated after the old summary
    assert seen.startswith("[PREVIOUS SUMMARY of messages 0-7]\nold")
    assert all(m["content"] in seen for m in history[8:16:2])
    assert "answer 3" not in seen and "question 0:" not in seen  # covered by "old"
    assert "answer 7" in seen and "question 8:" not in seen


class BigArgs(BaseModel):
    n: int


def big_tools() -> ToolRegistry:
    def fetch(args: BigArgs, ctx):
        return Ok(data={"blob": f"{args.n}:" + "y" * 6000})

    return ToolRegistry([Tool("fetch", "Fetch a blob", BigArgs, fetch)])


async def test_largest_old_tool_results_are_compacted_at_80_percent_keeping_call_ids():
    model = ScriptedModel([[tool_use("fetch", {"n": i})] for i in range(4)] + [[text("done")]])
    spec = AgentSpec("assistant", "You help.", big_tools(), "claude-sonnet-4-5",
                     context_window=6_000, max_output_tokens=1_000)
    sink = RecordingSink()
    result = await run_turn(spec, TurnInput("t-80", "fetch things"), model, sink)
    assert result.end_reason == "end_turn", result.warnings
    compactions = [t for t in sink.of(TelemetryEffect) if t.name == "context_compacted"]
    assert compactions and compactions[0].attributes["tokens_before"] >= 0.8 * 5_000
    assert compactions[0].attributes["tokens_after"] <= 0.6 * 5_000
    last = model.requests[-1].messages
    results = [b for m in last if isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [f"toolu_scripted_{i}" for i in range(1, 5)]
    assert results[0]["content"].startswith("[compacted:")
    assert "toolu_scripted_1" in results[0]["content"]
    assert not results[-1]["content"].startswith("[compacted:")  # the latest stays whole
    # the canonical chain keeps every result in full
    persisted = [b for m in result.messages_appended if m["role"] == "user"
                 for b in m["content"]]
    assert all("y" * 6000 in b["content"] for b in persisted)


async def test_the_loop_stops_at_95_percent_with_context_limit():
    model = ScriptedModel([[text("never")]])
    spec = AgentSpec("assistant", "You help.", ToolRegistry(), "claude-sonnet-4-5",
                     context_window=3_000, max_output_tokens=1_000,
                     history_token_budget=10**9)
    sink = RecordingSink()
    result = await run_turn(spec, TurnInput("t-95", "z" * 8_000), model, sink)
    assert result.end_reason == "context_limit" and model.requests == []
    assert "too long" in sink.display("warning")[0].data["text"]
    assert sink.display("done")[0].data["end_reason"] == "context_limit"


async def test_the_estimate_is_calibrated_by_the_real_input_tokens():
    # limit 14k tokens; requests grow ~0.3k → ~1.9k → ~3.4k (each result is ~1.5k tokens)
    spec = AgentSpec("assistant", "You help.", big_tools(), "claude-sonnet-4-5",
                     context_window=15_000, max_output_tokens=1_000)
    steps = [[tool_use("fetch", {"n": 1})], [tool_use("fetch", {"n": 2})], [text("done")]]

    def honest(req):
        return len(json.dumps([req.system, req.tools, req.messages])) // 4

    def compacted(sink: RecordingSink) -> list[TelemetryEffect]:
        return [t for t in sink.of(TelemetryEffect) if t.name == "context_compacted"]

    plain, sink1 = ScriptedModel(steps, input_tokens=honest), RecordingSink()
    r1 = await run_turn(spec, TurnInput("t-cal1", "go"), plain, sink1)
    assert r1.end_reason == "end_turn" and compacted(sink1) == []
    # the provider counts 4x the estimate: the third request (~3.4k estimated) is ~13.6k real,
    # past 80 % of 14k, so old results are compacted before it is sent
    skewed, sink2 = ScriptedModel(steps, input_tokens=lambda r: honest(r) * 4), RecordingSink()
    r2 = await run_turn(spec, TurnInput("t-cal2", "go"), skewed, sink2)
    assert r2.end_reason == "end_turn"
    (event,) = compacted(sink2)
    assert event.attributes["tokens_before"] >= 0.8 * 14_000
    assert skewed.requests[2].messages[2]["content"][0]["content"].startswith("[compacted:")
