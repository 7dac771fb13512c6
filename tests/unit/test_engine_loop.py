"""The turn loop end to end: the simulator's map flow through the real SDK, the prompt's byte
stability, [CURRENT_STATE], persistence, max turns, cancellation, cards, plans and labels."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime

import anthropic
import httpx2
import numpy as np
import pytest
from pydantic import BaseModel

from consumers.engine import (
    AgentSpec,
    CancelToken,
    Card,
    Ok,
    PersistMessage,
    PlanStep,
    PlanUpdate,
    RecordingSink,
    StateView,
    TelemetryEffect,
    Tool,
    ToolCallEffect,
    ToolRegistry,
    TurnInput,
    run_turn,
)
from consumers.engine.testing import ScriptedModel, text, tool_use
from deploy.simulator import serve_simulator

DATASET = "3fa85f64"
FACILITIES = [
    {"facility": "Baton Rouge Refinery", "state": "LA", "lat": np.float64(30.45),
     "lon": -91.19, "permits": np.int64(3), "inspected": datetime(2024, 5, 1, tzinfo=UTC)},
    {"facility": "Lake Charles Works", "state": "LA", "lat": 30.22, "lon": -93.21,
     "permits": 1, "inspected": None},
]


class DatasetArgs(BaseModel):
    dataset_id: str


class QueryArgs(BaseModel):
    dataset_id: str
    sql: str


class MapArgs(BaseModel):
    dataset_id: str
    sql: str = ""
    title: str = ""


def map_tools(seen: dict) -> ToolRegistry:
    def describe(args: DatasetArgs, ctx):
        seen.setdefault("principals", []).append(ctx.principal)
        return Ok(data={"columns": [{"name": "facility"},
                                    {"name": "state", "sample_values": ["LA", "TX"]}],
                        "row_count": 120})

    def query(args: QueryArgs, ctx):
        seen["sql"] = args.sql
        return Ok(rows=[r for r in FACILITIES if f"'{r['state']}'" in args.sql])

    async def display_map(args: MapArgs, ctx):
        layer = {"name": args.title, "points": [[30.45, -91.19]],
                 "stats": {"mean": np.float64("nan"), "n": np.int64(2)},
                 "raw": b"\x00\x01", "at": datetime(2024, 1, 1)}
        return Ok(data={"shown": True},
                  effects=(Card("map_display", {"layers": [layer]}, display_id="main-map"),))

    return ToolRegistry([
        Tool("describe_dataset", "Describe a dataset's columns", DatasetArgs, describe),
        Tool("query_dataset", "Run SQL on a dataset", QueryArgs, query),
        Tool("display_map", "Show rows on a map", MapArgs, display_map),
    ])


@pytest.fixture(scope="module")
def sim_url():
    with serve_simulator() as url:
        yield url


@pytest.fixture
def captured(sim_url):
    bodies: list[dict] = []

    async def hook(request: httpx2.Request) -> None:
        if request.url.path.endswith("/v1/messages"):
            bodies.append(json.loads(request.content))

    http = httpx2.AsyncClient(event_hooks={"request": [hook]})
    client = anthropic.AsyncAnthropic(base_url=sim_url, api_key="sim", max_retries=0,
                                      http_client=http)
    return client, bodies


def assistant_spec(tools: ToolRegistry, **kw) -> AgentSpec:
    return AgentSpec(name="assistant", identity="You are the Voice assistant.", tools=tools,
                     model="claude-sonnet-4-5", **kw)


async def test_map_flow_prompt_is_byte_stable_and_state_is_last_and_never_persisted(captured):
    client, bodies = captured
    seen: dict = {}
    views: list[StateView] = []

    def state(view: StateView) -> str:
        views.append(view)
        return f"session: map request #{view.iteration}"

    sink = RecordingSink()
    ti = TurnInput("cnv-1:turn-1", f"Show me RCRA facilities in Louisiana on a map. ID: {DATASET}",
                   conversation_id="cnv-1", state_provider=state, principal="alice",
                   dataset_ids=(DATASET,))
    result = await run_turn(assistant_spec(map_tools(seen)), ti, client, sink)

    assert result.end_reason == "end_turn", result
    assert "Louisiana" in result.final_text and "2 matching rows" in result.final_text
    assert seen["sql"] == "SELECT * FROM data WHERE state = 'LA'"
    assert seen["principals"] == ["alice"]
    assert len(bodies) == 4 and result.model_calls == 4
    # static prompt and tools: byte-identical on every iteration, cached system block
    assert len({json.dumps(b["system"]) for b in bodies}) == 1
    assert len({json.dumps(b["tools"]) for b in bodies}) == 1
    assert bodies[0]["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert "[agent: assistant]" in bodies[0]["system"][0]["text"]
    # [CURRENT_STATE]: rebuilt each iteration, the last user message, nowhere else
    for i, body in enumerate(bodies, start=1):
        last = body["messages"][-1]
        assert last["role"] == "user" and len(last["content"]) == 1
        assert last["content"][0]["text"].startswith("[CURRENT_STATE]")
        assert f"session: map request #{i}" in last["content"][0]["text"]
        assert "[CURRENT_STATE]" not in json.dumps(body["messages"][:-1])
    assert [v.iteration for v in views] == [1, 2, 3, 4]
    assert views[-1].tools_called == ("describe_dataset", "query_dataset", "display_map")
    # each request extends the previous one (the cached prefix only grows)
    for a, b in zip(bodies, bodies[1:], strict=False):
        assert len(b["messages"]) == len(a["messages"]) + 2
    # the persisted chain: the full tool-call chain, no state block, JSON-safe
    chain = result.messages_appended
    assert [m["role"] for m in chain] == ["assistant", "user"] * 3 + ["assistant"]
    assert "[CURRENT_STATE]" not in json.dumps(chain)
    uses = [b for m in chain for b in m["content"] if b["type"] == "tool_use"]
    results = [b for m in chain for b in m["content"] if b["type"] == "tool_result"]
    assert [u["id"] for u in uses] == [r["tool_use_id"] for r in results]
    persisted = sink.of(PersistMessage)
    assert len(persisted) == 1 and persisted[0].structured_content == chain
    assert persisted[0].content == result.final_text and persisted[0].conversation_id == "cnv-1"
    json.dumps(persisted[0].model_dump(mode="json"), allow_nan=False)
    # the deferred map card: emitted once, at the end, sanitised
    (card,) = result.cards
    layer = card["card_data"]["layers"][0]
    assert layer["stats"] == {"mean": None, "n": 2} and layer["raw"] == "AAE="
    assert layer["at"] == "2024-01-01T00:00:00"
    types = [e.type for e in sink.display()]
    assert types[-3:] == ["cost", "idle", "done"]
    assert types.index("card") > max(i for i, t in enumerate(types) if t == "text_delta")
    assert types[-1] == "done" and sink.display("done")[0].data["cost"] == result.cost_usd
    assert types.count("tool_call") == 3 and types.count("tool_result") == 3
    # tool results were recorded in full with measured schemas
    query_call = next(t for t in sink.of(ToolCallEffect) if t.tool_name == "query_dataset")
    assert query_call.result["envelope"]["schema"][4] == {"name": "permits", "type": "int"}
    assert query_call.result["envelope"]["rows"][0]["lat"] == 30.45

    # the next turn starts from the persisted chain, and no old state block comes back
    bodies.clear()
    history = [{"role": "user", "content": ti.user_message}, *chain]
    ti2 = TurnInput("cnv-1:turn-2", "Thanks, that is perfect", history=history,
                    conversation_id="cnv-1", state_provider=state)
    r2 = await run_turn(assistant_spec(map_tools(seen)), ti2, client, RecordingSink())
    assert r2.end_reason == "end_turn"
    assert json.dumps(bodies[0]["messages"]).count("[CURRENT_STATE]") == 1


async def test_max_turns_stops_the_loop():
    model = ScriptedModel([lambda req: [tool_use("describe_dataset",
                                                 {"dataset_id": f"d{len(req.messages)}"})]])
    model.repeat = True
    sink = RecordingSink()
    result = await run_turn(assistant_spec(map_tools({}), max_agentic_turns=3),
                            TurnInput("t-max", "keep going"), model, sink)
    assert result.end_reason == "max_turns" and len(model.requests) == 3
    assert sink.display("done")[0].data["max_turns_reached"] is True
    assert sink.of(PersistMessage)[0].end_reason == "max_turns"
    assert result.messages_appended[-1]["content"][0]["type"] == "tool_result"


async def test_cancel_before_the_first_model_call():
    model = ScriptedModel([[text("never")]])
    token = CancelToken()
    token.cancel()
    sink = RecordingSink()
    result = await run_turn(assistant_spec(map_tools({})), TurnInput("t-c0", "hi"), model,
                            sink, token)
    assert result.end_reason == "cancelled" and model.requests == []
    assert sink.display()[-1].type == "done"


async def test_cancel_while_a_slow_tool_runs_stops_before_the_next_model_call():
    started = asyncio.Event()

    def slow(args: DatasetArgs, ctx):
        asyncio.run_coroutine_threadsafe(_set(started), loop)
        time.sleep(0.5)
        return Ok()

    loop = asyncio.get_running_loop()
    tools = ToolRegistry([Tool("describe_dataset", "slow", DatasetArgs, slow)])
    model = ScriptedModel([[tool_use("describe_dataset", {"dataset_id": "a"}),
                            tool_use("describe_dataset", {"dataset_id": "b"})],
                           [text("should not be asked")]])
    token = CancelToken()
    sink = RecordingSink()
    task = asyncio.ensure_future(run_turn(assistant_spec(tools), TurnInput("t-c1", "go"),
                                          model, sink, token))
    await asyncio.wait_for(started.wait(), 2)
    t0 = time.monotonic()
    token.cancel()
    result = await asyncio.wait_for(task, 2)
    assert time.monotonic() - t0 < 0.4  # did not wait for the thread
    assert result.end_reason == "cancelled" and len(model.requests) == 1
    first, second = sink.of(ToolCallEffect)
    assert (first.err_kind, first.executed) == ("cancelled", True)
    assert (second.err_kind, second.executed) == ("cancelled", False)  # never started
    assert result.messages_appended[-1]["content"][1]["is_error"] is True


class EndlessStream:
    """A model that streams a few words, then keeps the stream open for ever."""

    def __init__(self) -> None:
        self.streaming = asyncio.Event()
        self.closed = False

    async def stream(self, request, callbacks):  # noqa: ANN001, ANN201
        try:
            await callbacks.on_text("Let me think about ")
            self.streaming.set()
            await asyncio.Event().wait()
        finally:
            self.closed = True


async def test_cancel_interrupts_a_model_stream_in_flight():
    model = EndlessStream()
    token = CancelToken()
    sink = RecordingSink()
    task = asyncio.ensure_future(run_turn(assistant_spec(map_tools({})), TurnInput("t-c2", "go"),
                                          model, sink, token))
    await asyncio.wait_for(model.streaming.wait(), 2)
    token.cancel()
    result = await asyncio.wait_for(task, 2)  # not waiting for the stream to end
    assert result.end_reason == "cancelled" and model.closed
    types = [e.type for e in sink.display()]
    assert types[-1] == "done" and "status" in types
    assert "".join(e.data["text"] for e in sink.display("text_delta")) == "Let me think about "


async def _set(event: asyncio.Event) -> None:
    event.set()


async def test_singleton_cards_merge_per_display_id_and_plain_cards_stream_inline():
    class CardArgs(BaseModel):
        layer: str
        display_id: str = "m"

    def show(args: CardArgs, ctx):
        return Ok(effects=(Card("map_display", {"layers": [args.layer], "title": args.layer},
                                display_id=args.display_id),
                           Card("chart", {"series": [args.layer]})))

    model = ScriptedModel([[tool_use("show", {"layer": "a"})],
                           [tool_use("show", {"layer": "b"})],
                           [tool_use("show", {"layer": "c", "display_id": "other"})],
                           [text("Shown.")]])
    sink = RecordingSink()
    tools = ToolRegistry([Tool("show", "show", CardArgs, show)])
    result = await run_turn(assistant_spec(tools), TurnInput("t-cards", "show"), model, sink)
    cards = sink.display("card")
    assert [c.data["card_type"] for c in cards] == ["chart"] * 3 + ["map_display"] * 2
    assert cards[3].display_id == "m"
    assert cards[3].data["card_data"] == {"layers": ["a", "b"], "title": "b"}
    assert cards[4].data["card_data"]["layers"] == ["c"]
    assert len(result.cards) == 5
    types = [e.type for e in sink.display()]
    assert types.index("text_complete") < types.index("card", types.index("text_complete"))


async def test_unfinished_plan_is_reported_as_a_warning():
    class PlanArgs(BaseModel):
        done: int

    def plan(args: PlanArgs, ctx):
        steps = tuple(PlanStep(f"step {i}", i < args.done) for i in range(3))
        return Ok(effects=(PlanUpdate(steps),))

    model = ScriptedModel([[tool_use("plan", {"done": 1})], [text("Here is part of it.")]])
    sink = RecordingSink()
    result = await run_turn(assistant_spec(ToolRegistry([Tool("plan", "plan", PlanArgs, plan)])),
                            TurnInput("t-plan", "do three things"), model, sink)
    assert result.end_reason == "end_turn"
    assert any("2 of 3 steps not done" in w for w in result.warnings)
    assert "2 of 3" in sink.display("warning")[0].data["text"]
    guard = [t for t in sink.of(TelemetryEffect) if t.name == "completion_guardrail"]
    assert guard[0].attributes["unfinished_steps"] == 2
    assert "- [ ] step 2" in model.requests[1].messages[-1]["content"][0]["text"]
    # a finished plan raises nothing
    model = ScriptedModel([[tool_use("plan", {"done": 3})], [text("All done.")]])
    result = await run_turn(assistant_spec(ToolRegistry([Tool("plan", "plan", PlanArgs, plan)])),
                            TurnInput("t-plan2", "do three things"), model, RecordingSink())
    assert result.warnings == ()


@pytest.mark.parametrize(("message", "expected"), [
    ("No, that's not what I asked. Why did you show Texas??",
     {"correction": True, "meta_friction": True, "previous_outcome": "corrected"}),
    ("Why do you keep showing me the same map",
     {"correction": False, "meta_friction": True, "previous_outcome": "friction"}),
    ("Thanks, that's perfect!",
     {"correction": False, "meta_friction": False, "previous_outcome": "accepted"}),
    ("Now show the Texas facilities too",
     {"correction": False, "meta_friction": False, "previous_outcome": "continued"}),
])
async def test_each_user_message_gets_behavioural_labels(message, expected):
    history = [{"role": "user", "content": "map Louisiana"},
               {"role": "assistant", "content": [{"type": "text", "text": "Here it is."}]}]
    sink = RecordingSink()
    await run_turn(assistant_spec(ToolRegistry()), TurnInput("t-lab", message, history=history),
                   ScriptedModel([[text("ok")]]), sink)
    (labels,) = [t for t in sink.of(TelemetryEffect) if t.name == "user_message_labels"]
    assert {k: labels.attributes[k] for k in expected} == expected
    assert "Texas" not in json.dumps(labels.attributes)  # labels carry no content
    first = RecordingSink()
    await run_turn(assistant_spec(ToolRegistry()), TurnInput("t-lab0", message),
                   ScriptedModel([[text("ok")]]), first)
    (labels,) = [t for t in first.of(TelemetryEffect) if t.name == "user_message_labels"]
    assert labels.attributes["previous_outcome"] is None


async def test_concern_extraction_searches_then_answers_with_fenced_json(sim_url):
    class SearchArgs(BaseModel):
        query: str

    def search(args: SearchArgs, ctx):
        return Ok(rows=[{"id": "iss-7f3a", "title": "Broken streetlights on Elm Street"},
                        {"id": "iss-0001", "title": "Potholes downtown"}])

    spec = AgentSpec("concern-extraction", "You turn messages into concerns.",
                     ToolRegistry([Tool("search_issues", "Search issues", SearchArgs, search)]),
                     "claude-haiku-4-5")
    client = anthropic.AsyncAnthropic(base_url=sim_url, api_key="sim", max_retries=0)
    sink = RecordingSink()
    result = await run_turn(spec, TurnInput("t-ce", "The streetlights on Elm Street are "
                                            "broken. Please fix them.", conversation_id="c9"),
                            client, sink)
    assert result.end_reason == "end_turn" and result.model_calls == 2
    assert '"relates_to_issue": "iss-7f3a"' in result.final_text
    (call,) = sink.of(ToolCallEffect)
    assert call.tool_name == "search_issues" and "streetlights" in call.arguments["query"]
