"""What an assistant chat accepts, made real (issue 13 point 7), in process: the production
``plan`` tool and ``agentic_mode`` (its shortlist, the plan guardrail through the simulator),
the work log on ``done``, the tenant and capabilities a tool sees (a tool refusing by
capability), ``namespace_id`` scoping datasets, and uploaded images as image blocks (this
turn's and its history's)."""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from api import assistant
from api.assistant.models import ChatRequest
from api.assistant.views import AssistantViews
from consumers.assistant.agent import history_messages, user_content, user_message
from consumers.assistant.datasets import DatasetUnavailable, MemoryDatasets, from_csv
from consumers.assistant.images import LoadedImage, MemoryImages, resolve_images
from consumers.assistant.sqlbox import SqlBox
from consumers.assistant.tools import DatasetTools, TurnDatasets
from consumers.assistant.toolset import AGENTIC_SHORTLIST, turn_tools
from consumers.assistant.turn import run_assistant_turn
from consumers.engine import (
    AgentSpec,
    CancelToken,
    Err,
    Hint,
    Ok,
    PlanUpdate,
    RecordingSink,
    TelemetryEffect,
    Tool,
    ToolCallEffect,
    ToolContext,
    ToolRegistry,
    TurnInput,
    plan_tool,
    run_turn,
)
from consumers.engine.history import IMAGE_TOKENS, estimate_tokens
from consumers.engine.testing import ScriptedModel, text, tool_use
from consumers.engine.tools import execute
from consumers.engine.worklog import WorkLog
from deploy.simulator import serve_simulator
from schemas.assistant import ChatOptions, DatasetRecorded, DatasetRef
from streams.assistant_settings import AssistantSettings
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer
from streams.tokens import mint_token

CSV = (Path(__file__).resolve().parents[1] / "fixtures" / "assistant_facilities.csv").read_text()
DS = "0123456789abcdef" * 2
CONV = str(uuid.UUID(int=13))
REQUEST = {"message": "How many facilities are there? Stop early.", "file_context": [],
           "datasets": [{"dataset_id": DS, "name": "facilities.csv", "rows": 12,
                         "columns": ["name", "state", "lat", "lon", "program"]}]}


@pytest.fixture(scope="module")
def box() -> Iterator[SqlBox]:
    b = SqlBox(timeout_s=20)
    yield b
    b.close()


@pytest.fixture(scope="module")
def simulator() -> Iterator[anthropic.AsyncAnthropic]:
    with serve_simulator() as url:
        yield anthropic.AsyncAnthropic(api_key="simulator", base_url=url, max_retries=0)


def settings(tmp_path: Path) -> AssistantSettings:
    return AssistantSettings(env="test", state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1")


def dataset_tools(box: SqlBox) -> DatasetTools:
    source = MemoryDatasets([from_csv(DS, "alice", "facilities.csv", CSV)])
    return DatasetTools(TurnDatasets([DatasetRef(dataset_id=DS, partition=0, offset=0)],
                                     source, "alice"), box)


def ctx(*capabilities: str, tenant: str | None = "t1") -> ToolContext:
    return ToolContext(principal="alice", agent_name="assistant", turn_id="t",
                       tool_use_id="u", tenant=tenant, capabilities=frozenset(capabilities))


# --- 1. the plan tool and agentic mode ---------------------------------------------------------


async def test_the_plan_tool_records_the_plan_and_refuses_a_bad_one() -> None:
    registry = ToolRegistry([plan_tool()])
    env = (await execute(registry, "plan", {"steps": [{"title": "Look", "done": True},
                                                      {"title": "Answer"}]},
                         ctx(), CancelToken())).envelope
    assert isinstance(env, Ok)
    assert env.data == {"steps": 2, "done": 1, "remaining": ["Answer"]}
    (update,) = env.effects
    assert isinstance(update, PlanUpdate)
    assert [(s.title, s.done) for s in update.steps] == [("Look", True), ("Answer", False)]
    for bad in ({"steps": []}, {"steps": [{"title": ""}]},
                {"steps": [{"title": f"s{i}"} for i in range(21)]}):
        refused = (await execute(registry, "plan", bad, ctx(), CancelToken())).envelope
        assert isinstance(refused, Hint) and refused.hint_kind == "invalid_arguments"
        assert "steps" in refused.message


def test_agentic_mode_offers_plan_and_only_the_shortlist(box: SqlBox) -> None:
    class Nothing(BaseModel):
        pass

    extra = Tool("later_tool", "a tool added after the shortlist was chosen", Nothing,
                 lambda _a, _c: Ok())
    tools = (*dataset_tools(box).tools(), extra)
    plain = turn_tools(tools, agentic=False)
    assert "plan" not in plain
    assert plain.names == ("describe_dataset", "query_dataset", "display_map", "later_tool")
    agentic = turn_tools(tools, agentic=True)
    assert agentic.names == AGENTIC_SHORTLIST
    assert agentic.names[0] == "plan" and "later_tool" not in agentic


async def test_an_agentic_turn_on_the_simulator_plans_does_part_and_is_warned(
        tmp_path: Path, box: SqlBox, simulator: anthropic.AsyncAnthropic) -> None:
    sink = RecordingSink()
    result, _ = await run_assistant_turn(
        settings(tmp_path), conversation=CONV, turn=f"{CONV}:turn-1", owner="alice", attempt=1,
        request=REQUEST, options={"agentic_mode": True, "capabilities": ["converse"]},
        refs=[DatasetRef(dataset_id=DS, partition=0, offset=0)], history=[], patterns=[],
        source=MemoryDatasets([from_csv(DS, "alice", "f.csv", CSV)]), box=box,
        client=simulator, sink=sink, tenant="t1")
    assert result.end_reason == "end_turn"
    assert [t.tool_name for t in sink.of(ToolCallEffect)] == ["plan", "describe_dataset",
                                                              "plan"]
    assert "stopped early" in result.final_text
    (warning,) = sink.display("warning")
    assert "1 of 2 steps not done (Answer the question)" in warning.data["text"]
    (guard,) = [t for t in sink.of(TelemetryEffect) if t.name == "completion_guardrail"]
    assert guard.attributes == {"guardrail": "unfinished_plan", "unfinished_steps": 1,
                                "total_steps": 2}
    # the same request without "stop early" finishes its plan: no warning
    done = RecordingSink()
    result, _ = await run_assistant_turn(
        settings(tmp_path), conversation=CONV, turn=f"{CONV}:turn-2", owner="alice", attempt=1,
        request={**REQUEST, "message": "How many facilities are there?"},
        options={"agentic_mode": True}, refs=[DatasetRef(dataset_id=DS, partition=0, offset=0)],
        history=[], patterns=[], source=MemoryDatasets([from_csv(DS, "alice", "f.csv", CSV)]),
        box=box, client=simulator, sink=done)
    assert result.warnings == () and "all 2 steps" in result.final_text


async def test_without_agentic_mode_the_model_is_not_offered_plan(tmp_path: Path, box: SqlBox
                                                                  ) -> None:
    model = ScriptedModel([[text("ok")]])
    await run_assistant_turn(
        settings(tmp_path), conversation=CONV, turn=f"{CONV}:turn-3", owner="alice", attempt=1,
        request=REQUEST, options={}, refs=[], history=[], patterns=[],
        source=MemoryDatasets(), box=box, client=model, sink=RecordingSink())
    assert "plan" not in [t["name"] for t in model.requests[0].tools]
    agentic = ScriptedModel([[text("ok")]])
    await run_assistant_turn(
        settings(tmp_path), conversation=CONV, turn=f"{CONV}:turn-4", owner="alice", attempt=1,
        request=REQUEST, options={"agentic_mode": True}, refs=[], history=[], patterns=[],
        source=MemoryDatasets(), box=box, client=agentic, sink=RecordingSink())
    assert [t["name"] for t in agentic.requests[0].tools] == list(AGENTIC_SHORTLIST)
    assert "call `plan`" in agentic.requests[0].messages[-1]["content"][0]["text"]


# --- 2. done carries the work log --------------------------------------------------------------


class Add(BaseModel):
    a: int


def _spec(*tools: Tool, max_turns: int = 75) -> AgentSpec:
    return AgentSpec(name="assistant", identity="[agent: assistant]",
                     tools=ToolRegistry(tools), model="m", max_agentic_turns=max_turns)


async def test_done_carries_the_work_log_of_tool_and_model_calls() -> None:
    def add(args: Add, _ctx: ToolContext) -> Ok | Err:
        return Ok(data={"sum": args.a + 1}) if args.a >= 0 else Err("negative", "bad_input")

    model = ScriptedModel([[tool_use("add", {"a": 1})], [tool_use("add", {"a": -1})],
                           [tool_use("nope", {})], [text("Done.")]])
    sink = RecordingSink()
    result = await run_turn(_spec(Tool("add", "add one", Add, add)), TurnInput("t-w", "add"),
                            model, sink)
    (done,) = sink.display("done")
    log = done.data["work_log"]
    assert [(e["kind"], e.get("tool") or e.get("model")) for e in log] == [
        ("model", "m"), ("tool", "add"), ("model", "m"), ("tool", "add"), ("model", "m"),
        ("tool", "nope"), ("model", "m")]
    tools = [e for e in log if e["kind"] == "tool"]
    assert [(e["envelope"], e["error_kind"]) for e in tools] == [
        ("ok", None), ("err", "bad_input"), ("hint", "unknown_tool")]
    assert all(e["duration_ms"] >= 0 for e in tools)
    models = [e for e in log if e["kind"] == "model"]
    assert sum(e["input_tokens"] for e in models) == result.usage.total_input
    assert sum(e["output_tokens"] for e in models) == result.usage.output_tokens
    assert done.data["max_turns_reached"] is False and "work_log_omitted" not in done.data


async def test_the_work_log_is_bounded_and_max_turns_is_reported() -> None:
    model = ScriptedModel([[tool_use("add", {"a": 1}), tool_use("add", {"a": 2})]],
                          repeat=True)
    sink = RecordingSink()
    spec = _spec(Tool("add", "add one", Add, lambda a, _c: Ok(data={"n": a.a})), max_turns=30)
    result = await run_turn(spec, TurnInput("t-b", "loop"), model, sink)
    assert result.end_reason == "max_turns"
    (done,) = sink.display("done")
    assert done.data["max_turns_reached"] is True
    assert len(done.data["work_log"]) == 64
    assert done.data["work_log_omitted"] == 30 * 3 - 64  # a model call and two tool calls each
    bounded = WorkLog(max_entries=1)
    assert bounded.done_data() == {"work_log": []}


# --- 3. the tool context carries tenant and capabilities ---------------------------------------


async def test_a_tool_sees_the_turns_tenant_and_capabilities() -> None:
    seen: list[tuple[str | None, frozenset[str]]] = []

    def look(_args: Add, c: ToolContext) -> Ok:
        seen.append((c.tenant, c.capabilities))
        return Ok()

    model = ScriptedModel([[tool_use("look", {"a": 1})], [text("ok")]])
    await run_turn(_spec(Tool("look", "look", Add, look)),
                   TurnInput("t-c", "look", tenant="acme",
                             capabilities=frozenset({"converse", "issues.public"})),
                   model, RecordingSink())
    assert seen == [("acme", frozenset({"converse", "issues.public"}))]


async def test_query_dataset_refuses_without_the_converse_capability(box: SqlBox) -> None:
    registry = dataset_tools(box).registry()
    args = {"dataset_id": DS, "sql": "SELECT count() AS n FROM data"}
    refused = (await execute(registry, "query_dataset", args, ctx(), CancelToken())).envelope
    assert isinstance(refused, Err) and refused.err_kind == "forbidden"
    assert "'converse'" in refused.message
    allowed = (await execute(registry, "query_dataset", args, ctx("converse"),
                             CancelToken())).envelope
    assert isinstance(allowed, Ok) and allowed.rows[0]["n"] == 12
    # describing needs no capability: only running the caller's SQL does
    described = (await execute(registry, "describe_dataset", {"dataset_id": DS}, ctx(),
                               CancelToken())).envelope
    assert isinstance(described, Ok)


def test_a_chat_body_cannot_carry_capabilities() -> None:
    with pytest.raises(ValueError, match="capabilities"):
        ChatRequest.model_validate({"message": "hi", "capabilities": ["telemetry.query"]})
    assert ChatOptions().capabilities == ()


# --- 4. namespace_id scopes datasets -----------------------------------------------------------


def test_a_turn_reads_only_the_datasets_of_its_namespace() -> None:
    ds = dataclasses.replace(from_csv(DS, "alice", "f.csv", CSV), namespace="proj-a")
    refs = [DatasetRef(dataset_id=DS, partition=0, offset=0)]
    assert TurnDatasets(refs, MemoryDatasets([ds]), "alice", "proj-a").get(DS).rows == 12
    for other in (None, "proj-b"):
        with pytest.raises(DatasetUnavailable, match="namespace"):
            TurnDatasets(refs, MemoryDatasets([ds]), "alice", other).get(DS)


@pytest.fixture
def edge(tmp_path: Path) -> TestClient:
    settings = AssistantSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path)
    app = FastAPI()
    app.include_router(assistant.router)
    app.state.settings = settings
    app.state.assistant = AssistantViews(settings)
    app.state.sealer = Sealer(MemoryKeyStore())
    app.state.producer = app.state.tail = None  # nothing here may reach Kafka
    c = TestClient(app)
    c.headers["Authorization"] = f"Bearer {mint_token(settings, 'alice', 'participant')}"
    return c


def _uploaded(edge: TestClient, namespace: str | None) -> str:
    """A dataset of alice's in ``namespace``, as the edge's projection learns it."""
    sealer: Sealer = edge.app.state.sealer  # type: ignore[attr-defined]
    dataset_id = uuid.uuid4().hex
    sealer.create(dataset_id)
    rec = DatasetRecorded(dataset_id=dataset_id, owner="alice", rows=1, columns=1,
                          size_bytes=4, meta=sealer.seal_json(dataset_id, "meta", {
                              "name": "f.csv", "columns": ["a"]}),
                          csv=sealer.seal(dataset_id, "csv", "a\n1\n"), at="now",
                          namespace=namespace)
    edge.app.state.assistant.datasets.apply(  # type: ignore[attr-defined]
        Envelope(record=rec, key=dataset_id, source="/test", tenant="default"), 0, 1)
    return dataset_id


def test_a_chat_attaches_only_datasets_of_its_namespace(edge: TestClient) -> None:
    in_a = _uploaded(edge, "proj-a")
    r = edge.post("/api/v1/assistant/chat", json={"message": "hi", "data_refs": [in_a],
                                                  "namespace_id": "proj-b"})
    assert r.status_code == 404
    assert r.json()["detail"] == f"data_refs[0]: no dataset {in_a!r} in namespace 'proj-b'"
    r = edge.post("/api/v1/assistant/chat", json={"message": "hi", "dataset_id": in_a})
    assert r.status_code == 404 and "in the default namespace" in r.json()["detail"]
    unscoped = _uploaded(edge, None)
    r = edge.post("/api/v1/assistant/chat", json={"message": "hi", "data_refs": [unscoped],
                                                  "namespace_id": "proj-a"})
    assert r.status_code == 404 and "namespace 'proj-a'" in r.json()["detail"]


def test_an_upload_with_a_malformed_namespace_is_422_naming_it(edge: TestClient) -> None:
    r = edge.post("/api/v1/assistant/files", files={"file": ("f.csv", b"a\n1\n", "text/csv")},
                  data={"namespace": "../etc"})
    assert r.status_code == 422 and r.json()["detail"].startswith("namespace: '../etc'")


# --- 5. image content blocks --------------------------------------------------------------------

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA"
                       "60e6kgAAAABJRU5ErkJggg==")
IMG = "fe" * 16
IMAGE_REQUEST = {"message": "What is in this picture?", "file_context": [f"ID: {IMG}"],
                 "datasets": [], "images": [{"image_id": IMG, "name": "dot.png",
                                             "media_type": "image/png", "partition": 0,
                                             "offset": 3}]}


def test_an_image_becomes_a_reference_block_then_an_image_block() -> None:
    message = user_message(IMAGE_REQUEST)
    assert isinstance(message, list) and message[0]["source"]["type"] == "voice_upload"
    assert message[-1] == {"type": "text", "text": user_content(IMAGE_REQUEST)}
    assert user_message({"message": "no images"}) == "no images"
    source = MemoryImages([LoadedImage(IMG, "alice", "image/png", PNG)])
    (image, text_block) = resolve_images(message, source, "alice")
    assert image == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": base64.b64encode(PNG).decode()}}
    assert text_block == message[-1]
    # in history too, and an image that is gone (or another owner's) is said to be
    history = history_messages([("user", IMAGE_REQUEST), ("assistant", {"text": "A dot."})])
    resolved = resolve_images(history, source, "alice")
    assert resolved[0]["content"][0]["source"]["type"] == "base64"
    gone = resolve_images(history, MemoryImages(), "alice")
    assert gone[0]["content"][0] == {"type": "text",
                                     "text": "[image 'dot.png' is no longer available]"}
    assert resolve_images(history, source, "bob")[0]["content"][0]["type"] == "text"


def test_an_image_block_is_estimated_at_a_fixed_cost_not_by_its_base64() -> None:
    big = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                       "data": "A" * 400_000}}
    msgs = [{"role": "user", "content": [big, {"type": "text", "text": "hi"}]}]
    assert estimate_tokens(msgs) < IMAGE_TOKENS + 100


async def test_images_reach_the_simulator_this_turn_and_from_history(
        tmp_path: Path, box: SqlBox, simulator: anthropic.AsyncAnthropic) -> None:
    source = MemoryImages([LoadedImage(IMG, "alice", "image/png", PNG)])
    result, _ = await run_assistant_turn(
        settings(tmp_path), conversation=CONV, turn=f"{CONV}:turn-5", owner="alice", attempt=1,
        request=IMAGE_REQUEST, options={}, refs=[], history=[], patterns=[],
        source=MemoryDatasets(), box=box, client=simulator, sink=RecordingSink(),
        images=source)
    assert result.end_reason == "end_turn", result.errors
    assert f"1 image(s) in this conversation: image/png of {len(PNG)} bytes" in result.final_text
    # the next turn has no image of its own; its history still shows the first one
    history = history_messages([("user", IMAGE_REQUEST),
                                ("assistant", {"text": result.final_text})])
    later, _ = await run_assistant_turn(
        settings(tmp_path), conversation=CONV, turn=f"{CONV}:turn-6", owner="alice", attempt=1,
        request={"message": "And now?"}, options={}, refs=[], history=history, patterns=[],
        source=MemoryDatasets(), box=box, client=simulator, sink=RecordingSink(),
        images=source)
    assert "1 image(s) in this conversation" in later.final_text


async def test_the_simulator_refuses_a_malformed_image_block(
        simulator: anthropic.AsyncAnthropic) -> None:
    ref = user_message(IMAGE_REQUEST)  # an unresolved reference must never pass for an image
    with pytest.raises(anthropic.BadRequestError, match=r"image\.source\.type"):
        await simulator.messages.create(model="claude-sonnet-4-5", max_tokens=64,
                                        messages=[{"role": "user", "content": ref}])
    bad = [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": "not base64!"}}]
    with pytest.raises(anthropic.BadRequestError, match="base64.data"):
        await simulator.messages.create(model="claude-sonnet-4-5", max_tokens=64,
                                        messages=[{"role": "user", "content": bad}])


def test_an_image_upload_whose_bytes_are_not_that_type_is_422(edge: TestClient) -> None:
    r = edge.post("/api/v1/assistant/files",
                  files={"file": ("x.png", b"name,state\nA,LA\n", "image/png")})
    assert r.status_code == 422 and r.json()["detail"].startswith("file: the part says image/png")
