"""The settings deploy and the model client read from the environment (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.kafka_local import KAFKA_VERSION, LocalKafkaSettings, default_cache_dir
from deploy.simulator import SimulatorSettings
from streams.model_settings import ModelSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "VOICE_KAFKA_CACHE",
                 "VOICE_LOCAL_KAFKA_PORT", "VOICE_SIMULATOR_HOST", "VOICE_SIMULATOR_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_without_a_key_model_calls_go_to_the_simulator(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ModelSettings().uses_simulator and ModelSettings().api_key is None
    monkeypatch.setenv("API_KEY", "someone-elses")  # only the SDK's own names count
    monkeypatch.setenv("BASE_URL", "http://elsewhere")
    assert ModelSettings().api_key is None and ModelSettings().base_url is None
    monkeypatch.setenv("ANTHROPIC_API_KEY", "")  # an empty variable counts as unset
    assert ModelSettings().api_key is None
    monkeypatch.setenv("ANTHROPIC_API_KEY", "simulator")
    assert ModelSettings().uses_simulator


def test_a_real_key_is_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-real")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://api.anthropic.com")
    s = ModelSettings()
    assert not s.uses_simulator and s.base_url == "https://api.anthropic.com"
    assert s.api_key is not None and s.api_key.get_secret_value() == "sk-ant-real"
    assert "sk-ant-real" not in repr(s) and "sk-ant-real" not in s.model_dump_json()


def test_local_kafka_cache_and_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert default_cache_dir() == Path.home() / ".cache" / "voice" / f"kafka-{KAFKA_VERSION}"
    assert LocalKafkaSettings().local_kafka_port == 9092
    monkeypatch.setenv("VOICE_KAFKA_CACHE", str(tmp_path))
    monkeypatch.setenv("VOICE_LOCAL_KAFKA_PORT", "19092")
    assert default_cache_dir() == tmp_path
    assert LocalKafkaSettings().local_kafka_port == 19092
    monkeypatch.setenv("VOICE_LOCAL_KAFKA_PORT", "0")
    with pytest.raises(ValueError, match="local_kafka_port"):
        LocalKafkaSettings()


def test_simulator_host_and_port(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (SimulatorSettings().host, SimulatorSettings().port) == ("127.0.0.1", 8100)
    monkeypatch.setenv("VOICE_SIMULATOR_HOST", "0.0.0.0")
    monkeypatch.setenv("VOICE_SIMULATOR_PORT", "8101")
    assert (SimulatorSettings().host, SimulatorSettings().port) == ("0.0.0.0", 8101)
