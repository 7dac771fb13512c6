"""The local broker says exactly what to install when Java or Maven is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy import kafka_local
from deploy.kafka_local import LocalKafka, LocalKafkaError, ensure_jars


def _without(monkeypatch: pytest.MonkeyPatch, *tools: str) -> None:
    real = kafka_local.shutil.which
    monkeypatch.setattr(kafka_local.shutil, "which",
                        lambda name: None if name in tools else real(name))


def test_missing_java_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _without(monkeypatch, "java")
    with pytest.raises(LocalKafkaError) as err:
        LocalKafka(data_dir=tmp_path, port=kafka_local.free_port()).start()
    assert "apt-get install openjdk-17-jre-headless" in str(err.value)
    assert "VOICE_KAFKA_BOOTSTRAP" in str(err.value)


def test_missing_maven_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _without(monkeypatch, "mvn")
    with pytest.raises(LocalKafkaError, match="apt-get install maven"):
        ensure_jars(tmp_path / "empty-cache")


def test_a_filled_cache_needs_no_maven(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / ".complete").write_text("4.1.1\n")
    _without(monkeypatch, "mvn", "java")
    assert ensure_jars(tmp_path) == tmp_path


def test_cli_up_reports_missing_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from deploy.cli import app

    _without(monkeypatch, "java")
    monkeypatch.delenv("VOICE_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("VOICE_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("VOICE_LOCAL_KAFKA_PORT", str(kafka_local.free_port()))
    result = CliRunner().invoke(app, ["up"])
    assert result.exit_code == 1
    assert "openjdk-17-jre-headless" in result.output
