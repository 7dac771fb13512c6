"""Dispatching one ``tool_use`` block: guard, run, envelope, effects, the model's tool_result.

The order of operations at the tool boundary is fixed here (and tested): the loop guard may
refuse the call (not executed); otherwise the tool runs under its timeout and the cancellation
watcher; the envelope's ``contract_envelope`` telemetry is recorded; then the envelope's effects
(cards, plan) are applied; then the ``ToolCallEffect`` with the full result; then the display
sees the result; and only then does the model get its ``tool_result`` block.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span

from consumers.engine.cancel import CancelToken
from consumers.engine.display import DisplayFactory
from consumers.engine.effects import EffectSink
from consumers.engine.envelopes import (
    Card,
    Err,
    Hint,
    Ok,
    PlanStep,
    PlanUpdate,
    ToolEnvelope,
    envelope_to_dict,
    render,
)
from consumers.engine.guard import LoopGuard
from consumers.engine.sanitize import sanitize_json
from consumers.engine.spans import tool_answered, tool_span
from consumers.engine.tools import ProgressPump, ToolContext, ToolRegistry, execute
from consumers.engine.types import Keys, TelemetryEffect, ToolCallEffect

SINGLETON_CARDS = frozenset({"map_display", "cited_answer"})


@dataclass
class TurnState:
    """Mutable working memory of one turn (never shared between turns)."""

    guard: LoopGuard
    plan: tuple[PlanStep, ...] = ()
    tools_called: list[str] = field(default_factory=list)
    deferred: dict[tuple[str, str | None], Card] = field(default_factory=dict)
    cards: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class DispatchContext:
    """Everything dispatch needs from the turn, in one place."""

    agent_name: str
    turn_id: str
    conversation_id: str | None
    principal: Any
    dataset_ids: tuple[str, ...]
    registry: ToolRegistry
    sink: EffectSink
    display: DisplayFactory
    keys: Keys
    cancel: CancelToken
    tenant: str | None = None
    capabilities: frozenset[str] = frozenset()


def merge_cards(old: Card, new: Card) -> Card:
    """A singleton card updated by a later one: lists (e.g. map layers) are concatenated
    without duplicates, other fields take the newer value."""
    data = dict(old.card_data)
    for name, value in new.card_data.items():
        prev = data.get(name)
        if isinstance(prev, list) and isinstance(value, list):
            seen = {json.dumps(v, sort_keys=True, default=str) for v in prev}
            data[name] = prev + [v for v in value
                                 if json.dumps(v, sort_keys=True, default=str) not in seen]
        else:
            data[name] = value
    return Card(new.card_type, data, new.display_id, True)


async def apply_tool_effects(env: Ok, state: TurnState, display: DisplayFactory) -> None:
    """Cards stream now, singleton cards wait for the end of the turn; plans are remembered."""
    for effect in env.effects:
        if isinstance(effect, PlanUpdate):
            state.plan = effect.steps
        elif effect.singleton or effect.card_type in SINGLETON_CARDS:
            slot = (effect.card_type, effect.display_id)
            old = state.deferred.get(slot)
            state.deferred[slot] = effect if old is None else merge_cards(old, effect)
        else:
            await display.card(effect.card_type, effect.card_data, effect.display_id)
            state.cards.append({"card_type": effect.card_type, "card_data": effect.card_data,
                                "display_id": effect.display_id})


async def dispatch_tool_use(use: dict[str, Any], iteration: int, state: TurnState,
                            dc: DispatchContext) -> dict[str, Any]:
    """Run one tool_use block to its tool_result block, emitting every effect on the way,
    inside its ``execute_tool`` span (what the tool and its records do belongs to it)."""
    name, tool_use_id = str(use.get("name")), str(use.get("id"))
    with tool_span(name, tool_use_id) as span:
        return await _dispatch(use, name, tool_use_id, iteration, state, dc, span)


async def _dispatch(use: dict[str, Any], name: str, tool_use_id: str, iteration: int,
                    state: TurnState, dc: DispatchContext, span: Span) -> dict[str, Any]:
    args = use.get("input") if isinstance(use.get("input"), dict) else {}
    await _telemetry(dc, "tool_decision", {"tool": name, "tool_call_id": tool_use_id,
                                           "iteration": iteration})
    executed, duration = False, 0.0
    refusal = state.guard.check(name, args)
    if refusal is not None:
        env: ToolEnvelope = refusal
    elif dc.cancel.cancelled:
        env = Err(f"tool {name!r} not run: the turn was cancelled", "cancelled")
    else:
        await dc.display.tool_call(name, sanitize_json(args), tool_use_id)
        env, duration = await _run(name, args, tool_use_id, dc)
        executed = True
        state.guard.record(name, args, env)
        state.tools_called.append(name)
    text = render(env)
    hint = state.guard.soft_hint(name, args) if executed and not isinstance(env, Ok) else None
    if hint:
        text = f"{text}\n\n{hint}"
    hint_kind = env.hint_kind if isinstance(env, Hint) else None
    err_kind = env.err_kind if isinstance(env, Err) else None
    tool_answered(span, env.kind, err_kind)
    await _telemetry(dc, "contract_envelope", {
        "tool": name, "tool_call_id": tool_use_id, "envelope": env.kind, "hint_kind": hint_kind,
        "err_kind": err_kind, "duration_ms": duration, "executed": executed,
        "soft_hint": bool(hint), "agent_name": dc.agent_name})
    if isinstance(env, Ok):
        await apply_tool_effects(env, state, dc.display)
    await dc.sink.emit(ToolCallEffect(
        key=dc.keys.next("t"), turn_id=dc.turn_id, conversation_id=dc.conversation_id,
        agent_name=dc.agent_name, tool_call_id=tool_use_id, tool_name=name,
        envelope=env.kind, hint_kind=hint_kind, err_kind=err_kind, duration_ms=duration,
        executed=executed, arguments=sanitize_json(args),
        result={"envelope": envelope_to_dict(env), "text": text}))
    await dc.display.tool_result(name, text, duration, tool_use_id, env.kind)
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}
    if isinstance(env, Err):
        block["is_error"] = True
    return block


async def _run(name: str, args: dict[str, Any], tool_use_id: str,
               dc: DispatchContext) -> tuple[ToolEnvelope, float]:
    async def progress(text: str, percent: float | None, current: int | None,
                       total: int | None) -> None:
        await dc.display.progress(text, percent, current, total, group_id=tool_use_id)

    pump = ProgressPump(progress)
    ctx = ToolContext(principal=dc.principal, agent_name=dc.agent_name, turn_id=dc.turn_id,
                      tool_use_id=tool_use_id, conversation_id=dc.conversation_id,
                      dataset_ids=dc.dataset_ids, cancel=dc.cancel, progress_sink=pump.callback,
                      tenant=dc.tenant, capabilities=dc.capabilities)
    try:
        executed = await execute(dc.registry, name, args, ctx, dc.cancel)
    finally:
        await pump.close()
    return executed.envelope, executed.duration_ms


async def _telemetry(dc: DispatchContext, name: str, attributes: dict[str, Any]) -> None:
    await dc.sink.emit(TelemetryEffect(key=dc.keys.next("x"), turn_id=dc.turn_id,
                                       conversation_id=dc.conversation_id, name=name,
                                       attributes=attributes))
