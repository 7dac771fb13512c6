"""The model client every agent uses: the real Anthropic API with ``ANTHROPIC_API_KEY``, else
the bundled simulator (same code path, different base URL).

``VOICE_MODEL_CLIENT`` chooses how: ``lean`` (the default) is ``consumers.engine.lean``'s
``LeanModel``, the Messages API's stream read over httpx (on aiohttp's pool unless
``VOICE_MODEL_HTTP=httpx``); ``sdk`` is ``anthropic.AsyncAnthropic``
(adapted by ``consumers.engine.model.AnthropicModel``). Both give the engine the same results
(``tests/unit/test_engine_lean.py``).

Only the engine builds it (``consumers.engine.runner.AgentRunner``); nothing else in the worker
constructs a client or reads the key.
"""

from __future__ import annotations

import anthropic

from consumers.engine.lean import LeanModel
from streams.model_settings import SIMULATOR_KEY, ModelSettings
from streams.settings import VoiceSettings

DEFAULT_BASE_URL = "https://api.anthropic.com"
"""Where the real API is when ``ANTHROPIC_BASE_URL`` is unset (the SDK's default)."""


def model_client(settings: VoiceSettings, model: ModelSettings | None = None
                 ) -> anthropic.AsyncAnthropic | LeanModel:
    """The model client the settings choose; retries are the engine's job (fallback chain),
    not the client's."""
    model = model or ModelSettings()
    if model.uses_simulator:
        key, base_url = SIMULATOR_KEY, model.base_url or settings.simulator_url
    else:
        assert model.api_key is not None
        key, base_url = model.api_key.get_secret_value(), model.base_url
    if settings.model_client == "lean":
        return LeanModel(base_url or DEFAULT_BASE_URL, key, http=settings.model_http)
    return anthropic.AsyncAnthropic(api_key=key, base_url=base_url, max_retries=0)
