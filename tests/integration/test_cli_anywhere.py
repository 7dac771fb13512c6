"""The ``voice`` commands find a running stack from any folder (issue 10, point 5): through the
state folder's recorded broker address, the state folder being absolute — given by ``--state``
or ``VOICE_STATE_DIR``, else one default per user — and say where they looked when nothing
runs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from streams.settings import VoiceSettings
from streams.topics import create_topics

pytestmark = pytest.mark.integration


def voice(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def clean_env(settings: VoiceSettings, **extra: str) -> dict[str, str]:
    """The test's topics, and no broker or state folder configured: found, or not."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VOICE_KAFKA_BOOTSTRAP", "VOICE_STATE_DIR", "XDG_STATE_HOME")}
    env.update(VOICE_TOPIC_PREFIX=settings.topic_prefix, VOICE_ENV="test", **extra)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


def record_broker(state: Path, bootstrap: str) -> None:
    """What ``voice up`` writes for the other commands (``deploy.supervisor.bootstrap_file``)."""
    (state / "kafka").mkdir(parents=True, exist_ok=True)
    (state / "kafka" / "bootstrap").write_text(bootstrap + "\n")


def test_topics_list_finds_the_stack_from_another_folder_by_state_option_env_and_default(
        settings: VoiceSettings, tmp_path: Path) -> None:
    create_topics(settings)
    state, elsewhere, xdg = tmp_path / "st", tmp_path / "somewhere" / "else", tmp_path / "xdg"
    elsewhere.mkdir(parents=True)
    record_broker(state, settings.bootstrap)
    record_broker(xdg / "voice", settings.bootstrap)
    conversations = f"{settings.topic_prefix}voice.conversations"

    by_option = voice("--state", str(state), "topics", "list", cwd=elsewhere,
                      env=clean_env(settings))
    by_env = voice("topics", "list", cwd=Path("/"),
                   env=clean_env(settings, VOICE_STATE_DIR=str(state)))
    by_default = voice("topics", "list", cwd=elsewhere,
                       env=clean_env(settings, XDG_STATE_HOME=str(xdg)))
    for run in (by_option, by_env, by_default):
        assert run.returncode == 0, run.stderr
        line = next(ln for ln in run.stdout.splitlines() if ln.startswith(conversations))
        assert "MISSING" not in line, line


def test_with_nothing_running_the_command_names_the_folder_and_file_it_looked_in(
        settings: VoiceSettings, tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    run = voice("tail", "voice.conversations", cwd=tmp_path,
                env=clean_env(settings, XDG_STATE_HOME=str(xdg)))
    assert run.returncode == 2
    assert f"no `voice up` is running with state folder {xdg / 'voice'}" in run.stderr
    assert str(xdg / "voice" / "kafka" / "bootstrap") in run.stderr
    assert "VOICE_KAFKA_BOOTSTRAP" in run.stderr and "--state" in run.stderr


def test_a_stale_address_from_a_stopped_voice_up_is_named_not_waited_on(
        settings: VoiceSettings, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    record_broker(tmp_path / "st", f"127.0.0.1:{port}")
    run = voice("--state", str(tmp_path / "st"), "topics", "list", cwd=tmp_path,
                env=clean_env(settings))
    assert run.returncode == 2
    assert f"(127.0.0.1:{port}) does not answer" in run.stderr, run.stderr
