"""The model registry (``VOICE_MODELS``): the settings refuse a configured model outside it, the
edge answers a ``model_override`` outside it 422 ``MODEL_NOT_FOUND`` at once (nothing recorded,
nothing substituted), and the worker refuses one in a forged command before any model call."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from consumers.assistant.agent import assistant_spec
from consumers.assistant.datasets import MemoryDatasets
from consumers.assistant.sqlbox import SqlBox
from consumers.assistant.turn import OUTCOMES, run_assistant_turn
from consumers.engine import AgentRunner, RecordingSink, ToolRegistry
from consumers.engine.model import ModelCallEffect
from consumers.engine.testing import ScriptedModel, text
from schemas.assistant import AssistantChat
from streams.assistant_settings import AssistantSettings
from streams.settings import VoiceSettings
from tests.unit.test_quotas import bearer, edge_app

CHAT = "/api/v1/assistant/chat"


def settings(**values: object) -> AssistantSettings:
    return AssistantSettings(env="test", kafka_bootstrap="127.0.0.1:1", **values)  # type: ignore[arg-type]


# --- settings ---------------------------------------------------------------------------------


def test_the_default_registry_is_the_configured_models_in_order() -> None:
    s = settings(model="claude-sonnet-4-5", fallback_models=["claude-haiku-4-5"],
                 compaction_model="claude-haiku-4-5", assistant_model="claude-opus-4-5")
    assert s.allowed_models == ("claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-5")


@pytest.mark.parametrize("raw", ["claude-sonnet-4-5, claude-haiku-4-5,claude-opus-4-5",
                                 '["claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-5"]'])
def test_voice_models_reads_a_list_or_commas_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("VOICE_MODELS", raw)
    assert VoiceSettings(env="test").allowed_models == (
        "claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-5")


@pytest.mark.parametrize("configured, named", [
    ({"model": "claude-opus-4-1"}, "VOICE_MODEL='claude-opus-4-1'"),
    ({"fallback_models": ["claude-3-5-haiku"]}, "VOICE_FALLBACK_MODELS='claude-3-5-haiku'"),
    ({"compaction_model": "claude-opus-4-1"}, "VOICE_COMPACTION_MODEL='claude-opus-4-1'"),
    ({"assistant_model": "claude-opus-4-1"}, "VOICE_ASSISTANT_MODEL='claude-opus-4-1'"),
])
def test_a_configured_model_outside_voice_models_is_refused_by_the_settings(
        configured: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationError, match=r"not in VOICE_MODELS") as refused:
        settings(models=["claude-sonnet-4-5", "claude-haiku-4-5"], **configured)
    assert named in str(refused.value)


# --- the edge ---------------------------------------------------------------------------------


def test_an_override_outside_the_registry_is_422_model_not_found_and_never_recorded(
        tmp_path: Path) -> None:
    app = edge_app(tmp_path)
    client = TestClient(app)
    resp = client.post(CHAT, json={"message": "hi", "stream": False,
                                   "model_override": "claude-opus-4-1"}, headers=bearer(app))
    assert resp.status_code == 422, resp.text
    [error] = resp.json()["detail"]
    assert error["type"] == "MODEL_NOT_FOUND" and error["loc"] == ["body", "model_override"]
    assert "'claude-opus-4-1'" in error["msg"]
    assert error["ctx"]["allowed"] == list(app.state.settings.allowed_models)
    assert app.state.producer.sent == [], "never forwarded to a worker"


def test_an_override_in_the_registry_is_forwarded_as_asked(tmp_path: Path) -> None:
    app = edge_app(tmp_path, models=["claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-5"])
    client = TestClient(app)
    resp = client.post(CHAT, json={"message": "hi", "stream": False,
                                   "model_override": "claude-opus-4-5"}, headers=bearer(app))
    assert resp.status_code == 202, resp.text
    [command] = [e.record for e in app.state.producer.sent]
    assert isinstance(command, AssistantChat)
    assert command.options.model_override == "claude-opus-4-5"


def test_the_openapi_says_what_an_unknown_model_answers(tmp_path: Path) -> None:
    chat = edge_app(tmp_path).openapi()["paths"][CHAT]["post"]
    assert "MODEL_NOT_FOUND" in chat["responses"]["422"]["description"]


# --- the worker (defence in depth) ------------------------------------------------------------


async def test_a_forged_override_outside_the_registry_ends_the_turn_before_any_model_call(
        tmp_path: Path) -> None:
    s = settings(state_dir=tmp_path)
    model = ScriptedModel([[text("I should never be asked.")]])
    sink = RecordingSink()
    box = SqlBox(timeout_s=5)
    try:
        result, _ = await run_assistant_turn(
            s, conversation="c", turn="c:turn-1", owner="alice", attempt=1,
            request={"message": "hi"}, options={"model_override": "claude-opus-4-1"}, refs=[],
            history=[], patterns=[], source=MemoryDatasets([]), box=box, client=model,
            sink=sink)
    finally:
        box.close()
    assert OUTCOMES[result.end_reason] == "Failed" and not result.retryable
    [error] = result.errors
    assert error.kind == "MODEL_NOT_FOUND" and "'claude-opus-4-1'" in error.message
    assert model.requests == [] and sink.of(ModelCallEffect) == []
    assert sink.display("error")[0].data["kind"] == "MODEL_NOT_FOUND"
    assert sink.display()[-1].type == "done"


async def test_an_override_in_the_registry_is_the_model_called(tmp_path: Path) -> None:
    s = settings(state_dir=tmp_path, models=["claude-sonnet-4-5", "claude-haiku-4-5",
                                             "claude-opus-4-5"])
    model = ScriptedModel([[text("Hello.")]])
    box = SqlBox(timeout_s=5)
    try:
        result, _ = await run_assistant_turn(
            s, conversation="c", turn="c:turn-1", owner="alice", attempt=1,
            request={"message": "hi"}, options={"model_override": "claude-opus-4-5"}, refs=[],
            history=[], patterns=[], source=MemoryDatasets([]), box=box, client=model,
            sink=RecordingSink())
    finally:
        box.close()
    assert result.end_reason == "end_turn"
    assert [r.model for r in model.requests] == ["claude-opus-4-5"]


def test_every_spec_the_worker_builds_carries_the_registry(tmp_path: Path) -> None:
    s = settings(state_dir=tmp_path, assistant_model="claude-opus-4-5")
    assert assistant_spec(s, ToolRegistry()).allowed_models == s.allowed_models
    runner = AgentRunner(s, lambda: None)  # type: ignore[arg-type, return-value]
    spec = runner.spec("research-assistant", "You research.")
    assert spec.allowed_models == s.allowed_models
    assert spec.allows("claude-opus-4-5") and not spec.allows("claude-opus-4-1")
