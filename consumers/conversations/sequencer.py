"""The conversation sequencer: the aggregate whose single writer appends each conversation's log.

``ConversationSequencer.decide`` is pure: given the conversation's state and one command it
returns the records to append and the answer (``consumers.frame`` does the rest). It never
calls a model and never opens sealed content. Deterministic, so a command replayed after a
crash yields the same records with the same seqs, which readers dedupe by
``(conversation, seq)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from consumers.frame import Ack, Aggregate, AggregateState, Decision, append, remember
from schemas.conversation import (
    ConversationErased,
    ConversationStarted,
    EraseConversation,
    HistorySummarised,
    MessageRecorded,
    ProposalRecorded,
    ReplyRecorded,
    SendMessage,
    StartConversation,
    TurnRequested,
    TurnStateChanged,
)
from streams.envelope import Envelope
from streams.ids import turn_id
from streams.topics import CONVERSATIONS

SOURCE = "/voice/sequencer"


@dataclass(kw_only=True)
class ConversationState(AggregateState):
    """What the sequencer keeps per conversation (a Faust table value, as a dict)."""

    owner: str
    erased: bool = False
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)
    """command id or ``idem:<key>`` → the acknowledgement it got."""


class ConversationSequencer(Aggregate[ConversationState]):
    """Conversations: started, messages (each requesting a turn), turn results, erasure."""

    name = "conversations"
    what = "conversation"
    state = ConversationState
    log = CONVERSATIONS
    source = SOURCE
    commands = (StartConversation, SendMessage, EraseConversation, ReplyRecorded,
                ProposalRecorded, TurnStateChanged, HistorySummarised)

    def decide(self, state: ConversationState | None, cmd: Envelope
               ) -> Decision[ConversationState]:
        """Apply one command; times come from the command, so a replay is identical."""
        rec = cmd.record
        if isinstance(rec, StartConversation):
            if state is not None:
                return Decision(state, ack=Ack.rejected("conversation exists"))
            state = ConversationState(owner=rec.owner)
            records = append(state, ConversationStarted(conversation=rec.conversation,
                                                        owner=rec.owner))
            return Decision(state, records, Ack.accepted(state.seq))

        if state is None or state.erased:
            return Decision(state, ack=Ack.rejected("no such conversation"))

        if isinstance(rec, SendMessage):
            idem = f"idem:{rec.idempotency_key}" if rec.idempotency_key else None
            if idem and idem in state.commands:
                return Decision(state, ack=Ack.again(state.commands[idem]))
            at = cmd.time.isoformat()
            msg_seq = state.seq + 1
            turn = turn_id(rec.conversation, msg_seq)
            records = append(
                state,
                MessageRecorded(conversation=rec.conversation, message_id=rec.message_id,
                                text=rec.text, at=at),
                TurnRequested(conversation=rec.conversation, turn=turn, message_seq=msg_seq),
                TurnStateChanged(conversation=rec.conversation, turn=turn, state="Thinking"))
            ack = Ack.accepted(msg_seq, turn=turn, at=at)
            if idem:
                remember(state.commands, idem, ack.memo())
            return Decision(state, records, ack)

        if isinstance(rec, (ReplyRecorded, ProposalRecorded, TurnStateChanged,
                            HistorySummarised)):
            # Results of a turn, submitted by the turn worker through the commands topic.
            records = append(state, rec)
            return Decision(state, records, Ack.accepted(state.seq))

        if isinstance(rec, EraseConversation):
            records = append(state, ConversationErased(conversation=rec.conversation))
            state.erased = True
            return Decision(state, records, Ack.accepted(state.seq))

        return Decision(state, ack=Ack.rejected(f"not a conversation command: {cmd.type}"))
