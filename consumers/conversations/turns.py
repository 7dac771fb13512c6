"""The conversation-turn workflow (id ``{conversation}:turn-{seq}``) and its transcript.

The conversation product keeps each conversation's sealed transcript in a Faust table, fed by the
conversation log. ``TurnRequested`` starts the workflow with the sealed transcript up to the
message as its input, so the step needs no other state. The one step opens the transcript,
hands it to the concern-extraction agent, and submits the reply, proposal and turn state to
the conversation's sequencer as commands with ids derived from the turn — a step re-run after
a crash submits the same ids, and the sequencer records each exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from consumers.conversations.concern import ConcernReply
from consumers.engine.cancel import CancelToken
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef, WorkflowState
from consumers.workflows.runtime import StepError
from schemas.base import Record, Sealed
from schemas.conversation import (
    ConversationErased,
    MessageRecorded,
    ProposalRecorded,
    ReplyRecorded,
    TurnRequested,
    TurnStateChanged,
)
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope
from streams.producer import Publisher
from streams.sealing import KeyErased, Sealer
from streams.topics import COMMANDS, WORKFLOWS

log = logging.getLogger(__name__)

KIND = "conversation-turn"
SOURCE = "/voice/turn-worker"

ConcernAgent = Callable[[str, str, int, list[dict[str, Any]], CancelToken, str | None],
                      Awaitable[ConcernReply]]
"""(conversation, turn, attempt, Messages-API history ending with the user message, the
step's cancel token, the tenant whose model-token budget the turn uses) → reply."""


def transcript_entry(env: Envelope) -> dict[str, Any] | None:
    """The sealed transcript entry a conversation record contributes, if any."""
    rec = env.record
    if isinstance(rec, MessageRecorded):
        return {"seq": env.seq, "role": "user", "content_id": rec.message_id,
                "sealed": rec.text.model_dump()}
    if isinstance(rec, ReplyRecorded):
        return {"seq": env.seq, "role": "assistant", "content_id": rec.reply_id,
                "sealed": rec.text.model_dump()}
    return None


def open_transcript(sealer: Sealer, conversation: str, transcript: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """The sealed transcript as Messages-API history (opened only to hand it to the model)."""
    history: list[dict[str, Any]] = []
    for e in transcript:
        text = sealer.open_text(conversation, e["content_id"], Sealed.model_validate(e["sealed"]))
        if history and history[-1]["role"] == e["role"]:  # keep roles alternating
            history[-1]["content"] += "\n\n" + text
        else:
            history.append({"role": e["role"], "content": text})
    return history


class Turns:
    """Feeds transcripts, starts turn workflows, and runs their one step."""

    def __init__(self, publisher: Publisher, transcripts: Any, sealer: Sealer,
                 agent: ConcernAgent) -> None:
        self.publisher = publisher
        self.transcripts = transcripts
        self.sealer = sealer
        self.agent = agent
        self.definition = WorkflowDef(KIND, (StepDef("reply", self.reply_step),),
                                      on_end=self.on_end)

    async def on_conversation_record(self, env: Envelope) -> None:
        """Keep the sealed transcript; start the workflow of each requested turn."""
        rec = env.record
        entry = transcript_entry(env)
        if entry is not None:
            entries = list(self.transcripts.get(env.key) or [])
            if not entries or entries[-1]["seq"] < entry["seq"]:
                self.transcripts[env.key] = [*entries, entry]
        elif isinstance(rec, TurnRequested):
            upto = [e for e in (self.transcripts.get(env.key) or [])
                    if e["seq"] <= rec.message_seq]
            started = WorkflowStarted(workflow=rec.turn, kind=KIND, input={
                "conversation": rec.conversation, "turn": rec.turn,
                "message_seq": rec.message_seq, "tenant": env.tenant, "transcript": upto})
            out = Envelope(record=started, key=rec.turn, source=SOURCE, subject=rec.turn,
                           seq=1, tenant=env.tenant, correlation=env.correlation,
                           causation=env.id, id=f"{rec.turn}:1")
            await self.publisher.send(WORKFLOWS, out)
        elif isinstance(rec, ConversationErased):
            self.transcripts.pop(env.key, None)
            self.sealer.purge(env.key)

    async def reply_step(self, ctx: StepContext) -> dict[str, Any]:
        """Open the sealed transcript, run the agent, submit reply + proposal + state."""
        conversation, turn = ctx.input["conversation"], ctx.input["turn"]
        try:
            history = open_transcript(self.sealer, conversation, ctx.input["transcript"])
        except KeyErased:
            raise StepError(f"conversation {conversation!r} was erased", retryable=False) from None
        if not history or history[-1]["role"] != "user":
            raise StepError(f"turn {turn!r} has no participant message", retryable=False)
        tenant = ctx.input.get("tenant")
        reply = await self.agent(conversation, turn, ctx.attempt, history, ctx.cancel, tenant)
        if reply.cancelled:
            await self._submit(conversation, turn, tenant, "state", TurnStateChanged(
                conversation=conversation, turn=turn, state="CouldNotInterpret",
                reason=f"the turn was {reply.cancelled}"))
            return {"state": "CouldNotInterpret", "cancelled": True}
        if reply.could_not_interpret:
            await self._submit(conversation, turn, tenant, "state", TurnStateChanged(
                conversation=conversation, turn=turn, state="CouldNotInterpret",
                reason=f"the agent could not interpret the message: {reply.could_not_interpret}"))
            return {"state": "CouldNotInterpret"}
        reply_id = f"{turn}:reply"
        await self._submit(conversation, turn, tenant, "reply", ReplyRecorded(
            conversation=conversation, turn=turn, reply_id=reply_id,
            text=self.sealer.seal(conversation, reply_id, reply.text or "…")))
        if reply.proposal is not None:
            proposal_id = f"{turn}:proposal"
            await self._submit(conversation, turn, tenant, "proposal", ProposalRecorded(
                conversation=conversation, turn=turn, proposal_id=proposal_id,
                proposal=self.sealer.seal_json(conversation, proposal_id,
                                               reply.proposal.model_dump(mode="json"))))
        await self._submit(conversation, turn, tenant, "state", TurnStateChanged(
            conversation=conversation, turn=turn, state="Replied"))
        return {"state": "Replied", "reply_id": reply_id,
                "proposal": reply.proposal is not None}

    async def on_end(self, state: WorkflowState) -> None:
        """A turn whose step failed after its attempts ends as CouldNotInterpret."""
        if state.status != "failed":
            return
        conversation, turn = state.input["conversation"], state.input["turn"]
        await self._submit(conversation, turn, state.input.get("tenant"), "state",
                           TurnStateChanged(conversation=conversation, turn=turn,
                                            state="CouldNotInterpret",
                                            reason=f"the turn failed after {state.attempt} "
                                                   f"attempts: {state.last_error}"))

    async def _submit(self, conversation: str, turn: str, tenant: str | None, part: str,
                      record: Record) -> None:
        env = Envelope(record=record, key=conversation, source=SOURCE, subject=conversation,
                       tenant=tenant, correlation=turn, id=f"{turn}:{part}")
        await self.publisher.send(COMMANDS, env)
