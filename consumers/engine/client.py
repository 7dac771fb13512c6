"""The model client every agent uses: the real Anthropic API with ``ANTHROPIC_API_KEY``, else
the bundled simulator (same SDK, same code path, different base URL).

Only the engine builds it (``consumers.engine.runner.AgentRunner``); nothing else in the worker
constructs a client or reads the key.
"""

from __future__ import annotations

import anthropic

from streams.model_settings import SIMULATOR_KEY, ModelSettings
from streams.settings import VoiceSettings


def model_client(settings: VoiceSettings, model: ModelSettings | None = None
                 ) -> anthropic.AsyncAnthropic:
    """An async Anthropic client; retries are the engine's job (fallback chain), not the SDK's."""
    model = model or ModelSettings()
    if model.uses_simulator:
        return anthropic.AsyncAnthropic(api_key=SIMULATOR_KEY,
                                        base_url=model.base_url or settings.simulator_url,
                                        max_retries=0)
    assert model.api_key is not None
    return anthropic.AsyncAnthropic(api_key=model.api_key.get_secret_value(),
                                    base_url=model.base_url, max_retries=0)
