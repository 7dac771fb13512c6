"""The settings deploy and the model client read from the environment (pydantic-settings)."""

from __future__ import annotations

import os
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


class ExitedChild:
    """A child of ``voice up`` that has already exited (so ``up`` stops at once)."""

    returncode = 0

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def spawned_by_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, dict[str, str]]:
    """The children ``voice up`` starts against an external cluster, with their environment."""
    from deploy import supervisor
    from streams.settings import VoiceSettings

    children: dict[str, dict[str, str]] = {}

    def spawn(name: str, args: list[str], env: dict[str, str]) -> ExitedChild:
        children[args[0]] = dict(env)
        return ExitedChild()

    monkeypatch.setattr(supervisor, "create_topics", lambda settings: {})
    monkeypatch.setattr(supervisor, "_spawn", spawn)
    settings = VoiceSettings(kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path, env="test")
    assert supervisor.up(settings) == 1  # a child exited: the stack stops
    return children


def test_voice_up_starts_the_simulator_without_a_key(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("VOICE_SIMULATOR_PORT", "8123")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "")
    children = spawned_by_up(monkeypatch, tmp_path)
    assert set(children) == {"simulator", "worker", "telemetry", "edge"}
    assert children["worker"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"
    assert children["worker"]["ANTHROPIC_API_KEY"] == "simulator"


def test_voice_up_leaves_a_real_key_to_the_real_api(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-real")
    children = spawned_by_up(monkeypatch, tmp_path)
    assert set(children) == {"worker", "telemetry", "edge"}
    assert children["worker"]["ANTHROPIC_API_KEY"] == "sk-ant-real"
    assert "ANTHROPIC_BASE_URL" not in children["worker"]


def test_the_state_folder_is_absolute_and_one_per_user_by_default(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from streams.settings import VoiceSettings, default_state_dir

    monkeypatch.delenv("VOICE_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert VoiceSettings().state_dir == tmp_path / "xdg" / "voice"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_dir() == tmp_path / "home" / ".local" / "state" / "voice"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VOICE_STATE_DIR", "rel/state")  # a relative one: from where it starts
    assert VoiceSettings().state_dir == tmp_path / "rel" / "state"


def test_a_child_runs_the_code_of_its_parents_checkout(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """Regression (issue 14, eleventh pass): children started in the state folder imported the
    project from its (editable) install, another checkout's code than the parent's."""
    import subprocess
    import sys

    from deploy.processes import SOURCE_TREE, voice_env
    from streams.settings import VoiceSettings

    assert (SOURCE_TREE / "deploy" / "processes.py").is_file()
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = voice_env(VoiceSettings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1"))
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SOURCE_TREE), "/elsewhere"]
    out = subprocess.run([sys.executable, "-c", "import deploy.processes as p; print(p.__file__)"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(SOURCE_TREE / "deploy" / "processes.py")



def test_a_workers_standby_copies_come_from_the_settings(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """``VOICE_WORKER_STANDBY_REPLICAS`` reaches Faust (1 by default: a takeover finds each
    table warm; 0 saves every worker applying the others' changelogs)."""
    from consumers.frame.context import faust_app
    from streams.settings import VoiceSettings

    monkeypatch.setenv("VOICE_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("VOICE_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never reached: not started
    assert faust_app(VoiceSettings()).conf.table_standby_replicas == 1
    monkeypatch.setenv("VOICE_WORKER_STANDBY_REPLICAS", "0")
    assert faust_app(VoiceSettings()).conf.table_standby_replicas == 0
    monkeypatch.setenv("VOICE_WORKER_STANDBY_REPLICAS", "-1")
    with pytest.raises(ValueError, match="worker_standby_replicas"):
        VoiceSettings()


def test_a_workers_ready_file_is_a_file_or_unset(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    """``VOICE_WORKER_READY_FILE``: empty is unset (a template's blank line); a folder is
    refused at start with the variable named, not found by a probe that never passes."""
    from streams.settings import VoiceSettings

    monkeypatch.setenv("VOICE_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("VOICE_WORKER_READY_FILE", "")
    assert VoiceSettings().worker_ready_file is None
    monkeypatch.setenv("VOICE_WORKER_READY_FILE", str(tmp_path / "worker.ready"))
    assert VoiceSettings().worker_ready_file == tmp_path / "worker.ready"
    for folder in (str(tmp_path), ".", "/tmp/"):
        monkeypatch.setenv("VOICE_WORKER_READY_FILE", folder)
        with pytest.raises(ValueError, match="VOICE_WORKER_READY_FILE must name a file"):
            VoiceSettings()
