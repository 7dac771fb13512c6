"""The conversation routes' answers to each outcome of the writer, without a broker: a fake
producer and a fake tail that answers the command as the writer would have."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api import conversations
from api.conversations import ConversationViews
from schemas.conversation import ConversationStarted
from schemas.system import CommandAcknowledged
from streams.envelope import Envelope, decode
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings
from streams.tokens import mint_token


class FakeProducer:
    """Takes every record at once and keeps it."""

    def __init__(self) -> None:
        self.sent: list[Envelope] = []

    def produce_raw(self, topic: str, key: Any, value: Any, headers: Any = None) -> Any:
        self.sent.append(decode(key, value, headers))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


class FakeTail:
    """Answers each command with ``outcome`` and, unless refused, applies what the writer
    would have appended to the edge's views."""

    def __init__(self, producer: FakeProducer, views: ConversationViews, outcome: str) -> None:
        self.producer, self.views, self.outcome = producer, views, outcome

    def expect_ack(self, command_id: str) -> Any:
        return None

    def forget_ack(self, command_id: str) -> None:
        pass

    async def wait_ack(self, command_id: str, fut: Any, timeout: float) -> CommandAcknowledged:
        cmd = self.producer.sent[-1]
        if self.outcome == "rejected":
            return CommandAcknowledged(command_id=command_id, aggregate=cmd.key,
                                       outcome="rejected", detail={"reason": "conversation exists"})
        if self.outcome == "not recorded":
            return CommandAcknowledged(command_id=command_id, aggregate=cmd.key,
                                       outcome="rejected", detail={
                                           "reason": "could not record the command; try again",
                                           "retryable": True})
        self.views.apply(Envelope(record=ConversationStarted(conversation=cmd.key,
                                                             owner=cmd.record.owner),
                                  key=cmd.key, source="/test", seq=1))
        return CommandAcknowledged(command_id=command_id, aggregate=cmd.key,
                                   outcome=self.outcome, seq=1)  # type: ignore[arg-type]


def client(tmp_path: Path, outcome: str) -> TestClient:
    settings = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path)
    app = FastAPI()
    app.include_router(conversations.router)
    app.state.settings = settings
    app.state.views = ConversationViews()
    app.state.owners = None  # an edge that reads all history
    app.state.sealer = Sealer(MemoryKeyStore())
    app.state.producer = FakeProducer()
    app.state.tail = FakeTail(app.state.producer, app.state.views, outcome)
    c = TestClient(app)
    c.headers["Authorization"] = f"Bearer {mint_token(settings, 'alice', 'participant')}"
    return c


@pytest.mark.parametrize("outcome", ["accepted", "duplicate"])
def test_opening_a_conversation_answered_again_still_opens_it(tmp_path: Path, outcome: str
                                                               ) -> None:
    # "duplicate" for the request's own command id: the writer applied it, then crashed before
    # its acknowledgement (decision 0007) — the conversation exists.
    resp = client(tmp_path, outcome).post("/me/conversations")
    assert resp.status_code == 201, resp.text
    assert resp.json()["conversation"].startswith("cnv-")


def test_a_refused_open_answers_409_with_the_reason(tmp_path: Path) -> None:
    resp = client(tmp_path, "rejected").post("/me/conversations")
    assert resp.status_code == 409 and "conversation exists" in resp.json()["detail"]


def test_a_command_its_writer_could_not_record_answers_503(tmp_path: Path) -> None:
    resp = client(tmp_path, "not recorded").post("/me/conversations")
    assert resp.status_code == 503 and "try again" in resp.json()["detail"]
