"""The engine's agent runner and model client: the one place a worker gets a model client,
with ``ANTHROPIC_*`` read through settings (the key as a secret)."""

from __future__ import annotations

import asyncio

import pytest

from consumers.engine import RecordingSink, TurnInput
from consumers.engine.lean import LeanModel
from consumers.engine.runner import AgentRunner
from consumers.engine.testing import ScriptedModel, text
from streams.model_settings import ModelSettings
from streams.settings import VoiceSettings


def model_client(settings: VoiceSettings, model: ModelSettings):  # noqa: ANN201
    """The client the runner builds from ``model`` (the client module is the engine's own)."""
    return AgentRunner(settings, lambda: None, model=model).client  # type: ignore[arg-type, return-value]


SETTINGS = VoiceSettings(env="test", kafka_bootstrap="unused:1", fallback_models=[],
                         simulator_url="http://127.0.0.1:8199")


def test_the_key_is_a_secret_read_from_the_sdks_own_variable(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-real-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://api.example.test")
    model = ModelSettings()
    assert model.api_key is not None and "sk-ant-real-key" not in repr(model)
    assert not model.uses_simulator
    client = model_client(SETTINGS.model_copy(update={"model_client": "sdk"}), model)
    assert client.api_key == "sk-ant-real-key"
    assert str(client.base_url).startswith("https://api.example.test")
    assert client.max_retries == 0  # retries are the engine's fallback chain
    lean = model_client(SETTINGS, model)  # the default: the lean adapter, which never retries
    assert isinstance(lean, LeanModel) and lean.base_url == "https://api.example.test"
    assert lean._headers["authorization"] == "Bearer sk-ant-real-key"
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    assert model_client(SETTINGS, ModelSettings()).base_url == "https://api.anthropic.com"


@pytest.mark.parametrize("key", [None, "", "simulator"])
def test_without_a_real_key_the_client_points_at_the_simulator(
        monkeypatch: pytest.MonkeyPatch, key: str | None) -> None:
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    if key is None:
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    else:
        monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    model = ModelSettings()
    assert model.uses_simulator
    assert str(model_client(SETTINGS, model).base_url).startswith("http://127.0.0.1:8199")


def test_the_runner_builds_its_client_once_and_on_first_use(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    runner = AgentRunner(SETTINGS, lambda: None)  # type: ignore[arg-type, return-value]
    assert runner._client is None
    assert runner.client is runner.client
    assert str(runner.client.base_url).startswith("http://127.0.0.1:8199")


def test_the_runner_runs_a_spec_on_the_given_client() -> None:
    model = ScriptedModel([[text("hello from the fake")]])
    runner = AgentRunner(SETTINGS, lambda: None, client=model)  # type: ignore[arg-type, return-value]
    sink = RecordingSink()
    spec = runner.spec("greeter", "You greet.", max_agentic_turns=2)
    assert spec.model == SETTINGS.model and spec.fallback_models == ()
    result = asyncio.run(runner.run(spec, TurnInput(turn_id="t1", user_message="hi"), sink))
    assert result.final_text == "hello from the fake" and result.end_reason != "error"
    assert len(model.requests) == 1 and sink.effects
