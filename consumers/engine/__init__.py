"""The agent engine: one turn loop that runs every agent, as a library, and the one owner of
the model client (``AgentRunner``; nothing outside the engine builds a client).

It never imports Kafka into the loop: the model goes through a ``ModelPort`` (``LeanModel``
reads the Messages API's stream over httpx; an ``anthropic.AsyncAnthropic`` is adapted), and
every side effect through ``EffectSink.emit`` (``KafkaEffectSink`` produces records,
``RecordingSink`` keeps them in memory).

Public names: ``AgentRunner``, ``ModelSettings``, ``run_turn``, ``AgentSpec``, ``TurnInput``,
``TurnResult``, ``StateView``,
``HistorySummary``, ``Usage``, ``TurnError``, ``CancelToken``, ``Tool``, ``ToolRegistry``,
``ToolContext``, ``ToolNotAllowed``, ``Ok``, ``Hint``, ``Err``, ``HintSignal``, ``Card``,
``PlanStep``, ``PlanUpdate``, ``plan_tool``, ``PLAN_TOOL``, ``ContractViolation``,
``EffectSink``, ``RecordingSink``,
``KafkaEffectSink``, ``Effect`` and its members (``PersistMessage``, ``TelemetryEffect``,
``DisplayChunk``, ``ModelCallEffect``, ``ToolCallEffect``), ``DisplayEvent``,
``DisplayFactory``, ``ModelError``, ``ModelNotFound``, ``AnthropicModel``, ``LeanModel``,
``ModelPort``,
``ReplayClient``, ``recorded_tools``, ``compare_effects``, ``rerun``,
``effects_from_envelopes``, ``sanitize_json``, ``TokenBudget``, ``TokenQuotaExceeded``.
"""

from consumers.engine.budget import TokenBudget, TokenQuotaExceeded
from consumers.engine.cancel import CancelToken
from consumers.engine.display import DisplayFactory
from consumers.engine.effects import (
    EffectSink,
    KafkaEffectSink,
    RecordingSink,
    effects_from_envelopes,
)
from consumers.engine.envelopes import (
    Card,
    ContractViolation,
    Err,
    Hint,
    HintSignal,
    Ok,
    PlanStep,
    PlanUpdate,
)
from consumers.engine.lean import LeanModel
from consumers.engine.loop import run_turn
from consumers.engine.model import AnthropicModel, ModelError, ModelNotFound, ModelPort
from consumers.engine.plan import PLAN_TOOL, plan_tool
from consumers.engine.replay import ReplayClient, compare_effects, recorded_tools, rerun
from consumers.engine.runner import AgentRunner
from consumers.engine.sanitize import sanitize_json
from consumers.engine.tools import Tool, ToolContext, ToolNotAllowed, ToolRegistry
from consumers.engine.types import (
    AgentSpec,
    DisplayChunk,
    DisplayEvent,
    Effect,
    HistorySummary,
    ModelCallEffect,
    PersistMessage,
    StateView,
    TelemetryEffect,
    ToolCallEffect,
    TurnError,
    TurnInput,
    TurnResult,
    Usage,
)
from streams.model_settings import ModelSettings

__all__ = [
    "PLAN_TOOL", "AgentRunner", "AgentSpec", "AnthropicModel", "LeanModel", "CancelToken", "Card",
    "ContractViolation", "DisplayChunk",
    "DisplayEvent", "DisplayFactory", "Effect", "EffectSink", "Err", "Hint", "HintSignal",
    "HistorySummary", "KafkaEffectSink", "ModelCallEffect", "ModelError", "ModelNotFound",
    "ModelPort", "ModelSettings", "Ok", "PersistMessage", "PlanStep", "PlanUpdate", "RecordingSink",
    "ReplayClient", "StateView", "TelemetryEffect", "TokenBudget", "TokenQuotaExceeded", "Tool",
    "ToolCallEffect", "ToolContext", "ToolNotAllowed", "ToolRegistry", "TurnError", "TurnInput",
    "TurnResult", "Usage",
    "compare_effects", "effects_from_envelopes", "plan_tool", "recorded_tools", "rerun", "run_turn",
    "sanitize_json",
]
