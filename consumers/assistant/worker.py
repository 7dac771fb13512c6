"""The assistant chat on the worker: its sequencer, its transcript index, its two workflows.

``Assistant().register(ctx)`` is all the worker needs. The sequencer of assistant conversations
becomes the writer of their commands (``consumers.frame``); told by that writer of each record
it put on ``voice.assistant`` (``ctx.on_recorded``, decision 0016), the product keeps each
conversation's transcript index (positions of its requests, replies and patterns on the log)
and starts the turn and extraction workflows, whose steps read those records back; and the
workflows are registered:

- ``assistant-turn`` (id = turn id): one step, the assistant agent on the engine;
- ``assistant-extraction`` (id = ``{turn}:extract``): ``provisional`` (no model) then
  ``extract`` (the compaction agent), each recording a pattern through the sequencer.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Any

from consumers.assistant.datasets import KafkaDatasets
from consumers.assistant.images import KafkaImages
from consumers.assistant.library import TYPES, PatternLibrary
from consumers.assistant.patterns import (
    Pattern,
    extracted,
    extraction_prompt,
    extractor_spec,
    provisional,
    rank,
)
from consumers.assistant.sequencer import AssistantSequencer
from consumers.assistant.sqlbox import SqlBox
from consumers.assistant.transcript import EXTRACT_KIND, TURN_KIND, Transcript
from consumers.assistant.turn import OUTCOMES, ConversationSink, run_assistant_turn
from consumers.engine import HistorySummary, TurnInput
from consumers.frame.context import WorkerContext
from consumers.frame.logrefs import LogUnavailable
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef, WorkflowState
from consumers.workflows.runtime import Erased, StepError, failure_words
from schemas.assistant import (
    AppendDisplay,
    AssistantConversationErased,
    AssistantHistorySummarised,
    AssistantPatternRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    DatasetRef,
    DisplayPayload,
    TurnOutcome,
)
from schemas.base import Record
from schemas.workflow import WorkflowStarted
from streams.assistant_settings import assistant_settings
from streams.envelope import Envelope
from streams.free_text import seal_text
from streams.sealing import KeyErased, Sealer
from streams.topics import ASSISTANT, COMMANDS, WORKFLOWS

log = logging.getLogger(__name__)

SOURCE = "/voice/assistant"
LEARNED_FRESH_S = 2.0
"""How long a turn waits for the pattern library to have read the log up to now."""
MAX_VETTING_ROUNDS = 5
"""Rankings tried while chosen patterns turn out erased; then no shared patterns at all."""


def _conversation(inp: dict[str, Any]) -> str:
    """The assistant conversation a workflow's failures are sealed under."""
    return str(inp["conversation"])


class Assistant:
    """Sequencer, transcript keeper and workflows of the assistant chat, on one worker."""

    name = "assistant"

    def register(self, ctx: WorkerContext) -> None:
        """Add the sequencer, the tables, the workflows and the log's hook (once)."""
        self.ctx = ctx
        self.settings = assistant_settings(ctx.settings)
        self.out = ctx.publisher
        self.crash = ctx.crash
        self.agents = ctx.agents
        ctx.aggregate(AssistantSequencer(ctx.settings.assistant_turn_deadline_s))
        self.transcripts = ctx.table("assistant_index")
        self.reader = ctx.log_reader
        self.box = SqlBox(self.settings.assistant_sql_timeout_s)
        self.datasets = KafkaDatasets(self.settings, ctx.sealer,
                                      self.settings.assistant_dataset_cache_bytes)
        self.images = KafkaImages(self.settings, ctx.sealer,
                                  self.settings.assistant_dataset_cache_bytes // 4)
        ctx.workflow(WorkflowDef(TURN_KIND, (StepDef("reply", self.reply_step),),
                                 on_end=self.turn_over, sealed_by=_conversation,
                                 outcome_recorded=False),
                     WorkflowDef(EXTRACT_KIND, (StepDef("provisional", self.provisional_step),
                                                StepDef("extract", self.extract_step)),
                                 sealed_by=_conversation))
        ctx.on_recorded(ASSISTANT, self._on_log_record)
        self.library = PatternLibrary(ctx.sealer, self.settings.assistant_tenant_patterns_kept)
        self.learned = ctx.follow(ASSISTANT, self.library.apply, "patterns", types=TYPES)
        ctx.on_shutdown(self.box.close)

    @property
    def sealer(self) -> Sealer:
        return self.ctx.sealer

    def _submitter(self, conversation: str, correlation: str, tenant: str | None) -> Any:
        async def submit(record: Record, command_id: str) -> None:
            await self.out.send(COMMANDS, Envelope(
                record=record, key=conversation, source=SOURCE, subject=conversation,
                tenant=tenant, correlation=correlation, id=command_id))
            if isinstance(record, AssistantReplyRecorded):
                self.crash.hit("after_reply", correlation)
        return submit

    # --- the log: transcripts, patterns, workflow starts --------------------------------------

    async def _on_log_record(self, env: Envelope, partition: int, offset: int) -> None:
        """Told by the sequencer's writer of each record it put at ``partition``/``offset``
        (``ctx.on_recorded``, decision 0016): index it, start what it starts (a turn, an
        extraction), under ids a second telling gives again."""
        if isinstance(env.record, AssistantConversationErased):
            self.transcripts.pop(env.key, None)  # positions of content no one can open
            return
        transcript = Transcript.from_dict(self.transcripts.get(env.key))
        starts = transcript.apply(env, partition, offset,
                                  self.settings.assistant_history_bytes,
                                  self.settings.assistant_patterns_kept)
        if starts is None:
            return  # told again (a crash before the state write): indexed and started
        for kind, workflow, inp in starts:
            started = WorkflowStarted(workflow=workflow, kind=kind, input=inp)
            await self.out.send(WORKFLOWS, Envelope(
                record=started, key=workflow, source=SOURCE, subject=workflow, seq=1,
                tenant=env.tenant, correlation=env.correlation, causation=env.id,
                id=f"{workflow}:1"))
        self.transcripts[env.key] = transcript.to_dict()

    # --- assistant-turn -------------------------------------------------------------------

    async def reply_step(self, ctx: StepContext) -> dict[str, Any]:
        """Open the request, summary and transcript, run the assistant, record the summary
        it made (if any) and how the turn ended."""
        inp = ctx.input
        conversation, turn, tenant = inp["conversation"], inp["turn"], inp.get("tenant")
        records = await self._read(inp, *Transcript.turn_records(inp.get("log") or {}))
        try:
            request, history, seqs, patterns = Transcript.open_turn(
                self.sealer, conversation, inp["log"], records)
        except KeyErased:
            raise Erased("conversation", conversation) from None
        if not (inp.get("options") or {}).get("data_isolation"):
            patterns += await self._learned(tenant, conversation, patterns,
                                            str(request.get("message", "")))
        submit = self._submitter(conversation, turn, tenant)
        sink = ConversationSink(
            self.agents.sink(turn, sealed=True, tenant=tenant, source=SOURCE),
            submit, self.sealer, conversation, turn)
        result, suggested = await run_assistant_turn(
            self.settings, conversation=conversation, turn=turn, owner=inp["owner"],
            attempt=ctx.attempt, request=request, options=inp.get("options") or {},
            refs=[DatasetRef.model_validate(r) for r in inp.get("datasets") or []],
            history=history, patterns=patterns, source=self.datasets, box=self.box,
            client=self.agents.client_for(tenant, turn), sink=sink, cancel=ctx.cancel,
            tenant=tenant, images=self.images)
        if result.summarised and result.summary is not None:
            await self._record_summary(submit, conversation, turn, result.summary, seqs)
        outcome = OUTCOMES[result.end_reason]
        reason = "; ".join(f"{e.kind}: {e.message}" for e in result.errors) or None
        code = "; ".join(dict.fromkeys(e.kind for e in result.errors)) or None
        await submit(self._ended(conversation, turn, outcome, result.end_reason, code, reason),
                     f"{turn}:end")
        return {"state": outcome, "end_reason": result.end_reason,
                "suggested": [p.pattern_id for p in suggested]}

    async def _record_summary(self, submit: Any, conversation: str, turn: str,
                              summary: HistorySummary, seqs: list[int]) -> None:
        """Record the engine's new summary through the seq of the last message it covers,
        before the turn ends (so the next turn, which starts only after, reads it). The
        command id is the turn's: a re-run records it once."""
        if not 0 < summary.summary_through <= len(seqs):
            return
        summary_id = f"{turn}:summary"
        await submit(AssistantHistorySummarised(
            conversation=conversation, turn=turn, summary_id=summary_id,
            through_seq=seqs[summary.summary_through - 1],
            text=self.sealer.seal(conversation, summary_id, summary.text)), summary_id)

    async def _learned(self, tenant: str | None, conversation: str, own: list[Pattern],
                       message: str) -> list[Pattern]:
        """The patterns the tenant learned in its other conversations, as of now (the library
        has read the log up to where it ends now, or ``LEARNED_FRESH_S`` passed), less those of
        conversations erased since — checked for the ones that would be chosen."""
        await asyncio.to_thread(self.learned.fresh, LEARNED_FRESH_S)
        for _ in range(MAX_VETTING_ROUNDS):
            shared = self.library.shared(tenant, conversation)
            chosen = rank([*own, *shared], message, conversation=conversation)
            gone = [s for s in chosen if s.elsewhere
                    and not self.library.still_open(tenant, s.pattern)]
            if not gone:
                return shared
        return []

    async def turn_over(self, state: WorkflowState) -> None:
        """A turn whose step failed after its attempts: tell its stream, record it Failed."""
        if state.status != "failed":
            return
        inp = state.input
        conversation, turn = inp["conversation"], inp["turn"]
        submit = self._submitter(conversation, turn, inp.get("tenant"))
        reason = (f"the turn failed after {state.attempt} attempts: "
                  f"{failure_words(self.sealer, state)}")
        try:
            for n, (type_, channel, data) in enumerate(
                    (("error", "system", {"text": reason, "recoverable": False}),
                     ("done", "system", {"cost": 0.0, "end_reason": "error"})), start=1):
                key = f"{turn}/failed/d{n}"
                await submit(AppendDisplay(conversation=conversation, turn=turn, event=(
                    DisplayPayload(event_id=key, type=type_, channel=channel, message_id=turn,
                                   verb="show" if type_ == "error" else "finish", priority=3,
                                   ts=0.0, data=self.sealer.seal_json(conversation,
                                                                      f"{key}/data", data)))),
                             key)
        except KeyErased:
            pass
        await submit(self._ended(conversation, turn, "Failed", "error", "step_failed", reason),
                     f"{turn}:end")

    def _ended(self, conversation: str, turn: str, state: TurnOutcome, end_reason: str,
               code: str | None, words: str | None) -> AssistantTurnEnded:
        """The turn's end: its reason's code plain, its words (errors may quote the model or
        the user) sealed with the conversation's key — none once it was erased."""
        sealed = None
        if words:
            with suppress(KeyErased):
                sealed = seal_text(self.sealer, conversation, f"{turn}:reason", words)
        return AssistantTurnEnded(conversation=conversation, turn=turn, state=state,
                                  end_reason=end_reason, reason_code=code, sealed_reason=sealed)

    # --- assistant-extraction --------------------------------------------------------------

    async def _read(self, inp: dict[str, Any], *names: str) -> dict[str, list[Envelope]]:
        """The records the workflow's input refers to (``inp["log"]``), read from the log."""
        if "log" not in inp:
            raise StepError(f"workflow of turn {inp.get('turn')!r} was started by an older "
                            "worker (its input is a copy, no longer read); send the message "
                            "again", retryable=False)
        try:
            return await Transcript.read(self.reader, inp["conversation"], inp["log"], *names)
        except LogUnavailable as exc:
            raise StepError(f"the records of turn {inp.get('turn')!r} cannot be read: {exc}",
                            retryable=exc.retryable) from None

    async def _exchange(self, inp: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        records = await self._read(inp, "user", "assistant")
        try:
            return Transcript.open_exchange(self.sealer, inp["conversation"],
                                            records["user"][0], records["assistant"][0])
        except KeyErased:
            raise Erased("conversation", inp["conversation"]) from None

    async def _record_pattern(self, inp: dict[str, Any], stage: str,
                              pattern: dict[str, Any]) -> str:
        conversation, turn = inp["conversation"], inp["turn"]
        pattern_id = f"{turn}:pattern-{stage}"
        await self._submitter(conversation, turn, inp.get("tenant"))(
            AssistantPatternRecorded(conversation=conversation, turn=turn,
                                     pattern_id=pattern_id, stage=stage,  # type: ignore[arg-type]
                                     text=self.sealer.seal_json(conversation, pattern_id,
                                                                pattern)),
            pattern_id)
        return pattern_id

    async def provisional_step(self, ctx: StepContext) -> dict[str, Any]:
        """Record what was asked and which tools ran, at once and without a model."""
        request, chain = await self._exchange(ctx.input)
        return {"pattern": await self._record_pattern(ctx.input, "provisional",
                                                      provisional(request, chain))}

    async def extract_step(self, ctx: StepContext) -> dict[str, Any]:
        """Ask the compaction agent for the exchange's pattern and record it."""
        inp = ctx.input
        request, chain = await self._exchange(inp)
        sink = self.agents.sink(ctx.workflow, sealed=True, tenant=inp.get("tenant"),
                                source=SOURCE)
        result = await self.agents.run(extractor_spec(self.settings), TurnInput(
            turn_id=ctx.workflow, user_message=extraction_prompt(request, chain),
            conversation_id=inp["conversation"], attempt=ctx.attempt, skip_history=True), sink,
            tenant=inp.get("tenant"))
        if result.end_reason == "error" or not result.final_text.strip():
            raise StepError(f"the extractor gave no pattern ({result.end_reason}: "
                            + "; ".join(e.message for e in result.errors) + ")",
                            retryable=result.retryable)
        return {"pattern": await self._record_pattern(inp, "extracted",
                                                      extracted(result.final_text, request))}


__all__ = ["EXTRACT_KIND", "TURN_KIND", "Assistant"]
