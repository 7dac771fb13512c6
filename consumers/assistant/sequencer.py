"""The assistant conversation's sequencer: the single writer of its log (``voice.assistant``).

``sequence`` is pure: given the conversation's state and one command, it returns the new state
and the records to produce. It gives every record the next ``voice_seq`` and every display event
the next ``display_seq`` (the SSE ``id:``), both dense. It never calls a model and never opens
sealed content. Deterministic, so a command replayed after a crash (outputs produced, state not
yet written) yields the same records with the same seqs, which readers dedupe.

Only the edge's ``AssistantChat`` is acknowledged (the edge waits for it); the turn's own
commands (display events, reply, end, patterns) are not: nobody waits on them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from schemas.assistant import (
    AppendDisplay,
    AssistantChat,
    AssistantConversationStarted,
    AssistantDisplayRecorded,
    AssistantPatternRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
)
from schemas.base import Record
from schemas.system import CommandAcknowledged
from streams.envelope import Envelope
from streams.ids import turn_id
from streams.topics import ACKS, ASSISTANT, TopicSpec

SOURCE = "/voice/assistant-sequencer"
MAX_REMEMBERED = 512
"""Command ids and idempotency keys a conversation remembers for dedupe."""

Output = tuple[TopicSpec, Envelope]


@dataclass
class AssistantState:
    """What the sequencer keeps per conversation (a Faust table value, as a dict)."""

    owner: str
    seq: int = 0
    display_seq: int = 0
    running: str | None = None
    """The turn in progress; another chat is refused until it ends."""
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> AssistantState | None:
        return None if d is None else cls(**copy.deepcopy(d))

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy({"owner": self.owner, "seq": self.seq,
                              "display_seq": self.display_seq, "running": self.running,
                              "commands": self.commands})

    def remember(self, key: str, detail: dict[str, Any]) -> None:
        self.commands[key] = detail
        while len(self.commands) > MAX_REMEMBERED:
            self.commands.pop(next(iter(self.commands)))


def _ack(cmd: Envelope, outcome: str, seq: int | None, **detail: Any) -> Output:
    rec = CommandAcknowledged(command_id=cmd.id, aggregate=cmd.key, outcome=outcome,  # type: ignore[arg-type]
                              seq=seq, detail=detail)
    return ACKS, Envelope(record=rec, key=cmd.id, source=SOURCE, subject=cmd.key,
                          tenant=cmd.tenant, correlation=cmd.correlation, causation=cmd.id,
                          id=f"{cmd.id}-ack")


def _append(state: AssistantState, cmd: Envelope, record: Record) -> Output:
    state.seq += 1
    return ASSISTANT, Envelope(
        record=record, key=cmd.key, source=SOURCE, subject=cmd.key, seq=state.seq,
        tenant=cmd.tenant, correlation=cmd.correlation or cmd.id, causation=cmd.id,
        id=f"{cmd.id}-{state.seq}", time=cmd.time)


def sequence(state: AssistantState | None, cmd: Envelope
             ) -> tuple[AssistantState | None, list[Output]]:
    """Apply one command to a conversation; returns (new state, records to produce in order).

    The given state is not modified. Times come from the command, so a replay is identical.
    """
    state = copy.deepcopy(state)
    rec = cmd.record
    if state is not None and cmd.id in state.commands:  # redelivered command
        if isinstance(rec, AssistantChat):
            return state, [_ack(cmd, "duplicate", **state.commands[cmd.id])]
        return state, []
    if isinstance(rec, AssistantChat):
        return _chat(state, cmd, rec)
    if state is None:  # a turn's output for a conversation this sequencer never opened
        return None, []
    if isinstance(rec, AppendDisplay):
        state.display_seq += 1
        out = [_append(state, cmd, AssistantDisplayRecorded(
            conversation=rec.conversation, turn=rec.turn, display_seq=state.display_seq,
            event=rec.event))]
    elif isinstance(rec, (AssistantReplyRecorded, AssistantPatternRecorded)):
        out = [_append(state, cmd, rec)]
    elif isinstance(rec, AssistantTurnEnded):
        out = [_append(state, cmd, rec)]
        if state.running == rec.turn:
            state.running = None
    else:
        return state, []
    state.remember(cmd.id, {})
    return state, out


def _chat(state: AssistantState | None, cmd: Envelope, rec: AssistantChat
          ) -> tuple[AssistantState | None, list[Output]]:
    out: list[Output] = []
    if state is None:
        if not rec.create:
            return None, [_ack(cmd, "rejected", None, reason="no such conversation")]
        state = AssistantState(owner=rec.owner)
        out.append(_append(state, cmd, AssistantConversationStarted(
            conversation=rec.conversation, owner=rec.owner)))
    elif state.owner != rec.owner:
        # The same answer as for an unknown id: another owner's conversation does not "exist".
        return state, [_ack(cmd, "rejected", None, reason="no such conversation")]
    elif rec.create:
        return state, [_ack(cmd, "rejected", None, reason="conversation exists")]
    idem = f"idem:{rec.idempotency_key}" if rec.idempotency_key else None
    if idem and idem in state.commands:
        return state, [_ack(cmd, "duplicate", **state.commands[idem])]
    if state.running is not None:
        return state, [*out, _ack(cmd, "rejected", None, reason="busy", turn=state.running)]
    at = cmd.time.isoformat()
    seq = state.seq + 1
    turn = turn_id(rec.conversation, seq)
    out.append(_append(state, cmd, AssistantTurnRequested(
        conversation=rec.conversation, turn=turn, message_id=rec.message_id,
        request=rec.request, datasets=rec.datasets, options=rec.options,
        after=state.display_seq, at=at)))
    state.running = turn
    detail = {"seq": seq, "turn": turn, "after": state.display_seq, "at": at}
    state.remember(cmd.id, detail)
    if idem:
        state.remember(idem, detail)
    return state, [*out, _ack(cmd, "accepted", seq, turn=turn, after=state.display_seq, at=at)]
