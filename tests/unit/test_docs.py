"""The documentation names what the code registers: every topic, every worker table."""

from __future__ import annotations

from pathlib import Path

from streams.topics import TOPICS

ARCHITECTURE = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()


def test_architecture_lists_every_registered_topic() -> None:
    missing = [t.name for t in TOPICS if f"| `{t.name}` |" not in ARCHITECTURE]
    assert not missing, f"docs/architecture.md's topic table lacks {missing}"


def test_architecture_lists_every_worker_table() -> None:
    from consumers.app import create_worker
    from streams.settings import VoiceSettings

    worker = create_worker(VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1"))
    names = [t.name for t in worker.app.tables.values()]
    assert names, "the worker has tables"
    missing = [n for n in names if f"`{n}`" not in ARCHITECTURE]
    assert not missing, f"docs/architecture.md's changelog list lacks {missing}"
