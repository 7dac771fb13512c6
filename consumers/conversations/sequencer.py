"""The conversation sequencer: the aggregate whose single writer appends each conversation's log.

``ConversationSequencer.decide`` is pure: given the conversation's state and one command it
returns the records to append and the answer (``consumers.frame`` does the rest). It never
calls a model and never opens sealed content. Deterministic, so a command replayed after a
crash yields the same records with the same seqs, which readers dedupe by
``(conversation, seq)``.

It keeps where the conversation's transcript is on the log (``transcript``: positions, from
the broker's delivery reports, ``placed``) and names in each message's record what its turn
reads, so the turn's workflow starts from that record alone.

Every turn it opens has a deadline (``VOICE_TURN_DEADLINE_S`` after its message): it stays in
``open_turns`` until a terminal ``TurnStateChanged`` ends it, and ``overdue`` names the open
turns past their deadline, for the worker's janitor to submit as ``ExpireTurn``. A turn ends
once: results of a turn that is no longer open (a late step, a re-run after the deadline)
are refused, never appended.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from consumers.conversations.follow_ups import follow_ups
from consumers.conversations.transcript import TranscriptIndex
from consumers.frame import Ack, Aggregate, AggregateState, Decision, append, remember
from schemas.base import Record
from schemas.conversation import (
    ConversationErased,
    ConversationStarted,
    EraseConversation,
    ExpireTurn,
    HistorySummarised,
    ProposalRecorded,
    RecordTurnResults,
    ReplyRecorded,
    SendMessage,
    StartConversation,
    TurnOpened,
    TurnStateChanged,
)
from streams.envelope import Envelope
from streams.ids import parse_turn, turn_id
from streams.topics import CONVERSATIONS, TopicSpec

SOURCE = "/voice/sequencer"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
TERMINAL = ("Replied", "CouldNotInterpret")


@dataclass(kw_only=True)
class ConversationState(AggregateState):
    """What the sequencer keeps per conversation (a Faust table value, as a dict)."""

    owner: str
    erased: bool = False
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)
    """command id or ``idem:<key>`` → the acknowledgement it got."""
    open_turns: dict[str, str] = field(default_factory=dict)
    """Each turn not yet ended → its deadline (ISO-8601)."""
    tracked_from: int = 0
    """The first message seq whose turn is tracked in ``open_turns``: a state written before
    turns had deadlines takes results of its older turns as it always did."""
    transcript: dict[str, Any] | None = field(default_factory=lambda: TranscriptIndex().to_dict())
    """Where its transcript is on the log (a ``TranscriptIndex``), from the delivery reports
    of its records (``placed``); None for a state written before the writer kept it (the
    worker's ``transcript_index`` table keeps that conversation's)."""

    # A long conversation's state holds up to ``MAX_REMEMBERED`` memos and
    # ``logrefs.MAX_ENTRIES`` index entries; the base class's deep copies of all of them, both
    # ways, were most of the ~23 ms a turn's two commands cost the writer at 600 turns
    # (``bench/writer.py``; ``docs/benchmarks.md``, eleventh pass). So only the containers a
    # command changes in place are copied: the memory of commands and the open turns (their
    # items are added and removed, a memo never changed), and the transcript's dict (``placed``
    # replaces it; its entries and summary are replaced, never changed in place).
    _OWN = ("commands", "open_turns", "transcript")

    @classmethod
    def _owned(cls, items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
        """``items`` as a dict, the ``_OWN`` containers copied (one level), the rest shared."""
        return {k: dict(v) if k in cls._OWN and isinstance(v, dict) else v for k, v in items}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Any:
        return None if d is None else cls(**cls._owned(d.items()))

    def to_dict(self) -> dict[str, Any]:
        return self._owned((f.name, getattr(self, f.name)) for f in fields(self))


class ConversationSequencer(Aggregate[ConversationState]):
    """Conversations: started, messages (each requesting a turn), turn results, erasure."""

    name = "conversations"
    what = "conversation"
    state = ConversationState
    log = CONVERSATIONS
    source = SOURCE
    commands = (StartConversation, SendMessage, EraseConversation, ReplyRecorded,
                ProposalRecorded, TurnStateChanged, HistorySummarised, ExpireTurn,
                RecordTurnResults)

    def __init__(self, turn_deadline_s: float = 900.0, read_bytes: int = 512 * 1024) -> None:
        """``turn_deadline_s`` is ``VOICE_TURN_DEADLINE_S``; ``read_bytes`` is
        ``VOICE_HISTORY_READ_BYTES`` (what a turn's history may read)."""
        self.turn_deadline_s = turn_deadline_s
        self.read_bytes = read_bytes

    def load(self, raw: dict[str, Any] | None) -> ConversationState | None:
        state: ConversationState | None = super().load(raw)
        if state is not None and raw is not None:
            if "open_turns" not in raw:
                state.tracked_from = state.seq + 1  # written before turns had deadlines
            if "transcript" not in raw:
                state.transcript = None  # written before the writer kept positions
        return state

    def placed(self, state: ConversationState,
               records: Sequence[tuple[Envelope, int, int]]) -> None:
        """Index where the broker put its messages, replies and summaries."""
        if state.transcript is None:
            return
        index = TranscriptIndex.from_dict(state.transcript)
        changed = False
        for env, partition, offset in records:
            changed = index.apply(env, partition, offset, self.read_bytes) or changed
        if changed:
            state.transcript = index.to_dict()

    def follow_ups(self, state: ConversationState,  # noqa: ARG002
                   records: Sequence[tuple[Envelope, int, int]]
                   ) -> list[tuple[TopicSpec, Envelope]]:
        """Each opened turn's workflow, each started conversation's index entry."""
        return follow_ups(records)

    def acknowledges(self, cmd: Envelope) -> bool:
        """A turn's results are answered to nobody: its step does not wait on them."""
        return not isinstance(cmd.record, RecordTurnResults)

    def remember(self, state: ConversationState, cmd: Envelope, memo: dict[str, Any]) -> None:
        """A tracked turn's results are not remembered: the turn they end is closed, which
        refuses a redelivery as surely, and the state stays as small as before the turn. Nor
        is a message sent with an idempotency key remembered by its command id: ``decide``
        remembers its key, which answers a redelivery of the same command (it carries the
        same key) as it answers a client's retry — one memo a message, not two."""
        rec = cmd.record
        if isinstance(rec, RecordTurnResults) and _tracked(state, rec.turn):
            return
        if isinstance(rec, SendMessage):
            if rec.idempotency_key:
                return
            seq = memo.get("seq")
            if isinstance(seq, int) and memo == _message_memo(cmd, seq):
                memo = {"seq": seq}  # the rest is the command's: ``remembered``
        super().remember(state, cmd, memo)

    def remembered(self, state: ConversationState | None, cmd: Envelope
                   ) -> dict[str, Any] | None:
        """The memo of a redelivered command; a message's, kept as its seq alone, as it was
        answered (its turn and time are the redelivered command's own)."""
        memo = super().remembered(state, cmd)
        if memo is not None and isinstance(cmd.record, SendMessage) and memo.keys() == {"seq"}:
            return _message_memo(cmd, memo["seq"])
        return memo

    def overdue(self, key: str, stored: dict[str, Any], now: datetime) -> list[Record]:
        """``ExpireTurn`` for each open turn past its deadline at ``now``, read from the
        stored state as it is (the janitor asks for every conversation it owns, each pass)."""
        if stored.get("erased"):
            return []
        return [ExpireTurn(conversation=key, turn=turn)
                for turn, deadline in (stored.get("open_turns") or {}).items()
                if datetime.fromisoformat(deadline) <= now]

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
            # One record for the message, its turn's request and its Thinking (three seqs),
            # naming what the turn reads besides the message (the positions the state knows).
            message = TurnOpened(conversation=rec.conversation, message_id=rec.message_id,
                                 text=rec.text, at=at, turn=turn)
            if state.transcript is not None:
                message = message.model_copy(update={"history": TranscriptIndex.from_dict(
                    state.transcript).before(message, msg_seq, self.read_bytes)})
            records = append(state, message)
            state.open_turns[turn] = (cmd.time + timedelta(seconds=self.turn_deadline_s)
                                      ).isoformat()
            ack = Ack.accepted(msg_seq, turn=turn, at=at)
            if idem:
                remember(state.commands, idem, ack.memo())
            return Decision(state, records, ack)

        if isinstance(rec, (ReplyRecorded, ProposalRecorded, TurnStateChanged,
                            HistorySummarised)):
            # Results of a turn, submitted by the turn worker through the commands topic.
            if not _open(state, rec.turn):
                return Decision(state, ack=Ack.rejected(f"turn {rec.turn!r} has ended"))
            records = append(state, rec)
            if isinstance(rec, TurnStateChanged) and rec.state in TERMINAL:
                state.open_turns.pop(rec.turn, None)
            return Decision(state, records, Ack.accepted(state.seq))

        if isinstance(rec, RecordTurnResults):
            # One decision for all of a turn's results; nothing to answer (no one waits), and
            # a refusal leaves the table as it was (``Decision(None)``: no changelog write).
            if not _open(state, rec.turn):
                return Decision(None)
            records = append(state, *rec.parts())
            state.open_turns.pop(rec.turn, None)
            return Decision(state, records)

        if isinstance(rec, ExpireTurn):
            deadline = state.open_turns.get(rec.turn)
            if deadline is None or cmd.time < datetime.fromisoformat(deadline):
                return Decision(state)  # ended meanwhile (or not due): nothing to do
            del state.open_turns[rec.turn]
            # A code, no words: decide never seals (and the deadline quotes nobody).
            records = append(state, TurnStateChanged(
                conversation=rec.conversation, turn=rec.turn, state="CouldNotInterpret",
                reason_code=DEADLINE_EXCEEDED))
            return Decision(state, records, Ack.accepted(state.seq))

        if isinstance(rec, EraseConversation):
            records = append(state, ConversationErased(conversation=rec.conversation))
            state.erased = True
            state.open_turns.clear()
            return Decision(state, records, Ack.accepted(state.seq))

        return Decision(state, ack=Ack.rejected(f"not a conversation command: {cmd.type}"))


def _message_memo(cmd: Envelope, seq: Any) -> dict[str, Any]:
    """What ``decide`` answers the message ``cmd`` when it gets ``seq``: its turn and time
    follow from the command, so a state keeps only the seq (a memo of ~130 bytes a message
    was two thirds of a 700-turn conversation's state, written twice a turn)."""
    return {"seq": seq, "turn": turn_id(cmd.record.conversation, seq),  # type: ignore[attr-defined]
            "at": cmd.time.isoformat()}


def _tracked(state: ConversationState, turn: str) -> bool:
    """Whether ``turn`` is one whose end ``open_turns`` tracks (not older than the tracking)."""
    parsed = parse_turn(turn)
    return parsed is not None and parsed[1] >= state.tracked_from


def _open(state: ConversationState, turn: str) -> bool:
    """Whether ``turn`` may still record results: open, or older than the tracking."""
    if turn in state.open_turns:
        return True
    parsed = parse_turn(turn)
    return parsed is not None and parsed[1] < state.tracked_from
