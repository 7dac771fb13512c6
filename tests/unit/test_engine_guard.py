"""The loop guard (4th identical call refused, not executed) and the failed-approach hint."""

from __future__ import annotations

import json

from pydantic import BaseModel

from consumers.engine import (
    AgentSpec,
    Err,
    Ok,
    RecordingSink,
    TelemetryEffect,
    Tool,
    ToolCallEffect,
    ToolRegistry,
    TurnInput,
    run_turn,
)
from consumers.engine.guard import LoopGuard, args_hash
from consumers.engine.testing import ScriptedModel, text, tool_use


class MapArgs(BaseModel):
    dataset_id: str
    reasoning: str = ""
    explanation: str = ""


def test_args_hash_ignores_narration_keys_only():
    base = {"dataset_id": "d1", "sql": "SELECT 1"}
    narrated = {**base, "reasoning": "because", "explanation": "x", "thought": "t",
                "rationale": "r", "justification": "j"}
    assert args_hash(base) == args_hash(narrated)
    assert args_hash(base) == args_hash({"sql": "SELECT 1", "dataset_id": "d1"})
    assert args_hash(base) != args_hash({**base, "sql": "SELECT 2"})


def test_guard_needs_same_args_and_same_result_three_times_in_a_row():
    g = LoopGuard(threshold=3)
    same = Ok(rows=[{"a": 1}])
    for _ in range(3):
        assert g.check("t", {"x": 1}) is None
        g.record("t", {"x": 1}, same)
    refusal = g.check("t", {"x": 1, "reasoning": "once more"})
    assert isinstance(refusal, Err) and refusal.err_kind == "loop_guard"
    assert g.check("t", {"x": 2}) is None and g.check("u", {"x": 1}) is None
    # a different result in the run resets it
    g2 = LoopGuard(threshold=3)
    for i in range(3):
        g2.record("t", {"x": 1}, Ok(rows=[{"a": i}]))
    assert g2.check("t", {"x": 1}) is None
    # an interleaved other call breaks "in a row"
    g3 = LoopGuard(threshold=3)
    for name in ("t", "t", "u", "t"):
        g3.record(name, {"x": 1}, same)
    assert g3.check("t", {"x": 1}) is None


def spec_with(tools: list[Tool], **kw) -> AgentSpec:
    return AgentSpec(name="assistant", identity="You help.", tools=ToolRegistry(tools),
                     model="claude-sonnet-4-5", **kw)


async def test_fourth_identical_call_is_refused_and_not_executed_even_with_new_narration():
    runs = []

    def display_map(args: MapArgs, ctx):
        runs.append(args.dataset_id)
        return Ok(data={"shown": args.dataset_id})

    calls = [[tool_use("display_map", {"dataset_id": "d1", "reasoning": f"try {i}",
                                       "explanation": "x" * i})] for i in range(5)]
    model = ScriptedModel([*calls, [text("Done.")]])
    sink = RecordingSink()
    spec = spec_with([Tool("display_map", "Show a map", MapArgs, display_map)])
    result = await run_turn(spec, TurnInput("t-guard", "map it"), model, sink)

    assert result.end_reason == "end_turn" and result.final_text == "Done."
    assert runs == ["d1", "d1", "d1"]  # the 4th and 5th calls never ran
    tool_calls = sink.of(ToolCallEffect)
    assert [t.envelope for t in tool_calls] == ["ok", "ok", "ok", "err", "err"]
    assert [t.err_kind for t in tool_calls][3:] == ["loop_guard", "loop_guard"]
    assert [t.executed for t in tool_calls] == [True, True, True, False, False]
    # the model was told why, in the tool_result it got back
    fifth_request = model.requests[4].messages
    last_results = [m for m in fifth_request if m["role"] == "user"
                    and isinstance(m["content"], list)
                    and any(b.get("type") == "tool_result" for b in m["content"])][-1]
    assert "loop_guard" in last_results["content"][0]["content"]
    assert last_results["content"][0]["is_error"] is True
    envelopes = [e for e in sink.of(TelemetryEffect) if e.name == "contract_envelope"]
    assert [e.attributes["err_kind"] for e in envelopes][3:] == ["loop_guard", "loop_guard"]


async def test_repeated_failures_get_a_soft_hint_and_the_turn_goes_on():
    def flaky(args: MapArgs, ctx):
        raise ConnectionError("warehouse unreachable")

    model = ScriptedModel([[tool_use("query", {"dataset_id": "d1"})],
                           [tool_use("query", {"dataset_id": "d1", "reasoning": "retry"})],
                           [tool_use("query", {"dataset_id": "d2"})],
                           [text("I could not reach the data.")]])
    sink = RecordingSink()
    result = await run_turn(spec_with([Tool("query", "Query", MapArgs, flaky)]),
                            TurnInput("t-soft", "query it"), model, sink)
    assert result.end_reason == "end_turn"
    texts = [t.result["text"] for t in sink.of(ToolCallEffect)]
    assert "consider a different approach" not in texts[0]
    assert "consider a different approach" in texts[1]          # same call failed twice
    assert "consider a different approach" not in texts[2]      # other arguments
    assert all(t.err_kind == "ConnectionError" for t in sink.of(ToolCallEffect))
    sent = json.dumps(model.requests[2].messages)
    assert "consider a different approach" in sent  # the model saw it
