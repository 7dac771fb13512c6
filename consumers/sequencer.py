"""The conversation sequencer: the single writer of each conversation's log.

``sequence`` is pure: given the conversation's state and one command it returns the new state
and the records to produce. It never calls a model and never opens sealed content. Because it
is deterministic, a command replayed after a crash yields the same records with the same seqs,
so readers dedupe by ``(conversation, seq)``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from schemas.base import Record
from schemas.conversation import (
    ConversationErased,
    ConversationStarted,
    EraseConversation,
    MessageRecorded,
    ProposalRecorded,
    ReplyRecorded,
    SendMessage,
    StartConversation,
    TurnRequested,
    TurnStateChanged,
)
from schemas.system import CommandAcknowledged
from streams.envelope import Envelope
from streams.ids import turn_id
from streams.topics import ACKS, CONVERSATIONS, TopicSpec

SOURCE = "/voice/sequencer"
MAX_REMEMBERED = 512
"""Command ids and idempotency keys a conversation remembers for dedupe."""


@dataclass
class ConversationState:
    """What the sequencer keeps per conversation (a Faust table value, as a dict)."""

    owner: str
    seq: int = 0
    erased: bool = False
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)
    """command id or ``idem:<key>`` → the acknowledgement it got."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> ConversationState | None:
        return None if d is None else cls(**copy.deepcopy(d))

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy({"owner": self.owner, "seq": self.seq, "erased": self.erased,
                              "commands": self.commands})

    def remember(self, key: str, ack: dict[str, Any]) -> None:
        self.commands[key] = ack
        while len(self.commands) > MAX_REMEMBERED:
            self.commands.pop(next(iter(self.commands)))


Output = tuple[TopicSpec, Envelope]


def _ack(cmd: Envelope, outcome: str, seq: int | None, **detail: Any) -> Output:
    rec = CommandAcknowledged(
        command_id=cmd.id, aggregate=cmd.key, outcome=outcome, seq=seq, detail=detail  # type: ignore[arg-type]
    )
    return ACKS, Envelope(record=rec, key=cmd.id, source=SOURCE, subject=cmd.key,
                          tenant=cmd.tenant, correlation=cmd.correlation, causation=cmd.id,
                          id=f"{cmd.id}-ack")


def _append(state: ConversationState, cmd: Envelope, record: Record, now: datetime) -> Output:
    state.seq += 1
    return CONVERSATIONS, Envelope(
        record=record, key=cmd.key, source=SOURCE, subject=cmd.key, seq=state.seq,
        tenant=cmd.tenant, correlation=cmd.correlation or cmd.id, causation=cmd.id,
        id=f"{cmd.id}-{state.seq}", time=now,
    )


def sequence(
    state: ConversationState | None, cmd: Envelope
) -> tuple[ConversationState | None, list[Output]]:
    """Apply one command to a conversation; returns (new state, records to produce in order).

    The given state is not modified. Times come from the command, so a replay is identical.
    """
    state = copy.deepcopy(state)
    now = cmd.time
    rec = cmd.record
    if state is not None and cmd.id in state.commands:  # redelivered command
        return state, [_ack(cmd, "duplicate", **state.commands[cmd.id])]

    if isinstance(rec, StartConversation):
        if state is not None:
            return state, [_ack(cmd, "rejected", None, reason="conversation exists")]
        state = ConversationState(owner=rec.owner)
        out = [_append(state, cmd, ConversationStarted(conversation=rec.conversation,
                                                       owner=rec.owner), now)]
        state.remember(cmd.id, {"seq": state.seq})
        return state, [*out, _ack(cmd, "accepted", state.seq)]

    if state is None or state.erased:
        return state, [_ack(cmd, "rejected", None, reason="no such conversation")]

    if isinstance(rec, SendMessage):
        idem = f"idem:{rec.idempotency_key}" if rec.idempotency_key else None
        if idem and idem in state.commands:
            return state, [_ack(cmd, "duplicate", **state.commands[idem])]
        at = now.isoformat()
        out = [_append(state, cmd, MessageRecorded(conversation=rec.conversation,
                                                   message_id=rec.message_id, text=rec.text,
                                                   at=at), now)]
        msg_seq = state.seq
        turn = turn_id(rec.conversation, msg_seq)
        out.append(_append(state, cmd, TurnRequested(conversation=rec.conversation, turn=turn,
                                                     message_seq=msg_seq), now))
        out.append(_append(state, cmd, TurnStateChanged(conversation=rec.conversation,
                                                        turn=turn, state="Thinking"), now))
        ack = {"seq": msg_seq, "turn": turn, "at": at}
        state.remember(cmd.id, ack)
        if idem:
            state.remember(idem, ack)
        return state, [*out, _ack(cmd, "accepted", msg_seq, turn=turn, at=at)]

    if isinstance(rec, (ReplyRecorded, ProposalRecorded, TurnStateChanged)):
        # Results of a turn, submitted by the turn worker through the commands topic.
        out = [_append(state, cmd, rec, now)]
        state.remember(cmd.id, {"seq": state.seq})
        return state, [*out, _ack(cmd, "accepted", state.seq)]

    if isinstance(rec, EraseConversation):
        out = [_append(state, cmd, ConversationErased(conversation=rec.conversation), now)]
        state.erased = True
        state.remember(cmd.id, {"seq": state.seq})
        return state, [*out, _ack(cmd, "accepted", state.seq)]

    return state, [_ack(cmd, "rejected", None, reason=f"not a conversation command: {cmd.type}")]
