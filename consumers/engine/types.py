"""The engine's typed surface: what an agent is, what a turn gets and gives, and the effects.

Every side effect of a turn is one ``Effect`` (a frozen model with an idempotency ``key``) that
passes through ``EffectSink.emit``; nothing else in the engine does I/O except the model call.
Keys are derived from the turn, the attempt and the position in the turn, so re-running the same
attempt produces the same keys and a redelivered record is deduplicated where it lands.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from consumers.engine.tools import ToolRegistry

EndReason = Literal["end_turn", "max_turns", "context_limit", "cancelled", "error"]
TERMINAL_KINDS = frozenset({"MODEL_NOT_FOUND", "TOKEN_QUOTA_EXCEEDED"})
"""Error kinds another attempt of the same turn would meet again."""


@dataclass(frozen=True)
class AgentSpec:
    """One agent: its identity (static prompt), tools, models and budgets."""

    name: str
    identity: str
    tools: ToolRegistry
    model: str
    fallback_models: tuple[str, ...] = ()
    compaction_model: str | None = None
    """Model that summarises old history; ``None`` uses ``model``."""
    max_agentic_turns: int = 75
    context_window: int = 200_000
    max_output_tokens: int = 4096
    history_token_budget: int = 60_000
    history_recent_keep: int = 8
    """Messages kept raw at most when older history is replaced by a summary."""
    history_raw_share: float = 0.5
    """Share of ``history_token_budget`` the raw part may hold at most right after a new
    summary: the headroom left before the next one is needed (hysteresis)."""
    loop_guard_threshold: int = 3
    failed_approach_threshold: int = 2
    tool_guidance: str = ""
    """Extra prose about how to use the tools, appended to the generated tool list."""
    allowed_models: tuple[str, ...] = ()
    """The deployment's model registry (``VOICE_MODELS``): a turn's ``model_override`` must be
    one of these or of the spec's own models, else the turn ends ``MODEL_NOT_FOUND`` with no
    model called."""

    def allows(self, model: str) -> bool:
        """Whether a turn may ask for ``model`` (an override)."""
        own = (self.model, *self.fallback_models, self.compaction_model)
        return model in own or model in self.allowed_models


@dataclass(frozen=True)
class StateView:
    """What a ``state_provider`` may look at to build the ``[CURRENT_STATE]`` block."""

    iteration: int
    turn_id: str
    conversation_id: str | None
    dataset_ids: tuple[str, ...]
    tools_called: tuple[str, ...]
    plan: tuple[tuple[str, bool], ...] = ()


StateProvider = Callable[[StateView], str | Awaitable[str]]


@dataclass(frozen=True)
class HistorySummary:
    """A compaction summary of ``history[:summary_through]``."""

    text: str
    summary_through: int


@dataclass(frozen=True)
class TurnInput:
    """One turn: the user's message and the canonical history before it (Messages API shape)."""

    turn_id: str
    user_message: str | list[dict[str, Any]]
    history: list[dict[str, Any]] = field(default_factory=list)
    conversation_id: str | None = None
    state_provider: StateProvider | None = None
    principal: Any = None
    dataset_ids: tuple[str, ...] = ()
    model_override: str | None = None
    """An explicit model pick; outside the spec's registry (``AgentSpec.allows``) or unknown to
    the provider → ``MODEL_NOT_FOUND``, never a silent substitute."""
    summary: HistorySummary | None = None
    """The conversation's stored summary, reused when it still covers the right prefix."""
    attempt: int = 1
    skip_history: bool = False
    inference_params: dict[str, float] = field(default_factory=dict)
    """Per-request sampling overrides (``temperature``, ``top_p``, ``top_k``) for every call."""
    tenant: str | None = None
    """The turn's tenant, handed to every tool (``ToolContext.tenant``)."""
    capabilities: frozenset[str] = frozenset()
    """The asking principal's capabilities as the edge resolved them (``ToolContext``)."""


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    """Uncached input tokens, as the Messages API reports them."""
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @property
    def total_input(self) -> int:
        """Input tokens including cache reads and writes (the OTel GenAI count)."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens,
                     self.output_tokens + other.output_tokens,
                     self.cache_read_input_tokens + other.cache_read_input_tokens,
                     self.cache_creation_input_tokens + other.cache_creation_input_tokens)


@dataclass(frozen=True)
class TurnError:
    """Why a turn ended with ``end_reason == "error"``."""

    kind: str
    message: str


@dataclass(frozen=True)
class TurnResult:
    """What a turn produced; its side effects went through the sink."""

    final_text: str
    end_reason: EndReason
    cost_usd: float
    usage: Usage
    messages_appended: list[dict[str, Any]]
    """The structured tool-call chain after the user's message, JSON-sanitised."""
    cards: list[dict[str, Any]] = field(default_factory=list)
    errors: tuple[TurnError, ...] = ()
    warnings: tuple[str, ...] = ()
    model_calls: int = 0
    summary: HistorySummary | None = None
    """The summary in effect for this turn: the stored one reused, or a new one."""
    summarised: bool = False
    """Whether ``summary`` was made this turn (so the caller records it)."""

    @property
    def retryable(self) -> bool:
        """Whether running the turn again may end otherwise: not when every error is one
        another attempt would meet again (a model outside the registry, a spent quota)."""
        return not self.errors or any(e.kind not in TERMINAL_KINDS for e in self.errors)

    def __post_init__(self) -> None:
        if bool(self.errors) != (self.end_reason == "error"):
            raise ValueError(f"errors {self.errors!r} do not match end_reason {self.end_reason!r}")


# ------------------------------------------------------------------------------ display events
DisplayType = Literal["text_delta", "text_complete", "reasoning", "tool_call", "tool_result",
                      "busy", "idle", "status", "progress", "card", "cost", "error", "warning",
                      "done"]


class DisplayEvent(BaseModel):
    """What an SSE client sees (the wire payload of ``event: display``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    type: DisplayType
    channel: str
    scope: str = "turn"
    message_id: str | None = None
    verb: str | None = None
    priority: int = 0
    data: dict[str, Any] = {}
    persistent: bool = True
    ts: float
    group_id: str | None = None
    parent_id: str | None = None
    display_id: str | None = None
    metadata: dict[str, Any] = {}


# ------------------------------------------------------------------------------ effects
class _Effect(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    """Idempotency key: the record id it becomes, so redelivery is deduplicated."""
    turn_id: str
    conversation_id: str | None = None


class PersistMessage(_Effect):
    """The end-of-turn write of the assistant's reply with its full tool-call chain."""

    kind: Literal["persist_message"] = "persist_message"
    content: str
    structured_content: list[dict[str, Any]]
    cards: list[dict[str, Any]] = []
    cost_usd: float = 0.0
    end_reason: str = "end_turn"


class TelemetryEffect(_Effect):
    """A content-free telemetry fact (labels, envelopes, compactions, guardrails)."""

    kind: Literal["telemetry"] = "telemetry"
    name: str
    attributes: dict[str, Any] = {}


class DisplayChunk(_Effect):
    kind: Literal["display"] = "display"
    event: DisplayEvent


class ModelCallEffect(_Effect):
    """One model call (or one failed attempt of the fallback chain), with its full response."""

    kind: Literal["model_call"] = "model_call"
    agent_name: str
    iteration: int = Field(ge=1)
    request_model: str
    response_model: str | None = None
    input_tokens: int = 0
    """Including cache reads and writes (OTel GenAI)."""
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    finish_reasons: list[str] = []
    latency_ms: float = 0.0
    cost_usd: float = 0.0
    price_known: bool = True
    fallback_used: bool = False
    error_type: str | None = None
    error_kind: str | None = None
    response: dict[str, Any] | None = None
    """``{"id", "model", "content", "stop_reason", "usage"}``; what replay serves back."""


class ToolCallEffect(_Effect):
    kind: Literal["tool_call"] = "tool_call"
    agent_name: str
    tool_call_id: str
    tool_name: str
    envelope: Literal["ok", "hint", "err"]
    hint_kind: str | None = None
    err_kind: str | None = None
    duration_ms: float = 0.0
    executed: bool = True
    """False when the loop guard refused the call or it was never started."""
    arguments: dict[str, Any] = {}
    result: dict[str, Any] = {}
    """``{"envelope": <envelope_to_dict>, "text": <what the model saw>}``."""


Effect = Annotated[PersistMessage | TelemetryEffect | DisplayChunk | ModelCallEffect
                   | ToolCallEffect, Field(discriminator="kind")]
EFFECT_TYPES = (PersistMessage, TelemetryEffect, DisplayChunk, ModelCallEffect, ToolCallEffect)


class Keys:
    """Deterministic idempotency keys of one turn attempt: ``<turn>/a<attempt>/<kind><n>``."""

    def __init__(self, turn_id: str, attempt: int = 1) -> None:
        if "|" in turn_id:
            raise ValueError(f"turn id {turn_id!r} must not contain '|'")
        self.prefix = f"{turn_id}/a{attempt}"
        self._counts: dict[str, int] = {}

    def next(self, kind: str) -> str:
        n = self._counts.get(kind, 0) + 1
        self._counts[kind] = n
        return f"{self.prefix}/{kind}{n}"

    def fixed(self, name: str) -> str:
        return f"{self.prefix}/{name}"
