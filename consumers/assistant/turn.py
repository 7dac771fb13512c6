"""Running one assistant turn on the engine, and where its effects go.

``ConversationSink`` is the turn's ``EffectSink``: every effect becomes its ``voice.agent`` /
``voice.telemetry`` record as for any agent (``KafkaEffectSink``), and, because an assistant
conversation's display events need one dense per-conversation sequence, each display event
(and the persisted reply) is also sent to the conversation's sequencer as a command whose id is
the effect's idempotency key. The sequencer, the log's single writer, gives it its
``display_seq``. Both sends finish before ``emit`` returns, so order holds and nothing is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from consumers.assistant.agent import assistant_spec, state_text, user_message
from consumers.assistant.datasets import DatasetSource
from consumers.assistant.images import ImageSource, MemoryImages, resolve_images
from consumers.assistant.patterns import Pattern, Suggestion, rank
from consumers.assistant.sqlbox import SqlBox
from consumers.assistant.tools import DatasetTools, TurnDatasets
from consumers.assistant.toolset import turn_tools
from consumers.engine import (
    AgentSpec,
    CancelToken,
    DisplayChunk,
    DisplayEvent,
    Effect,
    EffectSink,
    PersistMessage,
    TurnInput,
    TurnResult,
    run_turn,
)
from schemas.assistant import (
    AppendDisplay,
    AssistantReplyRecorded,
    DatasetRef,
    DisplayPayload,
    TurnOutcome,
)
from schemas.base import Record
from streams.assistant_settings import AssistantSettings
from streams.sealing import Sealer

Submit = Callable[[Record, str], Awaitable[None]]
"""(command, command id) → produced to ``voice.commands`` (key = the conversation)."""

OUTCOMES: dict[str, TurnOutcome] = {"end_turn": "Replied", "max_turns": "Replied",
                                     "context_limit": "Replied", "cancelled": "Cancelled",
                                     "error": "Failed"}


def display_payload(sealer: Sealer, conversation: str, event: DisplayEvent) -> DisplayPayload:
    """A display event with its data sealed under the conversation's key."""
    return DisplayPayload(
        event_id=event.id, type=event.type, channel=event.channel, scope=event.scope,
        message_id=event.message_id, verb=event.verb, priority=event.priority,
        persistent=event.persistent, ts=event.ts,
        data=sealer.seal_json(conversation, f"{event.id}/data", event.data),
        group_id=event.group_id, parent_id=event.parent_id, display_id=event.display_id,
        metadata=event.metadata)


class ConversationSink:
    """Effects to ``voice.agent`` (through ``inner``) and display/reply to the sequencer."""

    def __init__(self, inner: EffectSink, submit: Submit, sealer: Sealer, conversation: str,
                 turn: str) -> None:
        self.inner, self.submit, self.sealer = inner, submit, sealer
        self.conversation, self.turn = conversation, turn

    async def emit(self, effect: Effect) -> None:
        sends = [self.inner.emit(effect)]
        command = self._command(effect)
        if command is not None:
            sends.append(self.submit(command, effect.key))
        await asyncio.gather(*sends)

    async def drain(self) -> None:
        await self.inner.drain()

    def _command(self, effect: Effect) -> Record | None:
        conv, turn = self.conversation, self.turn
        if isinstance(effect, DisplayChunk):
            return AppendDisplay(conversation=conv, turn=turn,
                                 event=display_payload(self.sealer, conv, effect.event))
        if isinstance(effect, PersistMessage):
            reply = effect.key
            return AssistantReplyRecorded(
                conversation=conv, turn=turn, reply_id=reply,
                chain=self.sealer.seal_json(conv, f"{reply}/chain", {
                    "text": effect.content, "structured_content": effect.structured_content}),
                cards=self.sealer.seal_json(conv, f"{reply}/cards", {"cards": effect.cards}),
                cost_usd=effect.cost_usd, end_reason=effect.end_reason)
        return None


async def prepare_assistant_turn(settings: AssistantSettings, *, conversation: str, turn: str,
                                 owner: str, attempt: int, request: dict[str, Any],
                                 options: dict[str, Any], refs: list[DatasetRef],
                                 history: list[dict[str, Any]], patterns: list[Pattern],
                                 source: DatasetSource, box: SqlBox, tenant: str | None = None,
                                 images: ImageSource | None = None
                                 ) -> tuple[AgentSpec, TurnInput, list[Suggestion]]:
    """The spec, input and suggested patterns of one assistant turn over opened content: what
    ``run_assistant_turn`` runs, and what ``voice replay assistant --rerun`` runs again with
    the recorded model and tool results (one place builds them, so a re-run asks the same)."""
    suggestions = ([] if options.get("data_isolation")
                   else rank(patterns, str(request.get("message", "")),
                             conversation=conversation))
    datasets = TurnDatasets(refs, source, owner, options.get("namespace_id"))
    tools = turn_tools(DatasetTools(datasets, box, settings.assistant_query_rows,
                                    settings.assistant_map_features).tools(),
                       agentic=bool(options.get("agentic_mode")))
    images = images if images is not None else MemoryImages()
    message, history = await asyncio.to_thread(
        lambda: (resolve_images(user_message(request), images, owner),
                 resolve_images(history, images, owner)))
    turn_input = TurnInput(
        turn_id=turn, user_message=message, history=history,
        conversation_id=conversation, principal=owner, dataset_ids=datasets.ids,
        state_provider=lambda view: state_text(request, options, suggestions, view),
        model_override=options.get("model_override"), attempt=attempt,
        skip_history=bool(options.get("skip_history")),
        inference_params=dict(options.get("inference_params") or {}), tenant=tenant,
        capabilities=frozenset(options.get("capabilities") or ()))
    return assistant_spec(settings, tools), turn_input, suggestions


async def run_assistant_turn(settings: AssistantSettings, *, conversation: str, turn: str,
                             owner: str, attempt: int, request: dict[str, Any],
                             options: dict[str, Any], refs: list[DatasetRef],
                             history: list[dict[str, Any]], patterns: list[Pattern],
                             source: DatasetSource, box: SqlBox, client: Any,
                             sink: EffectSink, cancel: CancelToken | None = None,
                             tenant: str | None = None, images: ImageSource | None = None
                             ) -> tuple[TurnResult, list[Suggestion]]:
    """One turn of the assistant over opened content; returns the result and the patterns it
    was given as suggested context. ``patterns`` are its conversation's and those its tenant
    learned elsewhere (``Pattern.conversation`` says which). The tools see ``tenant`` and the
    capabilities the edge recorded in ``options`` (none when it recorded none). Images the
    request and its history name are read from ``images`` and shown as image blocks."""
    spec, turn_input, suggestions = await prepare_assistant_turn(
        settings, conversation=conversation, turn=turn, owner=owner, attempt=attempt,
        request=request, options=options, refs=refs, history=history, patterns=patterns,
        source=source, box=box, tenant=tenant, images=images)
    result = await run_turn(spec, turn_input, client, sink, cancel)
    return result, suggestions
