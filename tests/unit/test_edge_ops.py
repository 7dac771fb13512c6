"""The edge's ops routes: ``/readyz`` answers anyone, so it says only whether the edge is ready
and why; the counts of what it holds and skipped are an operator's (``GET /ops/edge``,
capability ``edge.inspect``). The real app (``create_app``), no broker: its state set by hand."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.assistant import AssistantViews
from api.conversations import ConversationViews
from api.staff.views import StaffViews
from schemas.assistant import AssistantConversationStarted
from schemas.conversation import ConversationStarted
from schemas.workflow import WorkflowCompleted, WorkflowStarted
from streams.assistant_settings import assistant_settings
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings
from streams.tokens import mint_token


class Tail:
    """The tail's state the ops routes read: assigned, caught up, what it skipped."""

    def __init__(self) -> None:
        self.assigned, self.caught_up = asyncio.Event(), asyncio.Event()
        self.left_before_window = 3

    def skipped_counts(self) -> dict[str, dict[str, int]]:
        return {"voice.conversations": {"undecodable": 2}}


@pytest.fixture
def edge(tmp_path: Path) -> tuple[TestClient, VoiceSettings]:
    settings = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path)
    app = create_app(settings)
    app.state.settings = settings
    app.state.views = views = ConversationViews()
    app.state.owners = None  # an edge that reads all history
    app.state.sealer = Sealer(MemoryKeyStore())
    app.state.tail = Tail()
    app.state.staff = staff = StaffViews(turn_workflows_kept=0)
    for workflow, kind in (("run-1", "research"), ("cnv-0000aaaa:turn-2", "conversation-turn")):
        for seq, rec in enumerate((WorkflowStarted(workflow=workflow, kind=kind),
                                   WorkflowCompleted(workflow=workflow)), start=1):
            staff.workflows.apply(Envelope(record=rec, key=workflow, source="/t", seq=seq,
                                           tenant="default"))
    views.apply(Envelope(record=ConversationStarted(conversation="cnv-0000aaaa", owner="alice"),
                         key="cnv-0000aaaa", source="/t", seq=1, tenant="default"))
    app.state.assistant = chats = AssistantViews(assistant_settings(settings))
    for n in (1, 2):
        chat = f"00000000-0000-7000-8000-00000000000{n}"
        chats.conversations.apply(Envelope(
            record=AssistantConversationStarted(conversation=chat, owner="alice"), key=chat,
            source="/t", seq=1, tenant="default"))
    return TestClient(app), settings


def bearer(settings: VoiceSettings, role: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, 'someone', role)}"}


def test_readyz_says_why_and_shows_no_counts(edge: tuple[TestClient, VoiceSettings]) -> None:
    client, _ = edge
    r = client.get("/readyz")  # the broker at 127.0.0.1:1 is unreachable: not ready
    assert r.status_code == 503
    checks = r.json()["checks"]
    assert checks["broker"].startswith("unreachable") and checks["consumers"] == "not assigned"
    assert "conversations" not in checks and "skipped" not in checks


def test_an_operator_reads_what_the_edge_holds_and_skipped(
        edge: tuple[TestClient, VoiceSettings]) -> None:
    client, settings = edge
    r = client.get("/ops/edge", headers=bearer(settings, "operator"))
    assert r.status_code == 200, r.text
    assert r.json() == {"conversations": {"in_memory": 1, "held": 0},
                        "assistant": {"in_memory": 2, "held": 0},
                        "workflows": {"in_memory": 1, "turns_let_go": 1,
                                      "left_before_window": 3},
                        "owners": None,  # no history window: no index by owner read
                        "skipped": {"voice.conversations": {"undecodable": 2}}}


@pytest.mark.parametrize("role", ["participant", "staff", "analyst"])
def test_no_one_else_reads_the_edge_s_state(edge: tuple[TestClient, VoiceSettings],
                                            role: str) -> None:
    client, settings = edge
    assert client.get("/ops/edge").status_code == 401
    r = client.get("/ops/edge", headers=bearer(settings, role))
    assert r.status_code == 403 and "edge.inspect" in r.json()["detail"]
