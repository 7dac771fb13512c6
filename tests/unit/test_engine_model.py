"""Model calls against the simulator, through the real ``anthropic`` SDK and through the lean
adapter alike: fallback chain on 429/529 (recorded), MODEL_NOT_FOUND without substitution,
malformed responses, costs."""

from __future__ import annotations

from dataclasses import replace

import anthropic
import pytest

from consumers.engine import (
    AgentSpec,
    AnthropicModel,
    ModelCallEffect,
    PersistMessage,
    RecordingSink,
    TelemetryEffect,
    ToolRegistry,
    TurnInput,
    run_turn,
)
from consumers.engine.lean import LeanModel
from consumers.engine.model import Price, cost_usd, price_for, static_system_prompt
from consumers.engine.types import Usage
from deploy.simulator import serve_simulator


@pytest.fixture(scope="module")
def sim_url():
    with serve_simulator() as url:
        yield url


@pytest.fixture(params=["sdk", "lean"])
def client(sim_url, request):
    if request.param == "lean":
        return LeanModel(sim_url, "sim")
    return anthropic.AsyncAnthropic(base_url=sim_url, api_key="sim", max_retries=0)


def with_headers(client, headers: dict[str, str]):
    """The same client, sending ``headers`` with every request."""
    if isinstance(client, LeanModel):
        return LeanModel(client.base_url, "sim", extra_headers=headers)
    return AnthropicModel(client, extra_headers=headers)


def spec(model: str, *fallbacks: str) -> AgentSpec:
    return AgentSpec(name="assistant", identity="You are the Voice assistant.",
                     tools=ToolRegistry(), model=model, fallback_models=fallbacks)


def calls(sink: RecordingSink) -> list[ModelCallEffect]:
    return sink.of(ModelCallEffect)


async def test_rate_limit_falls_back_to_the_next_model_and_is_recorded(client):
    sink = RecordingSink()
    result = await run_turn(spec("sim-fail-429", "claude-sonnet-4-5"),
                            TurnInput("t-429", "hello there, how are you"), client, sink)
    assert result.end_reason == "end_turn"
    assert "hello there, how are you" in result.final_text
    failed, ok = calls(sink)
    assert (failed.request_model, failed.error_type, failed.error_kind, failed.fallback_used) == (
        "sim-fail-429", "RateLimitError", "RATE_LIMITED", False)
    assert failed.response is None and failed.cost_usd == 0
    assert (ok.request_model, ok.error_type, ok.fallback_used) == ("claude-sonnet-4-5", None, True)
    assert ok.cost_usd > 0 and ok.cost_usd == pytest.approx(result.cost_usd)
    assert ok.input_tokens > 0 and ok.finish_reasons == ["end_turn"]
    warnings = sink.display("warning")
    assert len(warnings) == 1 and "rate limited" in warnings[0].data["text"]
    assert result.model_calls == 1


async def test_overload_then_rate_limit_walks_the_whole_chain(client):
    sink = RecordingSink()
    result = await run_turn(spec("sim-fail-529", "sim-fail-429", "claude-haiku-4-5"),
                            TurnInput("t-529", "hello again my friend"), client, sink)
    assert result.end_reason == "end_turn"
    assert [(c.request_model, c.error_type, c.fallback_used) for c in calls(sink)] == [
        ("sim-fail-529", "OverloadedError", False), ("sim-fail-429", "RateLimitError", True),
        ("claude-haiku-4-5", None, True)]


async def test_exhausted_chain_ends_the_turn_with_an_error_and_no_persisted_reply(client):
    sink = RecordingSink()
    result = await run_turn(spec("sim-fail-429", "sim-fail-529"),
                            TurnInput("t-dead", "anyone there at all"), client, sink)
    assert result.end_reason == "error" and result.errors[0].kind == "OVERLOADED"
    assert not sink.of(PersistMessage)
    assert sink.display("error")[0].data["kind"] == "OVERLOADED"
    assert sink.display()[-1].type == "done"
    assert sink.display()[-1].data["end_reason"] == "error"


async def test_unknown_explicit_model_is_model_not_found_never_a_substitute(client):
    # In the deployment's registry, unknown to the provider (a retired model, say); a model
    # outside the registry never reaches the provider (tests/unit/test_model_registry.py).
    sink = RecordingSink()
    ti = TurnInput("t-404", "hello there friend", model_override="unknown-model-9")
    registry = replace(spec("claude-sonnet-4-5", "claude-haiku-4-5"),
                       allowed_models=("unknown-model-9",))
    result = await run_turn(registry, ti, client, sink)
    assert result.end_reason == "error"
    assert [(e.kind) for e in result.errors] == ["MODEL_NOT_FOUND"]
    assert [(c.request_model, c.error_type) for c in calls(sink)] == [
        ("unknown-model-9", "NotFoundError")]  # no fallback model was tried
    assert result.final_text == "" and result.cost_usd == 0


async def test_malformed_response_is_a_model_error_not_a_crash(client):
    sink = RecordingSink()
    model = with_headers(client, {"x-simulator-fail": "malformed"})
    result = await run_turn(spec("claude-sonnet-4-5", "claude-haiku-4-5"),
                            TurnInput("t-bad", "hello there friend"), model, sink)
    assert result.end_reason == "error" and result.errors[0].kind == "MALFORMED_RESPONSE"
    assert calls(sink)[0].error_type == "MalformedResponse" and len(calls(sink)) == 1


async def test_overload_mid_stream_falls_back_and_the_partial_text_is_discarded(client):
    sink = RecordingSink()
    result = await run_turn(spec("sim-fail-midstream", "claude-sonnet-4-5"),
                            TurnInput("t-mid", "tell me a rather long story please"),
                            client, sink)
    assert result.end_reason == "end_turn"
    assert [(c.error_type, c.fallback_used) for c in calls(sink)] == [
        ("OverloadedError", False), (None, True)]
    streamed = "".join(e.data["text"] for e in sink.display("text_delta"))
    assert streamed == result.final_text  # the failed attempt's partial text never leaked
    assert sink.display("warning")[0].data["discard_partial"] is True


async def test_costs_from_the_price_table_and_unknown_models_flagged(client):
    assert price_for("claude-sonnet-4-5-20250929") == price_for("claude-sonnet-4-5")
    assert price_for("claude-sim-1") is None
    cost, known = cost_usd("claude-haiku-4-5", Usage(1_000_000, 1_000_000, 1_000_000, 1_000_000))
    p: Price = price_for("claude-haiku-4-5")
    assert known and cost == pytest.approx(p.input + p.output + p.cache_read + p.cache_write)
    sink = RecordingSink()
    result = await run_turn(spec("claude-sim-1"), TurnInput("t-free", "hi there you"),
                            client, sink)
    assert result.cost_usd == 0 and calls(sink)[0].price_known is False
    flagged = [t for t in sink.of(TelemetryEffect) if t.name == "model_price_unknown"]
    assert [t.attributes["model"] for t in flagged] == ["claude-sim-1"]


def test_static_prompt_has_identity_agent_marker_tools_and_state_note():
    from pydantic import BaseModel

    from consumers.engine import Ok, Tool

    class A(BaseModel):
        q: str

    reg = ToolRegistry([Tool("search_issues", "Search issues by text", A, lambda a, c: Ok())])
    s = AgentSpec("concern-extraction", "You extract concerns.", reg, "m",
                  tool_guidance="Search before proposing a new issue.")
    prompt = static_system_prompt(s)
    assert prompt.startswith("You extract concerns.")
    assert "[agent: concern-extraction]" in prompt
    assert "- search_issues: Search issues by text" in prompt
    assert "Search before proposing a new issue." in prompt and "[CURRENT_STATE]" in prompt
    assert static_system_prompt(s) == prompt
    explicit = AgentSpec("x", "Hi.\n[agent: compaction]", ToolRegistry(), "m")
    assert static_system_prompt(explicit).count("[agent:") == 1


async def test_inference_params_reach_every_model_call() -> None:
    """Per-request sampling (temperature, top_p, top_k) goes to each call; others are dropped."""
    from consumers.engine import AgentSpec, RecordingSink, ToolRegistry, TurnInput, run_turn
    from consumers.engine.testing import ScriptedModel

    model = ScriptedModel([[{"type": "text", "text": "fine"}]])
    spec = AgentSpec(name="t", identity="[agent: t]", tools=ToolRegistry(()), model="m")
    await run_turn(spec, TurnInput(turn_id="t-1", user_message="hi",
                                   inference_params={"temperature": 0.2, "top_p": 0.9,
                                                     "seed": 7}), model, RecordingSink())
    assert [r.sampling for r in model.requests] == [{"temperature": 0.2, "top_p": 0.9}]
