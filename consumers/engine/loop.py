"""The agent turn loop: one engine for every agent.

``run_turn`` is a library call with no Kafka in it: the model goes through a ``ModelPort`` (an
``AsyncAnthropic`` is adapted), every side effect through ``EffectSink.emit``. Per iteration:
cancel check → ``[CURRENT_STATE]`` rebuilt → context guard (compact at 80 %, stop at 95 %) →
streamed model call along the fallback chain → either the end of the turn or each tool_use
dispatched serially. The turn always ends with the display told (``done``) and, unless it
failed, a ``PersistMessage`` carrying the full tool-call chain, JSON-sanitised.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Any, TypeVar

from consumers.engine.cancel import CancelToken
from consumers.engine.dispatch import DispatchContext, TurnState, dispatch_tool_use
from consumers.engine.display import DisplayFactory
from consumers.engine.effects import EffectSink
from consumers.engine.guard import LoopGuard
from consumers.engine.history import (
    COMPACT_TARGET,
    Calibration,
    ContextGuard,
    compact_tool_results,
    estimate_tokens,
    prepare_history,
)
from consumers.engine.labels import label_message
from consumers.engine.model import (
    ModelCaller,
    ModelError,
    StreamCallbacks,
    as_model_port,
    static_system_prompt,
    system_blocks,
    with_current_state,
)
from consumers.engine.sanitize import sanitize_json
from consumers.engine.spans import agent_span
from consumers.engine.types import (
    AgentSpec,
    EndReason,
    HistorySummary,
    Keys,
    PersistMessage,
    StateView,
    TelemetryEffect,
    TurnError,
    TurnInput,
    TurnResult,
)
from consumers.engine.worklog import WorkLog, WorkLogSink

T = TypeVar("T")


async def run_turn(spec: AgentSpec, turn_input: TurnInput, client: Any, sink: EffectSink,
                   cancel: CancelToken | None = None) -> TurnResult:
    """Run one agent turn to its end; effects go to ``sink``, the outcome is returned once
    every effect is durable."""
    with agent_span(spec.name, turn_input.turn_id, turn_input.conversation_id):
        try:
            return await _Turn(spec, turn_input, client, sink, cancel or CancelToken()).run()
        finally:
            drain = getattr(sink, "drain", None)  # a sink without it is durable per emit
            if drain is not None:
                await drain()


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or []
                     if isinstance(b, dict) and b.get("type") == "text")


class _Turn:
    def __init__(self, spec: AgentSpec, ti: TurnInput, client: Any, sink: EffectSink,
                 cancel: CancelToken) -> None:
        self.work = WorkLog()
        sink = WorkLogSink(sink, self.work)  # every effect below passes the work log
        self.spec, self.ti, self.sink, self.cancel = spec, ti, sink, cancel
        self.keys = Keys(ti.turn_id, ti.attempt)
        conv = ti.conversation_id
        self.display = DisplayFactory(sink, self.keys.prefix, ti.turn_id, conv)
        self.caller = ModelCaller(as_model_port(client), sink, self.keys, ti.turn_id, conv)
        self.state = TurnState(LoopGuard(spec.loop_guard_threshold,
                                         spec.failed_approach_threshold))
        self.dc = DispatchContext(spec.name, ti.turn_id, conv, ti.principal, ti.dataset_ids,
                                  spec.tools, sink, self.display, self.keys, cancel,
                                  ti.tenant, ti.capabilities)
        primary = ti.model_override or spec.model
        self.chain = [primary, *(m for m in spec.fallback_models if m != primary)]
        self.messages: list[dict[str, Any]] = []
        self.appended: list[dict[str, Any]] = []
        self.errors: list[TurnError] = []
        self.warnings: list[str] = []
        self.final_text = ""
        self.summary: HistorySummary | None = None
        self.summarised = False
        self.iterations = 0
        self._attempt_mark = 0

    async def _telemetry(self, name: str, attributes: dict[str, Any]) -> None:
        await self.sink.emit(TelemetryEffect(key=self.keys.next("x"), turn_id=self.ti.turn_id,
                                             conversation_id=self.ti.conversation_id,
                                             name=name, attributes=attributes))

    async def _warn(self, text: str, **extra: Any) -> None:
        self.warnings.append(text)
        await self.display.warning(text, **extra)

    async def run(self) -> TurnResult:
        ti, spec = self.ti, self.spec
        if ti.model_override is not None and not spec.allows(ti.model_override):
            # Defence in depth: the edge refuses these; a forged command must not reach a model.
            self.errors.append(TurnError("MODEL_NOT_FOUND", f"model_override "
                                         f"{ti.model_override!r} is not one of this "
                                         f"deployment's models (VOICE_MODELS)"))
            return await self._finish("error")
        history = [] if ti.skip_history else list(ti.history)
        has_previous = any(m.get("role") == "assistant" for m in history)
        await self._telemetry("user_message_labels",
                              {**label_message(_text_of(ti.user_message), has_previous),
                               "agent_name": spec.name})
        await self.display.busy("Thinking…")
        try:
            prepared = await prepare_history(spec, history, ti.summary, self.caller)
            self.messages, self.summary = prepared.messages, prepared.summary
            self.summarised = prepared.summarised
            if prepared.summarised and prepared.summary is not None:
                await self._telemetry("history_summarised", {
                    "summary_through": prepared.summary.summary_through,
                    "history_messages": len(history)})
        except ModelError as exc:  # no summary is not fatal; the context guard still holds
            self.messages = history
            await self._warn(f"history could not be summarised ({exc.kind}); using it whole")
        self.messages.append({"role": "user", "content": ti.user_message})
        end_reason = await self._loop()
        return await self._finish(end_reason)

    async def _state_text(self, iteration: int) -> str:
        spec, ti, st = self.spec, self.ti, self.state
        lines = [f"step: {iteration} of at most {spec.max_agentic_turns}"]
        if ti.dataset_ids:
            lines.append("datasets: " + ", ".join(ti.dataset_ids))
        if st.tools_called:
            lines.append("tools called this turn: " + ", ".join(st.tools_called))
        if st.plan:
            lines.append("plan:\n" + "\n".join(f"- [{'x' if s.done else ' '}] {s.title}"
                                               for s in st.plan))
        if ti.state_provider is not None:
            view = StateView(iteration, ti.turn_id, ti.conversation_id, ti.dataset_ids,
                             tuple(st.tools_called), tuple((s.title, s.done) for s in st.plan))
            if inspect.iscoroutinefunction(ti.state_provider):
                extra = await ti.state_provider(view)
            else:  # may read stores: off the event loop
                extra = await asyncio.to_thread(ti.state_provider, view)
                if inspect.isawaitable(extra):
                    extra = await extra
            if extra:
                lines.append(str(extra))
        return "\n".join(lines)

    async def _loop(self) -> EndReason:
        spec = self.spec
        system = system_blocks(static_system_prompt(spec))
        tools = spec.tools.api_tools()
        fixed = estimate_tokens(system) + estimate_tokens(tools)
        guard = ContextGuard(spec.context_window, spec.max_output_tokens)
        calibration = Calibration()
        for iteration in range(1, spec.max_agentic_turns + 1):
            if self.cancel.cancelled:
                return "cancelled"
            self.iterations = iteration
            state_text = await self._state_text(iteration)
            request = with_current_state(self.messages, state_text)
            raw = fixed + estimate_tokens(request)
            level = guard.assess(calibration.apply(raw))
            if level != "ok":
                extra = fixed + estimate_tokens(state_text) + 16

                def estimate(msgs: list[dict[str, Any]], extra: int = extra) -> int:
                    return calibration.apply(extra + estimate_tokens(msgs))

                before = calibration.apply(raw)
                compacted, n = compact_tool_results(self.messages, int(COMPACT_TARGET
                                                                       * guard.limit), estimate)
                if n:
                    self.messages = compacted
                    request = with_current_state(self.messages, state_text)
                    raw = fixed + estimate_tokens(request)
                    await self._telemetry("context_compacted", {
                        "tool_results": n, "tokens_before": before,
                        "tokens_after": calibration.apply(raw), "limit": guard.limit})
                if guard.assess(calibration.apply(raw)) == "stop":
                    await self._warn(f"the conversation is too long for the model's context "
                                     f"(~{calibration.apply(raw)} of {guard.limit} tokens); "
                                     "stopping here")
                    return "context_limit"
            self._attempt_mark = self.display.text_emitted
            try:
                response = await self._unless_cancelled(self.caller.call(
                    agent_name=spec.name, iteration=iteration, chain=self.chain, system=system,
                    messages=request, tools=tools, max_tokens=spec.max_output_tokens,
                    sampling=self.ti.inference_params,
                    callbacks=StreamCallbacks(self.display.text, self._on_tool_start),
                    on_fallback=self._on_fallback))
            except ModelError as exc:
                self.errors.append(TurnError(exc.kind, str(exc)))
                return "error"
            if response is None:  # cancelled while the model was streaming
                return "cancelled"
            calibration.observe(raw, response.usage.total_input)
            if response.content:
                assistant = {"role": "assistant", "content": response.content}
                self.messages.append(assistant)
                self.appended.append(assistant)
            uses = response.tool_uses
            if not uses:
                self.final_text = response.text.strip()
                if response.stop_reason == "max_tokens":
                    await self._warn("the reply was cut at the output token limit")
                return "end_turn"
            results = [await dispatch_tool_use(use, iteration, self.state, self.dc)
                       for use in uses]
            tool_message = {"role": "user", "content": results}
            self.messages.append(tool_message)
            self.appended.append(tool_message)
        return "max_turns"

    async def _unless_cancelled(self, call: Awaitable[T]) -> T | None:
        """``call``'s result, or None once the turn is cancelled: a model stream in flight is
        interrupted (its connection closed), not waited out."""
        task = asyncio.ensure_future(call)
        stop = asyncio.ensure_future(self.cancel.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.wait({task})  # raises only if this turn itself is being cancelled
        if not task.cancelled():
            task.exception()  # retrieved: an error after the cancel is not the turn's
        return None

    async def _on_tool_start(self, name: str) -> None:
        await self.display.reasoning(f"Preparing a call to {name}")

    async def _on_fallback(self, model: str, next_model: str, exc: ModelError) -> None:
        dropped = self.display.drop_pending_text()
        partial = self.display.text_emitted > self._attempt_mark
        self._attempt_mark = self.display.text_emitted
        what = "rate limited" if exc.kind == "RATE_LIMITED" else "overloaded"
        extra = {"discard_partial": True} if partial or dropped else {}
        await self._warn(f"model {model} is {what}; trying {next_model}", **extra)

    async def _finish(self, end_reason: EndReason) -> TurnResult:
        spec, display, st = self.spec, self.display, self.state
        await display.flush_text()
        if end_reason == "end_turn":
            if self.final_text:
                await display.text_complete(self.final_text)
            unfinished = [s.title for s in st.plan if not s.done]
            if unfinished:
                await self._warn(f"the plan is unfinished: {len(unfinished)} of {len(st.plan)} "
                                 "steps not done (" + "; ".join(unfinished) + ")")
                await self._telemetry("completion_guardrail", {
                    "guardrail": "unfinished_plan", "unfinished_steps": len(unfinished),
                    "total_steps": len(st.plan)})
        elif end_reason == "max_turns":
            await self._warn(f"stopped after {spec.max_agentic_turns} model calls without a "
                             "final answer")
        elif end_reason == "cancelled":
            await display.status("Cancelled")
        elif end_reason == "error":
            for err in self.errors:
                await display.error(err.message, recoverable=False, kind=err.kind)
        for card in st.deferred.values():
            await display.card(card.card_type, card.card_data, card.display_id)
            st.cards.append({"card_type": card.card_type, "card_data": card.card_data,
                             "display_id": card.display_id})
        chain = list(self.appended)
        if self.final_text and not any(
                m.get("role") == "assistant" and self.final_text in _text_of(m.get("content"))
                for m in chain):
            chain.append({"role": "assistant",
                          "content": [{"type": "text", "text": self.final_text}]})
        structured = sanitize_json(chain)
        cards = sanitize_json(st.cards)
        caller = self.caller
        if end_reason != "error":
            await self.sink.emit(PersistMessage(
                key=self.keys.fixed("persist"), turn_id=self.ti.turn_id,
                conversation_id=self.ti.conversation_id, content=self.final_text,
                structured_content=structured, cards=cards, cost_usd=caller.cost_usd,
                end_reason=end_reason))
        await display.cost(caller.cost_usd, caller.usage.total_input, caller.usage.output_tokens,
                           self.chain[0])
        await self._telemetry("turn_completed", {
            "agent_name": spec.name, "end_reason": end_reason, "iterations": self.iterations,
            "model_calls": caller.calls, "cost_usd": caller.cost_usd,
            "input_tokens": caller.usage.total_input, "output_tokens": caller.usage.output_tokens,
            "tool_calls": len(st.tools_called), "warnings": len(self.warnings)})
        await display.idle()
        await display.done(caller.cost_usd, end_reason=end_reason,
                           max_turns_reached=end_reason == "max_turns", **self.work.done_data())
        return TurnResult(
            final_text=self.final_text, end_reason=end_reason, cost_usd=caller.cost_usd,
            usage=caller.usage, messages_appended=structured, cards=cards,
            errors=tuple(self.errors), warnings=tuple(self.warnings),
            model_calls=caller.calls, summary=self.summary, summarised=self.summarised)
