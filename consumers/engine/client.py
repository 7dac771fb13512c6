"""The model client every agent uses: the real Anthropic API with ``ANTHROPIC_API_KEY``, else
the bundled simulator (same SDK, same code path, different base URL).

Only the engine builds it (``consumers.engine.runner.AgentRunner``); nothing else in the worker
constructs a client or reads the key.
"""

from __future__ import annotations

import anthropic
from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.settings import VoiceSettings

SIMULATOR_KEY = "simulator"
"""The key that means "the simulator" (``voice up`` sets it when no real key is given)."""


class ModelSettings(BaseSettings):
    """The Anthropic SDK's own variables (no ``VOICE_`` prefix: the SDK's names are the
    contract every Anthropic tool shares). Built in a factory, never at import."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    api_key: SecretStr | None = Field(default=None, validation_alias=AliasChoices(
        "ANTHROPIC_API_KEY", "api_key"))
    """The real API's key; unset (or ``simulator``) means the bundled simulator."""

    base_url: str | None = Field(default=None, validation_alias=AliasChoices(
        "ANTHROPIC_BASE_URL", "base_url"))
    """Where the simulator (or another Messages API) listens; unset uses the settings'."""

    @property
    def uses_simulator(self) -> bool:
        return self.api_key is None or self.api_key.get_secret_value() in ("", SIMULATOR_KEY)


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
