"""Quotas: the counters (``streams.quotas``), the edge's 429s with ``Retry-After`` on the real
routes (fake producer and tail, an injected clock: time moves, nothing sleeps), concurrent
SSE streams on a real HTTP server (a slot frees when its client goes), and model tokens per
tenant where turns run (``consumers.engine.budget``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api import assistant, conversations, staff
from api.assistant import AssistantViews
from api.conversations import ConversationViews
from api.frame.lane import StreamLane
from api.frame.quotas import EdgeQuotas
from consumers.assistant.datasets import MemoryDatasets
from consumers.assistant.sqlbox import SqlBox
from consumers.assistant.turn import run_assistant_turn
from consumers.conversations.concern import (
    ConcernAgentFailed,
    MemoryIssueCatalog,
    concern_spec,
    run_concern_extraction,
)
from consumers.engine import (
    AgentRunner,
    AgentSpec,
    RecordingSink,
    ToolRegistry,
    TurnInput,
    run_turn,
)
from consumers.engine.budget import TokenBudget
from consumers.engine.model import ModelCallEffect
from consumers.engine.testing import ScriptedModel, text
from deploy.kafka_local import free_port
from schemas.assistant import AssistantChat
from schemas.conversation import ConversationStarted, SendMessage, StartConversation
from schemas.system import CommandAcknowledged
from streams.assistant_settings import AssistantSettings
from streams.envelope import Envelope, decode
from streams.quotas import ConcurrencyCounter, OverQuota, WindowCounter
from streams.sealing import MemoryKeyStore, Sealer
from streams.tokens import mint_token

CSV = b"name,n\na,1\nb,2\n"
DAY = 86_400.0


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# --- the counters ---------------------------------------------------------------------------


def test_a_window_admits_its_limit_then_refuses_until_the_window_ends() -> None:
    clock = Clock()
    counter = WindowCounter("messages", 3, 60, clock=clock)
    for _ in range(3):
        counter.take("alice")
    clock.advance(20)
    with pytest.raises(OverQuota) as refused:
        counter.take("alice")
    assert refused.value.limit == 3 and refused.value.retry_after == pytest.approx(40)
    assert counter.used("alice") == 3, "a refusal counts nothing"
    counter.take("bob")  # another key has its own window
    clock.advance(40)
    counter.take("alice")  # a new window
    assert counter.used("alice") == 1


def test_spent_units_past_the_limit_count_and_check_refuses_until_the_window_ends() -> None:
    clock = Clock()
    counter = WindowCounter("tokens", 100, DAY, clock=clock)
    counter.check("t1")
    counter.spend("t1", 250)  # a call already made: its tokens were used
    with pytest.raises(OverQuota) as refused:
        counter.check("t1")
    assert refused.value.retry_after == pytest.approx(DAY)
    clock.advance(DAY)
    counter.check("t1")


def test_memory_is_bounded_expired_windows_first_then_the_oldest() -> None:
    clock = Clock()
    counter = WindowCounter("messages", 5, 60, max_keys=3, clock=clock)
    for key in range(10):
        counter.take(key)
        clock.advance(1)
    assert len(counter) == 3
    clock.advance(60)
    counter.take("late")
    assert len(counter) == 1, "expired windows are dropped as new ones open"


def test_a_limit_of_zero_is_unlimited_and_keeps_nothing() -> None:
    counter = WindowCounter("messages", 0, 60)
    for _ in range(1000):
        counter.take("alice")
    assert len(counter) == 0
    slots = ConcurrencyCounter("streams", 0, 15)
    held = [slots.acquire("alice") for _ in range(100)]
    assert len(slots) == 0 and len(held) == 100


def test_concurrency_refuses_the_extra_slot_until_one_is_released() -> None:
    clock = Clock()
    slots = ConcurrencyCounter("streams", 2, hold_s=15, clock=clock)
    first = slots.acquire("alice")
    clock.advance(5)
    slots.acquire("alice")
    with pytest.raises(OverQuota) as refused:
        slots.acquire("alice")
    assert refused.value.retry_after == pytest.approx(10), "the oldest ends by 15 s"
    slots.acquire("bob")
    first.release()
    first.release()  # once only
    third = slots.acquire("alice")
    assert slots.open("alice") == 2
    for slot in (third,):
        slot.release()
    assert slots.open("alice") == 1


# --- the edge -------------------------------------------------------------------------------


class FakeMessage:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[Envelope] = []

    def produce_raw(self, topic: str, key: Any, value: Any, headers: Any = None) -> Any:
        self.sent.append(decode(key, value, headers))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(FakeMessage(len(self.sent)))
        return fut


class FakeTail:
    """Answers each command as its writer would, accepted; opens conversations in the views."""

    def __init__(self, producer: FakeProducer, views: ConversationViews) -> None:
        self.producer, self.views = producer, views

    def expect_ack(self, command_id: str) -> Any:
        return None

    def forget_ack(self, command_id: str) -> None:
        pass

    async def wait_ack(self, command_id: str, fut: Any, timeout: float) -> CommandAcknowledged:
        cmd = self.producer.sent[-1]
        rec, detail = cmd.record, {}
        if isinstance(rec, StartConversation):
            self.views.apply(Envelope(record=ConversationStarted(conversation=cmd.key,
                                                                 owner=rec.owner),
                                      key=cmd.key, source="/test", seq=1, tenant=cmd.tenant))
        elif isinstance(rec, SendMessage):
            detail = {"turn": f"{cmd.key}:turn-2", "at": "2026-01-01T00:00:00+00:00"}
        elif isinstance(rec, AssistantChat):
            detail = {"turn": f"{cmd.key}:turn-1", "after": 0}
        return CommandAcknowledged(command_id=command_id, aggregate=cmd.key,
                                   outcome="accepted", seq=2, detail=detail)


def edge_app(tmp_path: Path, clock: Clock | None = None, lane: bool = False,
             **overrides: Any) -> FastAPI:
    settings = AssistantSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path,
                                 **overrides)
    app = FastAPI()
    app.include_router(conversations.router)
    app.include_router(assistant.router)
    app.include_router(staff.router)
    app.state.settings = settings
    app.state.views = ConversationViews()
    app.state.owners = None  # an edge that reads all history
    app.state.assistant = AssistantViews(settings)
    app.state.staff = staff.StaffViews()
    app.state.sealer = Sealer(MemoryKeyStore())
    app.state.producer = FakeProducer()
    app.state.tail = FakeTail(app.state.producer, app.state.views)
    if clock is not None:
        app.state.quotas = EdgeQuotas(settings, clock)
    if lane:  # the conversation stream served below the routing, as create_app does
        app.add_middleware(StreamLane, routes=[conversations.STREAM_LANE])
    return app


def bearer(app: FastAPI, sub: str = "alice", role: str = "participant",
           tenant: str = "default") -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(app.state.settings, sub, role, tenant)}"}


def refused_429(resp: httpx.Response, limit: int, setting: str) -> int:
    """The 429's Retry-After, once its detail names the limit and the setting."""
    assert resp.status_code == 429, resp.text
    detail = resp.json()["detail"]
    assert f"quota of {limit} " in detail and setting in detail, detail
    return int(resp.headers["Retry-After"])


def test_a_burst_of_conversations_past_the_daily_quota_is_429_until_the_day_ends(
        tmp_path: Path) -> None:
    clock = Clock()
    app = edge_app(tmp_path, clock, quota_conversations_per_day=3)
    client, alice = TestClient(app), bearer(app)
    for _ in range(3):
        assert client.post("/me/conversations", headers=alice).status_code == 201
    clock.advance(3600)
    wait = refused_429(client.post("/me/conversations", headers=alice), 3,
                       "VOICE_QUOTA_CONVERSATIONS_PER_DAY")
    assert wait == DAY - 3600
    # Another principal, and the same sub in another tenant, have their own quota.
    assert client.post("/me/conversations", headers=bearer(app, "bob")).status_code == 201
    assert client.post("/me/conversations", headers=bearer(app, tenant="t2")).status_code == 201
    clock.advance(wait)
    assert client.post("/me/conversations", headers=alice).status_code == 201


def test_messages_and_chat_turns_share_the_per_minute_quota(tmp_path: Path) -> None:
    clock = Clock()
    app = edge_app(tmp_path, clock, quota_messages_per_minute=3)
    client, alice = TestClient(app), bearer(app)
    cnv = client.post("/me/conversations", headers=alice).json()["conversation"]
    send = f"/me/conversations/{cnv}/messages"
    chat = {"message": "hello", "stream": False}
    assert client.post(send, json={"text": "one"}, headers=alice).status_code == 202
    assert client.post(send, json={"text": "two"}, headers=alice).status_code == 202
    assert client.post("/api/v1/assistant/chat", json=chat, headers=alice).status_code == 202
    clock.advance(15)
    for resp in (client.post(send, json={"text": "four"}, headers=alice),
                 client.post("/api/v1/assistant/chat", json=chat, headers=alice)):
        assert refused_429(resp, 3, "VOICE_QUOTA_MESSAGES_PER_MINUTE") == 45
    sent = len(app.state.producer.sent)
    clock.advance(45)
    assert client.post(send, json={"text": "five"}, headers=alice).status_code == 202
    assert len(app.state.producer.sent) == sent + 1, "refused messages were never recorded"


def test_uploads_past_the_daily_quota_are_429_before_the_body_is_read(tmp_path: Path) -> None:
    clock = Clock()
    app = edge_app(tmp_path, clock, quota_uploads_per_day=2)
    client, alice = TestClient(app), bearer(app)
    files = {"file": ("f.csv", CSV, "text/csv")}
    for _ in range(2):
        r = client.post("/api/v1/assistant/files", files=files, headers=alice)
        assert r.status_code == 201, r.text
    refused_429(client.post("/api/v1/assistant/files", files=files, headers=alice), 2,
                "VOICE_QUOTA_UPLOADS_PER_DAY")
    assert len(app.state.producer.sent) == 2
    clock.advance(DAY)
    assert client.post("/api/v1/assistant/files", files=files, headers=alice).status_code == 201


def test_a_caller_refused_401_or_403_uses_no_quota(tmp_path: Path) -> None:
    clock = Clock()
    app = edge_app(tmp_path, clock, quota_conversations_per_day=1)
    client = TestClient(app)
    operator = bearer(app, "alice", "operator")  # no "converse"
    for _ in range(3):
        assert client.post("/me/conversations", headers=operator).status_code == 403
        assert client.post("/me/conversations").status_code == 401
    assert client.post("/me/conversations", headers=bearer(app)).status_code == 201


def test_a_streaming_chat_needs_a_stream_slot_a_non_streaming_one_does_not(
        tmp_path: Path) -> None:
    clock = Clock()
    app = edge_app(tmp_path, clock, quota_streams=1, gateway_bound_s=15)
    client, alice = TestClient(app), bearer(app)
    held = app.state.quotas.streams.acquire(("default", "alice"))  # a stream open elsewhere
    clock.advance(5)
    resp = client.post("/api/v1/assistant/chat", json={"message": "hi"}, headers=alice)
    assert refused_429(resp, 1, "VOICE_QUOTA_STREAMS") == 10
    assert app.state.producer.sent == [], "nothing recorded for a refused chat"
    resp = client.post("/api/v1/assistant/chat", json={"message": "hi", "stream": False},
                       headers=alice)
    assert resp.status_code == 202, resp.text
    assert app.state.quotas.streams.open(("default", "alice")) == 1
    held.release()


def test_a_chat_that_opens_a_conversation_counts_against_the_conversations_quota(
        tmp_path: Path) -> None:
    app = edge_app(tmp_path, Clock(), quota_conversations_per_day=1)
    client, alice = TestClient(app), bearer(app)
    chat = {"message": "hi", "stream": False}
    first = client.post("/api/v1/assistant/chat", json=chat, headers=alice)
    assert first.status_code == 202, first.text
    refused_429(client.post("/api/v1/assistant/chat", json=chat, headers=alice), 1,
                "VOICE_QUOTA_CONVERSATIONS_PER_DAY")
    refused_429(client.post("/me/conversations", headers=alice), 1,
                "VOICE_QUOTA_CONVERSATIONS_PER_DAY")


QUOTA_ROUTES = [("post", "/me/conversations"),
                ("post", "/me/conversations/{conversation}/messages"),
                ("get", "/me/conversations/{conversation}/stream"),
                ("post", "/api/v1/assistant/chat"), ("post", "/api/v1/assistant/files"),
                ("get", "/api/v1/assistant/conversations/{conversation}/stream"),
                ("get", "/me/inbox/stream")]


def test_the_openapi_documents_the_429_and_retry_after_of_every_quota_route(
        tmp_path: Path) -> None:
    paths = edge_app(tmp_path).openapi()["paths"]
    for method, path in QUOTA_ROUTES:
        answer = paths[path][method]["responses"].get("429")
        assert answer and "Retry-After" in answer["headers"], (method, path)


# --- concurrent streams, on a real server ---------------------------------------------------


@pytest.fixture(params=[False, True], ids=["routes", "stream-lane"])
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, FastAPI]]:
    app = edge_app(tmp_path, lane=request.param, quota_streams=2, gateway_bound_s=30)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(10)


def open_slots(app: FastAPI) -> int:
    return app.state.quotas.streams.open(("default", "alice"))


def wait_until(predicate: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_the_stream_past_the_concurrent_limit_is_429_until_one_closes(
        served: tuple[str, FastAPI]) -> None:
    url, app = served
    alice = bearer(app)
    cnv = "cnv-00aa11bb22cc33dd"
    app.state.views.apply(Envelope(record=ConversationStarted(conversation=cnv, owner="alice"),
                                   key=cnv, source="/test", seq=1, tenant="default"))
    with ExitStack() as open_streams:
        clients = [open_streams.enter_context(httpx.Client(base_url=url, headers=alice,
                                                           timeout=10)) for _ in range(3)]
        # Two streams of two kinds (every SSE route takes a slot of the same principal).
        first = open_streams.enter_context(clients[0].stream("GET", "/me/inbox/stream"))
        second = open_streams.enter_context(clients[1].stream("GET",
                                                              f"/me/conversations/{cnv}/stream"))
        assert first.status_code == second.status_code == 200
        assert open_slots(app) == 2
        wait = refused_429(clients[2].get("/me/inbox/stream"), 2, "VOICE_QUOTA_STREAMS")
        assert 1 <= wait <= 30, "the oldest stream ends before the gateway bound"
        with clients[2].stream("GET", "/me/inbox/stream", headers=bearer(app, "bob")) as bob:
            assert bob.status_code == 200  # bob's slots are his own
        first.close()  # the client goes: its slot frees
        wait_until(lambda: open_slots(app) == 1, "the closed stream's slot to free")
        with clients[2].stream("GET", "/me/inbox/stream") as again:
            assert again.status_code == 200 and open_slots(app) == 2
    wait_until(lambda: open_slots(app) == 0, "every slot to free")
    assert len(app.state.quotas.streams) == 0, "nothing kept for principals with no stream"


# --- model tokens per tenant, where turns run -----------------------------------------------


def spec() -> AgentSpec:
    return AgentSpec(name="assistant", identity="You help.", tools=ToolRegistry(),
                     model="claude-sonnet-4-5")


def scripted() -> ScriptedModel:
    return ScriptedModel([[text("Done.")]], repeat=True, input_tokens=lambda _req: 100)


async def test_a_tenant_over_its_token_budget_gets_no_second_turn_another_tenant_does(
        ) -> None:
    clock = Clock()
    budget = TokenBudget(100, clock=clock)
    model = scripted()

    async def turn(tenant: str, n: int) -> Any:
        sink = RecordingSink()
        result = await run_turn(spec(), TurnInput(f"{tenant}-turn-{n}", "hello"),
                                budget.port(model, tenant), sink)
        return result, sink

    first, _ = await turn("t1", 1)
    assert first.end_reason == "end_turn" and budget.used("t1") > 100
    second, sink = await turn("t1", 2)
    assert second.end_reason == "error" and not second.retryable
    [error] = second.errors
    assert error.kind == "TOKEN_QUOTA_EXCEEDED"
    assert "'t1'" in error.message and "of its 100 model tokens" in error.message
    assert "VOICE_QUOTA_TENANT_TOKENS_PER_DAY" in error.message
    assert sink.display("error")[0].data["kind"] == "TOKEN_QUOTA_EXCEEDED"
    assert sink.display()[-1].type == "done"
    assert [c.error_kind for c in sink.of(ModelCallEffect)] == ["TOKEN_QUOTA_EXCEEDED"]
    assert len(model.requests) == 1, "no model was called for the refused turn"
    other, _ = await turn("t2", 1)
    assert other.end_reason == "end_turn"
    clock.advance(DAY)  # the tenant's day is over
    again, _ = await turn("t1", 3)
    assert again.end_reason == "end_turn"


async def test_an_admitted_turn_runs_to_its_end_past_the_budget() -> None:
    budget = TokenBudget(50)
    model = ScriptedModel([[{"type": "tool_use", "name": "nope", "input": {}}], [text("ok")]],
                          input_tokens=lambda _req: 100)
    result = await run_turn(spec(), TurnInput("t-1", "hi"), budget.port(model, "t1"),
                            RecordingSink())
    assert result.end_reason == "end_turn" and len(model.requests) == 2
    assert budget.used("t1") > 200


def test_the_runner_counts_turns_by_tenant_the_default_tenant_when_unknown(
        tmp_path: Path) -> None:
    settings = AssistantSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path,
                                 quota_tenant_tokens_per_day=7)
    runner = AgentRunner(settings, lambda: None, client=scripted())  # type: ignore[arg-type, return-value]
    assert runner.budget.limit == 7
    port = runner.client_for(None)
    assert port.tenant == "default"  # type: ignore[attr-defined]
    unlimited = AgentRunner(settings.model_copy(update={"quota_tenant_tokens_per_day": 0}),
                            lambda: None, client=scripted())  # type: ignore[arg-type, return-value]
    assert isinstance(unlimited.client_for("t1"), ScriptedModel)


async def test_a_conversation_turn_over_budget_fails_at_once_not_retried(
        tmp_path: Path) -> None:
    settings = AssistantSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path)
    budget = TokenBudget(1)
    budget.window.spend("t1", 5)
    history = [{"role": "user", "content": "the bins are not collected"}]
    with pytest.raises(ConcernAgentFailed) as failed:
        await run_concern_extraction(concern_spec(settings, MemoryIssueCatalog()),
                                     budget.port(scripted(), "t1"), RecordingSink(), "cnv-1",
                                     "cnv-1:turn-2", 1, history)
    assert failed.value.retryable is False  # the workflow fails now, with this reason
    assert str(failed.value).startswith("TOKEN_QUOTA_EXCEEDED: tenant 't1'")


async def test_an_assistant_turn_over_budget_ends_with_the_reason(tmp_path: Path) -> None:
    settings = AssistantSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path)
    budget = TokenBudget(1)
    budget.window.spend("t1", 5)
    box = SqlBox(timeout_s=5)
    try:
        result, _ = await run_assistant_turn(
            settings, conversation="c", turn="c:turn-1", owner="alice", attempt=1,
            request={"message": "hi"}, options={}, refs=[], history=[], patterns=[],
            source=MemoryDatasets([]), box=box, client=budget.port(scripted(), "t1"),
            sink=RecordingSink())
    finally:
        box.close()
    assert result.end_reason == "error"
    assert [e.kind for e in result.errors] == ["TOKEN_QUOTA_EXCEEDED"]
