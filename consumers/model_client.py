"""The model client every agent uses: the real Anthropic API with ``ANTHROPIC_API_KEY``, else
the bundled simulator (same SDK, same code path, different base URL)."""

from __future__ import annotations

import os

import anthropic

from streams.settings import VoiceSettings


def uses_simulator() -> bool:
    key = os.environ.get("ANTHROPIC_API_KEY")
    return not key or key == "simulator"


def model_client(settings: VoiceSettings) -> anthropic.AsyncAnthropic:
    """An async Anthropic client; retries are the engine's job (fallback chain), not the SDK's."""
    if uses_simulator():
        base = os.environ.get("ANTHROPIC_BASE_URL") or settings.simulator_url
        return anthropic.AsyncAnthropic(api_key="simulator", base_url=base, max_retries=0)
    return anthropic.AsyncAnthropic(max_retries=0)
