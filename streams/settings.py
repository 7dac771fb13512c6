"""Settings for every Voice process, read from ``VOICE_*`` environment variables.

Built in a factory (``load_settings``), never at import, so tests can set the environment first.
A default secret is refused outside ``VOICE_ENV=dev``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

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

    default_tenant: str = Field(default="default", min_length=1, max_length=128)
    """The tenant of a token that names neither a tenant nor memberships."""

    edge_host: str = "127.0.0.1"
    edge_port: int = 8000

    master_key: SecretStr | None = None
    """Wraps the per-conversation data keys of the local key store; required outside dev/test."""

    max_message_bytes: int = Field(default=16 * 1024, ge=1, le=64 * 1024)
    """Largest participant message accepted (UTF-8 bytes); larger answers 422. At most 64 KiB,
    the edge's bound on any one string of a request."""

    max_body_bytes: int = Field(default=1024 * 1024, ge=16 * 1024)
    """Largest request body the edge reads, on every route but the CSV upload (which has
    ``VOICE_MAX_UPLOAD_BYTES``); larger answers 413 while reading, before the body is parsed or
    the caller authenticated."""

    max_record_bytes: int = Field(default=900_000, ge=16 * 1024, le=1_000_000)
    """Largest record (key, value and headers) the edge produces; larger answers 413 and is
    never sent. At most 1,000,000, the client's ``message.max.bytes``, itself below the
    broker's default topic ``max.message.bytes`` (1,048,588); the default leaves room for the
    writer's records, which carry a command's payload and a little more. Lower it if the
    cluster's topics take less."""

    edge_events_kept: int = Field(default=10_000, ge=10)
    """Events an edge keeps per conversation for SSE resume; older cursors answer 409."""

    step_attempts: int = Field(default=3, ge=1)
    """Immediate attempts of a failing workflow step before the workflow fails."""

    model: str = "claude-sonnet-4-5"
    """The model agents call (through the simulator unless ANTHROPIC_API_KEY is set)."""

    fallback_models: list[str] = ["claude-haiku-4-5"]
    """Tried in order when the model is rate limited or overloaded."""

    compaction_model: str = "claude-haiku-4-5"

    simulator_url: str = "http://127.0.0.1:8100"
    """Where the model simulator listens when ANTHROPIC_API_KEY is unset."""

    worker_concurrency: int = Field(default=64, ge=1)
    """Workflow steps (turns) one worker runs at once."""

    staff_step_delay_ms: str = ""
    """Tests only: ``step=ms,step=ms``; the named staff workflow steps sleep that long at their
    midpoint, so a test can kill a worker in the middle of them. Unset in every deployment."""

    @model_validator(mode="after")
    def _refuse_default_secrets(self) -> VoiceSettings:
        if self.env == "prod" and self.jwt_secret.get_secret_value() == DEV_JWT_SECRET:
            raise ValueError("VOICE_JWT_SECRET must be set when VOICE_ENV='prod'")
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
