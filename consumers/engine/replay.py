"""Re-running a recorded turn: model responses and tool results served from its effects.

``ReplayClient`` is a ``ModelPort`` that answers each model call with the next recorded
``ModelCallEffect`` (a recorded failure is raised again, so the fallback chain replays too).
``recorded_tools`` swaps every tool's ``run`` for one that serves the recorded envelope of the
same ``tool_use_id``. Run the turn again with both and compare the effects with
``compare_effects``: what differs (ignoring timings) is the divergence to report. Nothing here
calls a model or a tool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from consumers.engine.cancel import CancelToken
from consumers.engine.effects import RecordingSink
from consumers.engine.envelopes import Err, envelope_from_dict
from consumers.engine.model import (
    ModelError,
    ModelRequest,
    ModelResponse,
    StreamCallbacks,
    error_from_type,
)
from consumers.engine.tools import Tool, ToolContext, ToolRegistry, ToolRun
from consumers.engine.types import (
    AgentSpec,
    DisplayChunk,
    Effect,
    ModelCallEffect,
    ToolCallEffect,
    TurnInput,
    TurnResult,
)

IGNORED = frozenset({"latency_ms", "duration_ms", "ts",
                     # derived from other fields, and not carried by the records:
                     "price_known", "error_kind", "executed"})


class ReplayClient:
    """Serves recorded model calls in order, instead of calling a model."""

    def __init__(self, effects: Iterable[Effect]) -> None:
        self._calls = [e for e in effects if isinstance(e, ModelCallEffect)]
        self._next = 0
        self.divergences: list[str] = []
        self.requests: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        return len(self._calls) - self._next

    async def stream(self, request: ModelRequest, callbacks: StreamCallbacks) -> ModelResponse:
        self.requests.append(request)
        if self._next >= len(self._calls):
            self.divergences.append(f"model call {self._next + 1} ({request.model!r}) was "
                                    "never recorded")
            raise ModelError("REPLAY_EXHAUSTED", "no recorded model call left",
                             error_type="ReplayExhausted")
        rec = self._calls[self._next]
        self._next += 1
        if rec.request_model != request.model:
            self.divergences.append(f"model call {self._next}: asked {request.model!r}, "
                                    f"recorded {rec.request_model!r}")
        if rec.error_type is not None:
            raise error_from_type(rec.error_type, request.model, "replayed failure")
        if rec.response is None:
            raise ModelError("REPLAY_MISSING", f"model call {self._next} has no recorded "
                             "response", error_type="ReplayMissing")
        response = ModelResponse.from_dict(rec.response)
        for block in response.content:  # the same callbacks a live stream would make
            if block.get("type") == "text" and callbacks.on_text is not None:
                await callbacks.on_text(block.get("text", ""))
            elif block.get("type") == "tool_use" and callbacks.on_tool_start is not None:
                await callbacks.on_tool_start(str(block.get("name")))
        return response


def recorded_tools(registry: ToolRegistry, effects: Iterable[Effect],
                   divergences: list[str] | None = None) -> ToolRegistry:
    """The registry's tools (same names and schemas) answering with recorded envelopes."""
    by_id = {e.tool_call_id: e for e in effects
             if isinstance(e, ToolCallEffect) and e.executed}
    notes = divergences if divergences is not None else []

    def run_for(tool: Tool) -> ToolRun:
        async def serve(args: Any, ctx: ToolContext) -> Any:
            rec = by_id.get(ctx.tool_use_id)
            if rec is None or rec.tool_name != tool.name:
                notes.append(f"tool call {ctx.tool_use_id} ({tool.name}) was never recorded")
                return Err(f"no recorded result for {tool.name!r}", "replay_missing")
            return envelope_from_dict(rec.result["envelope"])

        return serve

    return registry.replaced(run_for)


def comparable(effect: Effect) -> dict[str, Any]:
    """An effect as data without what legitimately differs between runs (timings) or is not
    carried by its record."""
    return _strip(effect.model_dump(mode="json"))


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in IGNORED}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _comparables(effects: Sequence[Effect]) -> list[tuple[str, dict[str, Any]]]:
    """(key, comparable) per effect, a run of text deltas as one: the engine slices streamed
    text by time (``consumers.engine.display``), so a re-run has the same text in other
    slices, and display events' keys and ids count those slices."""
    out: list[tuple[str, dict[str, Any]]] = []
    for e in effects:
        if not isinstance(e, DisplayChunk):
            out.append((e.key, comparable(e)))
            continue
        c = comparable(e)
        c.pop("key", None)
        c["event"].pop("id", None)
        if e.event.type == "text_delta" and out and out[-1][1].get("text_run") is not None:
            out[-1][1]["text_run"] += e.event.data.get("text", "")
        elif e.event.type == "text_delta":
            out.append((e.key, {"text_run": e.event.data.get("text", ""),
                                "turn_id": e.turn_id, "conversation_id": e.conversation_id}))
        else:
            out.append((e.key, c))
    return out


def _kept(effects: Sequence[Effect]) -> list[Effect]:
    # Progress events are transient and come from the tool run itself, which replay skips.
    return [e for e in effects
            if not (isinstance(e, DisplayChunk) and e.event.type == "progress")]


def compare_effects(recorded: Sequence[Effect], replayed: Sequence[Effect]) -> list[str]:
    """Human-readable differences between two effect streams (empty when they match).

    Only the kinds of effect present in ``recorded`` are compared, so a turn read back from
    Kafka (model and tool calls only) compares against the same kinds of a re-run.
    """
    kinds = {type(e) for e in recorded}
    a, b = _kept(recorded), [e for e in _kept(replayed) if type(e) in kinds]
    ca, cb = _comparables(a), _comparables(b)
    out = []
    for i, ((x, cx), (_, cy)) in enumerate(zip(ca, cb, strict=False)):
        if cx != cy:
            fields = sorted(k for k in cx.keys() | cy.keys() if cx.get(k) != cy.get(k))
            out.append(f"effect {i} ({x}): {', '.join(fields)} differ")
    a, b = ca, cb
    if len(a) != len(b):
        out.append(f"recorded {len(a)} effects, replay produced {len(b)}")
    return out


async def rerun(spec: AgentSpec, turn_input: TurnInput, recorded: Sequence[Effect],
                ) -> tuple[TurnResult, RecordingSink, list[str]]:
    """Run the turn again from its recorded effects; returns (result, effects, divergences)."""
    from consumers.engine.loop import run_turn  # the loop imports nothing from here

    client = ReplayClient(recorded)
    notes: list[str] = []
    replay_spec = dataclasses.replace(spec, tools=recorded_tools(spec.tools, recorded, notes))
    sink = RecordingSink()
    result = await run_turn(replay_spec, turn_input, client, sink, CancelToken())
    divergences = [*client.divergences, *notes, *compare_effects(recorded, sink.effects)]
    if client.remaining:
        divergences.append(f"{client.remaining} recorded model call(s) were not replayed")
    return result, sink, divergences
