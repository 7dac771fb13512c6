"""The documentation names what the code registers: every topic, every worker table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streams.topics import TOPICS

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()


def test_architecture_lists_every_registered_topic() -> None:
    missing = [t.name for t in TOPICS if f"| `{t.name}` |" not in ARCHITECTURE]
    assert not missing, f"docs/architecture.md's topic table lacks {missing}"


def test_architecture_lists_every_worker_table(make_worker: Any) -> None:
    from streams.settings import VoiceSettings

    worker = make_worker(VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1"))
    names = [t.name for t in worker.app.tables.values()]
    assert names, "the worker has tables"
    missing = [n for n in names if f"`{n}`" not in ARCHITECTURE]
    assert not missing, f"docs/architecture.md's changelog list lacks {missing}"


def test_the_capability_table_in_the_security_docs_is_the_code_s() -> None:
    """docs/security.md shows exactly ``streams.capabilities.CAPABILITIES``."""
    from streams.capabilities import CAPABILITIES

    text = (ROOT / "docs" / "security.md").read_text()
    all_lines = text.splitlines()
    start = next(i for i, ln in enumerate(all_lines) if ln.startswith("| capability |"))
    header = all_lines[start]
    end = next(i for i in range(start, len(all_lines)) if not all_lines[i].startswith("|"))
    lines = all_lines[start + 2:end]
    roles = [c.strip() for c in header.strip("|").split("|")[1:]]
    assert sorted(roles) == sorted(CAPABILITIES)
    shown: dict[str, set[str]] = {r: set() for r in roles}
    for ln in lines:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        cap = cells[0].split("`")[1]
        for role, cell in zip(roles, cells[1:], strict=True):
            if cell == "✓":
                shown[role].add(cap)
    assert shown == {r: set(c) for r, c in CAPABILITIES.items()}
