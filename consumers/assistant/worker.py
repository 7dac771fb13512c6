"""The assistant chat inside the worker: its sequencer, its log consumer, its two workflows.

``Assistant(worker, settings).register()`` is all the worker needs. It adds two tables, wires
a second agent on ``voice.commands`` (the sequencer of assistant conversations; Faust hands each
record to every agent of a topic, and the worker's own command agent ignores these types), an
agent on ``voice.assistant`` (keeps each conversation's sealed transcript and patterns, starts
the turn and extraction workflows), and registers the workflows:

- ``assistant-turn`` (id = turn id): one step, the assistant agent on the engine;
- ``assistant-extraction`` (id = ``{turn}:extract``): ``provisional`` (no model) then
  ``extract`` (the compaction agent), each recording a pattern through the sequencer.

Writers follow the sequencer's order: produce the outputs and wait for the broker's acks, then
write the table; a crash in between replays the command to identical records.
"""

from __future__ import annotations

import logging
from typing import Any

from consumers.assistant.datasets import KafkaDatasets
from consumers.assistant.patterns import (
    extracted,
    extraction_prompt,
    extractor_spec,
    provisional,
)
from consumers.assistant.sequencer import AssistantState, sequence
from consumers.assistant.sqlbox import SqlBox
from consumers.assistant.transcript import EXTRACT_KIND, TURN_KIND, Transcript
from consumers.assistant.turn import OUTCOMES, ConversationSink, run_assistant_turn
from consumers.engine import KafkaEffectSink, TurnInput, run_turn
from consumers.model_client import model_client
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef, WorkflowState
from consumers.workflows.runtime import StepError
from schemas.assistant import (
    ASSISTANT_COMMANDS,
    AppendDisplay,
    AssistantPatternRecorded,
    AssistantTurnEnded,
    DatasetRef,
    DisplayPayload,
)
from schemas.base import Record
from schemas.workflow import WorkflowStarted
from streams.assistant_settings import assistant_settings
from streams.envelope import Envelope, encode
from streams.sealing import KeyErased
from streams.settings import VoiceSettings
from streams.topics import ASSISTANT, COMMANDS, WORKFLOWS, TopicSpec, topic_name

log = logging.getLogger(__name__)

SOURCE = "/voice/assistant"


class Assistant:
    """Sequencer, transcript keeper and workflows of the assistant chat, on one worker."""

    def __init__(self, worker: Any, settings: VoiceSettings) -> None:
        self.worker = worker
        self.settings = assistant_settings(settings)
        tables = {"partitions": settings.topic_partitions}
        self.states = worker.app.Table("assistant_conversations", default=None, **tables)
        self.transcripts = worker.app.Table("assistant_transcripts", default=None, **tables)
        self.box = SqlBox(self.settings.assistant_sql_timeout_s)
        self.datasets = KafkaDatasets(self.settings, worker.sealer,
                                      self.settings.assistant_dataset_cache_bytes)
        self.turns = WorkflowDef(TURN_KIND, (StepDef("reply", self.reply_step),),
                                 on_end=self.turn_over)
        self.extraction = WorkflowDef(EXTRACT_KIND, (StepDef("provisional", self.provisional_step),
                                                     StepDef("extract", self.extract_step)))
        self._client: Any = None

    def register(self) -> None:
        """Register the workflows and wire the consumers (call once, before the app runs)."""
        self.worker.runtime.register(self.turns)
        self.worker.runtime.register(self.extraction)
        self.worker.wire(ASSISTANT, self._on_log_record)
        self.worker.wire(COMMANDS, self._on_command, agent_name="assistant_sequencer",
                         dead_letter=False)

        @self.worker.app.on_before_shutdown.connect
        async def _close(app: Any, **kw: Any) -> None:  # noqa: ARG001
            self.box.close()

    # --- plumbing ---------------------------------------------------------------------------

    @property
    def sealer(self) -> Any:
        return self.worker.sealer

    def client(self) -> Any:
        if self._client is None:
            self._client = model_client(self.settings)
        return self._client

    def _send(self, spec: TopicSpec, env: Envelope) -> Any:
        """Produce now; the returned future resolves on the broker's ack."""
        key, value, headers = encode(env)
        return self.worker.producer.produce_raw(topic_name(self.settings, spec), key, value,
                                                headers)

    async def _produce(self, spec: TopicSpec, env: Envelope) -> None:
        await self._send(spec, env)

    def _submitter(self, conversation: str, correlation: str, tenant: str | None) -> Any:
        async def submit(record: Record, command_id: str) -> None:
            await self._produce(COMMANDS, Envelope(
                record=record, key=conversation, source=SOURCE, subject=conversation,
                tenant=tenant, correlation=correlation, id=command_id))
        return submit

    # --- the sequencer ----------------------------------------------------------------------

    async def _on_command(self, env: Envelope, event: Any) -> None:  # noqa: ARG002
        if not isinstance(env.record, ASSISTANT_COMMANDS):
            return
        state = AssistantState.from_dict(self.states.get(env.key))
        new_state, outputs = sequence(state, env)
        # Outputs first (all acknowledged), table second: see the module docstring.
        for fut in [self._send(spec, out) for spec, out in outputs]:
            await fut
        if new_state is not None:
            self.states[env.key] = new_state.to_dict()

    # --- the log: transcripts, patterns, workflow starts --------------------------------------

    async def _on_log_record(self, env: Envelope, event: Any) -> None:  # noqa: ARG002
        transcript = Transcript.from_dict(self.transcripts.get(env.key))
        starts = transcript.apply(env, self.settings.assistant_history_bytes,
                                  self.settings.assistant_patterns_kept)
        if starts is None:
            return  # a redelivered record
        for kind, workflow, inp in starts:
            started = WorkflowStarted(workflow=workflow, kind=kind, input=inp)
            await self._produce(WORKFLOWS, Envelope(
                record=started, key=workflow, source=SOURCE, subject=workflow, seq=1,
                tenant=env.tenant, correlation=env.correlation, causation=env.id,
                id=f"{workflow}:1"))
        self.transcripts[env.key] = transcript.to_dict()

    # --- assistant-turn -------------------------------------------------------------------

    async def reply_step(self, ctx: StepContext) -> dict[str, Any]:
        """Open the request and transcript, run the assistant, record how the turn ended."""
        inp = ctx.input
        conversation, turn, tenant = inp["conversation"], inp["turn"], inp.get("tenant")
        try:
            request = Transcript.open_request(self.sealer, conversation, inp)
            history = Transcript.open_history(self.sealer, conversation, inp["transcript"])
            patterns = Transcript.open_patterns(self.sealer, conversation, inp["patterns"])
        except KeyErased:
            raise StepError(f"conversation {conversation!r} was erased", retryable=False) from None
        submit = self._submitter(conversation, turn, tenant)
        sink = ConversationSink(
            KafkaEffectSink(self.worker.producer, self.settings, turn, self.sealer,
                            tenant=tenant, source=SOURCE),
            submit, self.sealer, conversation, turn)
        result, suggested = await run_assistant_turn(
            self.settings, conversation=conversation, turn=turn, owner=inp["owner"],
            attempt=ctx.attempt, request=request, options=inp.get("options") or {},
            refs=[DatasetRef.model_validate(r) for r in inp.get("datasets") or []],
            history=history, patterns=patterns, source=self.datasets, box=self.box,
            client=self.client(), sink=sink, cancel=ctx.cancel)
        outcome = OUTCOMES[result.end_reason]
        reason = "; ".join(f"{e.kind}: {e.message}" for e in result.errors) or None
        await submit(AssistantTurnEnded(conversation=conversation, turn=turn, state=outcome,
                                        end_reason=result.end_reason, reason=reason),
                     f"{turn}:end")
        return {"state": outcome, "end_reason": result.end_reason,
                "suggested": [p.pattern_id for p in suggested]}

    async def turn_over(self, state: WorkflowState) -> None:
        """A turn whose step failed after its attempts: tell its stream, record it Failed."""
        if state.status != "failed":
            return
        inp = state.input
        conversation, turn = inp["conversation"], inp["turn"]
        submit = self._submitter(conversation, turn, inp.get("tenant"))
        reason = f"the turn failed after {state.attempt} attempts: {state.last_error}"
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
        await submit(AssistantTurnEnded(conversation=conversation, turn=turn, state="Failed",
                                        end_reason="error", reason=reason), f"{turn}:end")

    # --- assistant-extraction --------------------------------------------------------------

    def _exchange(self, inp: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            return Transcript.open_exchange(self.sealer, inp["conversation"], inp)
        except KeyErased:
            raise StepError(f"conversation {inp['conversation']!r} was erased",
                            retryable=False) from None

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
        request, chain = self._exchange(ctx.input)
        return {"pattern": await self._record_pattern(ctx.input, "provisional",
                                                      provisional(request, chain))}

    async def extract_step(self, ctx: StepContext) -> dict[str, Any]:
        """Ask the compaction agent for the exchange's pattern and record it."""
        inp = ctx.input
        request, chain = self._exchange(inp)
        sink = KafkaEffectSink(self.worker.producer, self.settings, ctx.workflow, self.sealer,
                               tenant=inp.get("tenant"), source=SOURCE)
        result = await run_turn(extractor_spec(self.settings), TurnInput(
            turn_id=ctx.workflow, user_message=extraction_prompt(request, chain),
            conversation_id=inp["conversation"], attempt=ctx.attempt, skip_history=True),
            self.client(), sink)
        if result.end_reason == "error" or not result.final_text.strip():
            raise StepError(f"the extractor gave no pattern ({result.end_reason}: "
                            + "; ".join(e.message for e in result.errors) + ")")
        return {"pattern": await self._record_pattern(inp, "extracted",
                                                      extracted(result.final_text, request))}


__all__ = ["EXTRACT_KIND", "TURN_KIND", "Assistant"]
