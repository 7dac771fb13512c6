"""The assistant conversation's sequencer: the aggregate whose single writer appends its log
(``voice.assistant``).

``AssistantSequencer.decide`` is pure: given the conversation's state and one command, it
returns the records to append and the answer (``consumers.frame`` does the rest). Every record
gets the next ``voice_seq`` and every display event the next ``display_seq`` (the SSE ``id:``),
both dense. It never calls a model and never opens sealed content. Deterministic, so a command
replayed after a crash yields the same records with the same seqs, which readers dedupe.

Only the edge's ``AssistantChat`` is acknowledged (the edge waits for it); the turn's own
commands (display events, reply, end, patterns) are not: nobody waits on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from consumers.frame import Ack, Aggregate, AggregateState, Decision, append, remember
from schemas.assistant import (
    ASSISTANT_COMMANDS,
    AppendDisplay,
    AssistantChat,
    AssistantConversationStarted,
    AssistantDisplayRecorded,
    AssistantHistorySummarised,
    AssistantPatternRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
)
from schemas.base import Record
from streams.envelope import Envelope
from streams.ids import turn_id
from streams.topics import ASSISTANT

SOURCE = "/voice/assistant-sequencer"


@dataclass(kw_only=True)
class AssistantState(AggregateState):
    """What the sequencer keeps per conversation (a Faust table value, as a dict)."""

    owner: str
    display_seq: int = 0
    running: str | None = None
    """The turn in progress; another chat is refused until it ends."""
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)


class AssistantSequencer(Aggregate[AssistantState]):
    """Assistant conversations: chats (one turn at a time), display events, turn results."""

    name = "assistant_conversations"
    what = "conversation"
    state = AssistantState
    log = ASSISTANT
    source = SOURCE
    commands = ASSISTANT_COMMANDS

    def acknowledges(self, cmd: Envelope) -> bool:
        return isinstance(cmd.record, AssistantChat)

    def decide(self, state: AssistantState | None, cmd: Envelope) -> Decision[AssistantState]:
        """Apply one command; times come from the command, so a replay is identical."""
        rec = cmd.record
        if isinstance(rec, AssistantChat):
            return _chat(state, cmd, rec)
        if state is None:  # a turn's output for a conversation this sequencer never opened
            return Decision(None)
        records: tuple[Record, ...]
        if isinstance(rec, AppendDisplay):
            state.display_seq += 1
            records = append(state, AssistantDisplayRecorded(
                conversation=rec.conversation, turn=rec.turn, display_seq=state.display_seq,
                event=rec.event))
        elif isinstance(rec, (AssistantReplyRecorded, AssistantPatternRecorded,
                              AssistantHistorySummarised)):
            records = append(state, rec)
        elif isinstance(rec, AssistantTurnEnded):
            records = append(state, rec)
            if state.running == rec.turn:
                state.running = None
        else:
            return Decision(state)
        return Decision(state, records)


def _chat(state: AssistantState | None, cmd: Envelope, rec: AssistantChat
          ) -> Decision[AssistantState]:
    started: tuple[Record, ...] = ()
    if state is None:
        if not rec.create:
            return Decision(None, ack=Ack.rejected("no such conversation"))
        state = AssistantState(owner=rec.owner)
        started = append(state, AssistantConversationStarted(conversation=rec.conversation,
                                                             owner=rec.owner))
    elif state.owner != rec.owner:
        # The same answer as for an unknown id: another owner's conversation does not "exist".
        return Decision(state, ack=Ack.rejected("no such conversation"))
    elif rec.create:
        return Decision(state, ack=Ack.rejected("conversation exists"))
    idem = f"idem:{rec.idempotency_key}" if rec.idempotency_key else None
    if idem and idem in state.commands:
        return Decision(state, ack=Ack.again(state.commands[idem]))
    if state.running is not None:
        return Decision(state, started, Ack.rejected("busy", turn=state.running))
    at = cmd.time.isoformat()
    turn = turn_id(rec.conversation, state.seq + 1)
    after = state.display_seq
    requested = append(state, AssistantTurnRequested(
        conversation=rec.conversation, turn=turn, message_id=rec.message_id,
        request=rec.request, datasets=rec.datasets, options=rec.options, after=after, at=at))
    state.running = turn
    ack = Ack.accepted(state.seq, turn=turn, after=after, at=at)
    if idem:
        remember(state.commands, idem, ack.memo())
    return Decision(state, (*started, *requested), ack)
