"""Settings for every Voice process, read from ``VOICE_*`` environment variables.

Built in a factory (``load_settings``), never at import, so tests can set the environment first.
A default secret is refused outside ``VOICE_ENV=dev``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from streams.ids import TENANT_PATTERN

DEV_JWT_SECRET = "voice-dev-secret-not-for-production-use!"


class VoiceSettings(BaseSettings):
    """What every process kind (edge, worker, telemetry sink, CLI) reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="VOICE_", extra="ignore")

    env: Literal["dev", "test", "prod"] = "dev"
    """``dev`` allows built-in default secrets; ``prod`` refuses them."""

    kafka_bootstrap: str | None = None
    """``host:port[,host:port]`` of an existing cluster; unset means the local broker."""

    topic_prefix: str = ""
    """Prepended to every topic name; tests use it to give each test its own topics."""

    topic_partitions: int = Field(default=6, ge=1)
    """Partitions of each topic when ``voice topics create`` makes it."""

    replication_factor: int = Field(default=1, ge=1)

    group_prefix: str = "voice"
    """Prefix of consumer group ids (and of the Faust application id)."""

    state_dir: Path = Path(".state")
    """Folder the local broker, the embedded ClickHouse and the local key store own."""

    gateway_bound_s: float = Field(default=15.0, gt=0)
    """Every response, streams included, ends before this bound."""

    jwt_secret: SecretStr = SecretStr(DEV_JWT_SECRET)
    jwt_algorithm: str = "HS256"

    default_tenant: str = Field(default="default", pattern=TENANT_PATTERN)
    """The tenant of a token that names neither a tenant nor memberships."""

    edge_host: str = "127.0.0.1"
    edge_port: int = 8000

    master_key: SecretStr | None = None
    """Wraps the per-conversation data keys of the local key store; required outside dev/test."""

    max_message_bytes: int = Field(default=16 * 1024, ge=1)
    """Largest participant message accepted (UTF-8 bytes); larger answers 422."""

    edge_events_kept: int = Field(default=10_000, ge=10)
    """Events an edge keeps per conversation for SSE resume; older cursors answer 409."""

    step_attempts: int = Field(default=3, ge=1)
    """Immediate attempts of a failing workflow step before the workflow fails."""

    model: str = "claude-sonnet-4-5"
    """The model agents call (through the simulator unless ANTHROPIC_API_KEY is set)."""

    fallback_models: list[str] = ["claude-haiku-4-5"]
    """Tried in order when the model is rate limited or overloaded."""

    compaction_model: str = "claude-haiku-4-5"

    models: Annotated[list[str], NoDecode] = []
    """``VOICE_MODELS``: the models this deployment allows (comma-separated or a JSON list); a
    ``model_override`` outside it answers 422 ``MODEL_NOT_FOUND``. Unset: the configured models
    (``allowed_models``). Every configured model must be in it, or the settings are refused."""

    simulator_url: str = "http://127.0.0.1:8100"
    """Where the model simulator listens when ANTHROPIC_API_KEY is unset."""

    worker_concurrency: int = Field(default=64, ge=1)
    """Workflow steps (turns) one worker runs at once."""

    quota_messages_per_minute: int = Field(default=60, ge=0)
    """Messages (conversation messages and assistant chat turns) a principal may send per
    minute, per edge; more answer 429 with ``Retry-After``. 0: unlimited."""

    quota_conversations_per_day: int = Field(default=500, ge=0)
    """Conversations (participant and assistant) a principal may open per day, per edge."""

    quota_uploads_per_day: int = Field(default=200, ge=0)
    """Dataset uploads a principal may make per day, per edge."""

    quota_streams: int = Field(default=10, ge=0)
    """SSE streams a principal may hold open at once on one edge."""

    quota_tenant_tokens_per_day: int = Field(default=10_000_000, ge=0)
    """Model tokens (input, cached input and output) a tenant's turns may use per day, counted
    by each worker; a turn that starts over it ends with ``TOKEN_QUOTA_EXCEEDED``."""

    quota_tracked_keys: int = Field(default=100_000, ge=1)
    """Principals (or tenants) each quota counter remembers at most (bounded memory)."""

    staff_step_delay_ms: str = ""
    """Tests only: ``step=ms,step=ms``; the named staff workflow steps sleep that long at their
    midpoint, so a test can kill a worker in the middle of them. Unset in every deployment."""

    @model_validator(mode="after")
    def _refuse_default_secrets(self) -> VoiceSettings:
        if self.env == "prod" and self.jwt_secret.get_secret_value() == DEV_JWT_SECRET:
            raise ValueError("VOICE_JWT_SECRET must be set when VOICE_ENV='prod'")
        return self

    @field_validator("models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        """``a,b`` or ``["a", "b"]`` from the environment; a list as it is."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [m.strip() for m in text.split(",") if m.strip()]
        return value

    def configured_models(self) -> list[tuple[str, str]]:
        """(setting, model) of every model this process is configured to call."""
        return [("VOICE_MODEL", self.model),
                *(("VOICE_FALLBACK_MODELS", m) for m in self.fallback_models),
                ("VOICE_COMPACTION_MODEL", self.compaction_model)]

    @property
    def allowed_models(self) -> tuple[str, ...]:
        """The model registry: ``VOICE_MODELS``, else every configured model (in order)."""
        names = self.models or [m for _, m in self.configured_models()]
        return tuple(dict.fromkeys(names))

    @model_validator(mode="after")
    def _configured_models_are_allowed(self) -> VoiceSettings:
        if self.models:
            outside = [f"{name}={m!r}" for name, m in self.configured_models()
                       if m not in self.models]
            if outside:
                raise ValueError(f"{', '.join(outside)} not in VOICE_MODELS {self.models!r}: "
                                 "a configured model must be one the deployment allows")
        return self

    @property
    def bootstrap(self) -> str:
        """The bootstrap servers to use; the local broker's address must be set by then."""
        if not self.kafka_bootstrap:
            raise RuntimeError(
                "VOICE_KAFKA_BOOTSTRAP is not set: start the local broker with `voice up` "
                "or point it at a cluster (host:port)"
            )
        return self.kafka_bootstrap


def load_settings(**overrides: object) -> VoiceSettings:
    """Read the settings from the environment, with explicit overrides winning."""
    return VoiceSettings(**overrides)  # type: ignore[arg-type]
