"""Settings of the model API (``ANTHROPIC_*``): whether model calls go to the real Anthropic API
or to the bundled simulator, read by the worker's model client and by ``voice up`` alike (so
they live here, beside ``streams.settings``, on neither side of the wall).

The variables keep the Anthropic SDK's own names (no ``VOICE_`` prefix) so a key set for the SDK
works unchanged. Build ``ModelSettings()`` in a factory, never at import. This module must
never import the SDK: only the engine does (``consumers.engine.client`` builds the client from
these settings; ``voice up`` reads them to decide whether to start the simulator, and may not
import the engine's client).
"""

from __future__ import annotations

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

SIMULATOR_KEY = "simulator"
"""The key the stack hands to children that talk to the simulator (it checks none)."""


class ModelSettings(BaseSettings):
    """``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL``; an empty variable counts as unset."""

    model_config = SettingsConfigDict(env_prefix="ANTHROPIC_", extra="ignore",
                                      env_ignore_empty=True)

    api_key: SecretStr | None = None
    """Key of the real API; unset (or ``simulator``) sends model calls to the simulator."""

    base_url: str | None = None
    """Where the SDK sends requests; unset uses the simulator's URL while it is in use."""

    @property
    def uses_simulator(self) -> bool:
        """True when no real key is configured, so the simulator answers the model calls."""
        return self.api_key is None or self.api_key.get_secret_value() == SIMULATOR_KEY
