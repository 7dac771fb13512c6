"""Settings of the assistant chat (``VOICE_*``), read by the edge and the worker alike (so they
live here, beside ``streams.settings``, on neither side of the wall).

``AssistantSettings`` extends ``VoiceSettings`` so one object carries both; build it with
``assistant_settings(settings)`` in a factory or lifespan, never at import.
"""

from __future__ import annotations

from pydantic import Field

from streams.settings import VoiceSettings

MIB = 1024 * 1024


class AssistantSettings(VoiceSettings):
    """``VoiceSettings`` plus what the assistant chat reads."""

    max_upload_bytes: int = Field(default=512 * 1024, ge=16, le=640 * 1024)
    """Largest CSV accepted by ``POST /api/v1/assistant/files`` (bytes); larger answers 413.
    At most 640 KiB: sealed and base64-encoded it must fit one Kafka record (1 MB)."""

    assistant_model: str | None = None
    """Model of the assistant agent; unset uses ``VOICE_MODEL``."""

    def configured_models(self) -> list[tuple[str, str]]:
        """The configured models, the assistant's own included (it must be allowed too)."""
        own = [("VOICE_ASSISTANT_MODEL", self.assistant_model)] if self.assistant_model else []
        return [*super().configured_models(), *own]

    assistant_query_rows: int = Field(default=1000, ge=1, le=100_000)
    """Rows ``query_dataset`` returns at most (the model sees the first 50 of them)."""

    assistant_map_features: int = Field(default=1000, ge=1, le=10_000)
    """Features one ``display_map`` call puts on the map at most."""

    assistant_sql_timeout_s: float = Field(default=10.0, gt=0)
    """A query in the SQL sandbox that runs longer is stopped (its process is killed)."""

    assistant_history_bytes: int = Field(default=256 * 1024, ge=1024)
    """Sealed transcript a turn reads at most (the most recent requests and replies); its
    input holds their positions on the log, never their content."""

    assistant_dataset_cache_bytes: int = Field(default=64 * MIB, ge=MIB)
    """Opened datasets a worker keeps in memory (least recently used go first)."""

    assistant_patterns_kept: int = Field(default=50, ge=1)
    """Patterns a conversation keeps for its suggested context (the most recent)."""

    assistant_tenant_patterns_kept: int = Field(default=500, ge=1)
    """Extracted patterns each worker keeps per tenant to offer its other conversations (the
    most recent; ``consumers.assistant.library``)."""


def assistant_settings(settings: VoiceSettings | None = None) -> AssistantSettings:
    """``AssistantSettings`` from the environment, keeping every value of ``settings``."""
    if isinstance(settings, AssistantSettings):
        return settings
    if settings is None:
        return AssistantSettings()
    return AssistantSettings(**settings.model_dump())
