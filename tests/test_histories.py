"""Recorded turns under ``tests/histories/`` re-run on today's engine: a change that breaks an
old conversation fails here. Add one with ``voice replay workflow ID --export FILE``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from deploy.histories import load_history
from deploy.replay import rerun_turn
from streams.settings import VoiceSettings

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_there_are_recorded_histories() -> None:
    assert len(HISTORIES) >= 2


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
def test_recorded_turn_reruns_without_divergence(path: Path) -> None:
    workflow, sealer, envs = load_history(path)
    assert envs["voice.agent"], "a history holds the turn's agent records"
    divergences = asyncio.run(rerun_turn(VoiceSettings(), workflow, envs["voice.workflows"],
                                         envs["voice.agent"], sealer,
                                         envs.get("voice.conversations")))
    assert divergences == []


def test_a_tampered_history_diverges() -> None:
    """The check can fail: drop a recorded tool result and the re-run no longer matches."""
    workflow, sealer, envs = load_history(HISTORIES[0])
    agent = [e for e in envs["voice.agent"] if e.type != "voice.agent.tool_call.v1"]
    assert len(agent) < len(envs["voice.agent"]), "the history has a tool call to drop"
    divergences = asyncio.run(rerun_turn(VoiceSettings(), workflow, envs["voice.workflows"],
                                         agent, sealer))
    assert divergences
