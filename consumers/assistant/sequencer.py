"""The assistant conversation's sequencer: the aggregate whose single writer appends its log
(``voice.assistant``).

``AssistantSequencer.decide`` is pure: given the conversation's state and one command, it
returns the records to append and the answer (``consumers.frame`` does the rest). Every record
gets the next ``voice_seq`` and every display event the next ``display_seq`` (the SSE ``id:``),
both dense. It never calls a model and never opens sealed content. Deterministic, so a command
replayed after a crash yields the same records with the same seqs, which readers dedupe.

Only the edge's ``AssistantChat`` is acknowledged (the edge waits for it); the turn's own
commands (display events, reply, end, patterns) are not: nobody waits on them.

One turn runs at a time, with a deadline (``VOICE_ASSISTANT_TURN_DEADLINE_S`` after its
chat); ``overdue`` names a running turn past it, for the worker's janitor to submit as
``ExpireAssistantTurn``, which ends it ``Failed`` (``DEADLINE_EXCEEDED``). A turn ends once and
records one reply: display events, replies and ends of a turn that is not the running one
(a late step, a re-run after the end) are ignored, and so is a second reply of the running
turn (an attempt re-run after its worker died, whose reply has another effect key).

``EraseAssistantConversation`` comes after the edge destroyed the conversation's key: it appends
``AssistantConversationErased`` and ends the running turn's place (no end record: its words
could not be sealed any more); from then on a chat is refused as for an unknown id and a turn's
late output is ignored, so a turn still running when its chat was erased ends on its worker
(its next seal or open fails with ``KeyErased``) and leaves nothing behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from consumers.frame import Ack, Aggregate, AggregateState, Decision, append, remember
from schemas.assistant import (
    ASSISTANT_COMMANDS,
    AppendDisplay,
    AssistantChat,
    AssistantConversationErased,
    AssistantConversationStarted,
    AssistantDisplayRecorded,
    AssistantHistorySummarised,
    AssistantPatternRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
    EraseAssistantConversation,
    ExpireAssistantTurn,
)
from schemas.base import Record
from streams.envelope import Envelope
from streams.ids import turn_id
from streams.topics import ASSISTANT

SOURCE = "/voice/assistant-sequencer"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


@dataclass(kw_only=True)
class AssistantState(AggregateState):
    """What the sequencer keeps per conversation (a Faust table value, as a dict)."""

    owner: str
    display_seq: int = 0
    running: str | None = None
    """The turn in progress; another chat is refused until it ends."""
    deadline: str | None = None
    """When the running turn is past its deadline (ISO-8601)."""
    replied: bool = False
    """Whether the running turn's reply is recorded (a second one is ignored)."""
    erased: bool = False
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)


class AssistantSequencer(Aggregate[AssistantState]):
    """Assistant conversations: chats (one turn at a time), display events, turn results."""

    name = "assistant_conversations"
    what = "conversation"
    state = AssistantState
    log = ASSISTANT
    source = SOURCE
    commands = ASSISTANT_COMMANDS

    def __init__(self, turn_deadline_s: float = 900.0) -> None:
        """``turn_deadline_s`` is ``VOICE_ASSISTANT_TURN_DEADLINE_S``."""
        self.turn_deadline_s = turn_deadline_s

    def acknowledges(self, cmd: Envelope) -> bool:
        return isinstance(cmd.record, (AssistantChat, EraseAssistantConversation))

    def overdue(self, key: str, stored: dict[str, Any], now: datetime) -> list[Record]:
        """``ExpireAssistantTurn`` for the running turn if past its deadline at ``now`` (or
        without one), read from the stored state as it is (the janitor asks each pass)."""
        running, deadline = stored.get("running"), stored.get("deadline")
        if running is None or stored.get("erased") or (
                deadline is not None and datetime.fromisoformat(deadline) > now):
            return []
        return [ExpireAssistantTurn(conversation=key, turn=running)]

    def decide(self, state: AssistantState | None, cmd: Envelope) -> Decision[AssistantState]:
        """Apply one command; times come from the command, so a replay is identical."""
        rec = cmd.record
        if isinstance(rec, EraseAssistantConversation):
            return _erase(state, rec)
        if isinstance(rec, AssistantChat):
            decision = _chat(state, cmd, rec)
            if decision.ack is not None and decision.ack.outcome == "accepted" \
                    and decision.state is not None:
                decision.state.deadline = (cmd.time + timedelta(seconds=self.turn_deadline_s)
                                           ).isoformat()
                decision.state.replied = False
            return decision
        if state is None or state.erased:  # a turn's output for a conversation this
            return Decision(state)             # sequencer never opened, or erased since
        records: tuple[Record, ...]
        if isinstance(rec, (AppendDisplay, AssistantReplyRecorded, AssistantTurnEnded,
                            ExpireAssistantTurn)) and rec.turn != state.running:
            return Decision(state)  # that turn has ended: it ends once
        if isinstance(rec, AppendDisplay):
            state.display_seq += 1
            records = append(state, AssistantDisplayRecorded(
                conversation=rec.conversation, turn=rec.turn, display_seq=state.display_seq,
                event=rec.event))
        elif isinstance(rec, AssistantReplyRecorded):
            if state.replied:
                return Decision(state)  # another attempt's reply: the turn has one
            state.replied = True
            records = append(state, rec)
        elif isinstance(rec, (AssistantPatternRecorded, AssistantHistorySummarised)):
            records = append(state, rec)
        elif isinstance(rec, AssistantTurnEnded):
            records = append(state, rec)
            state.running, state.deadline = None, None
        elif isinstance(rec, ExpireAssistantTurn):
            if state.deadline is None:  # running since before turns had deadlines
                state.deadline = (cmd.time + timedelta(seconds=self.turn_deadline_s)
                                  ).isoformat()
                return Decision(state)  # its clock starts now
            if cmd.time < datetime.fromisoformat(state.deadline):
                return Decision(state)  # not due
            records = append(state, AssistantTurnEnded(
                conversation=rec.conversation, turn=rec.turn, state="Failed",
                end_reason="error", reason_code=DEADLINE_EXCEEDED))
            state.running, state.deadline = None, None
        else:
            return Decision(state)
        return Decision(state, records)


def _erase(state: AssistantState | None, rec: EraseAssistantConversation
           ) -> Decision[AssistantState]:
    if state is None or state.erased:
        return Decision(state, ack=Ack.rejected("no such conversation"))
    records = append(state, AssistantConversationErased(conversation=rec.conversation))
    state.erased, state.running, state.deadline = True, None, None
    state.commands.clear()  # idempotency memos: nothing is answered again for it
    return Decision(state, records, Ack.accepted(state.seq))


def _chat(state: AssistantState | None, cmd: Envelope, rec: AssistantChat
          ) -> Decision[AssistantState]:
    started: tuple[Record, ...] = ()
    if state is not None and state.erased:
        # An erased conversation answers as an unknown id does (create or not: its id is
        # spent; the edge makes fresh ones).
        return Decision(state, ack=Ack.rejected("no such conversation"))
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
