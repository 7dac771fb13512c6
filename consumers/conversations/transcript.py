"""Where a conversation's transcript is on its log: positions, never content.

A ``TranscriptIndex`` names, per conversation, the latest history summary and the messages
and replies after it — the most recent whose sealed content fits the read budget — by seq and
offset. The conversation's writer keeps it in the conversation's state, learning each record's
offset from the broker's delivery report (``ConversationSequencer.placed``), and names what a
turn reads in the record that opens it (``TurnOpened.history``): so no table of its own, and
no changelog record per message or reply. The product's ``transcript_index`` table keeps it
only for conversations begun before that (their states know no positions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from consumers.frame.logrefs import LogUnavailable, Position, recent
from schemas.conversation import (
    HistorySummarised,
    MessageRecorded,
    ReplyRecorded,
    TranscriptRef,
    TurnOpened,
)
from streams.envelope import Envelope


@dataclass
class TranscriptIndex:
    """Where a conversation's transcript is on its log (kept in the conversation's state by
    its writer; for a conversation begun before that, a value of the product's table).

    Positions only, never content: the latest summary, then the messages and replies after
    it — the most recent whose sealed content fits the read budget, at most
    ``logrefs.MAX_ENTRIES`` of them — so the value stays a few kilobytes at most.
    """

    partition: int | None = None
    entries: list[dict[str, int]] = field(default_factory=list)
    """``{"seq", "offset", "bytes"}`` of each message and reply after the summary."""
    summary: dict[str, int] | None = None
    """``{"seq", "offset", "through"}`` of the latest ``HistorySummarised``."""
    omitted_through: int = 0
    """The last seq left out of the index unsummarised (over the read budget); 0 if none."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TranscriptIndex:
        return cls() if not isinstance(d, dict) else cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Its fields as a dict, sharing their lists and dicts with it: nothing here changes
        an entry in place (``add`` and ``apply`` make new lists), and the writer's state copies
        what it stores. ``asdict``'s deep copy was ~11 % of a busy worker's CPU once a
        conversation had a few hundred turns (``docs/benchmarks.md``, eleventh pass)."""
        return {"partition": self.partition, "entries": self.entries, "summary": self.summary,
                "omitted_through": self.omitted_through}

    @property
    def covered(self) -> int:
        """The last seq the summary covers (0 without one)."""
        return self.summary["through"] if self.summary else 0

    def apply(self, env: Envelope, partition: int, offset: int, budget: int) -> bool:
        """Index one log record; whether the index changed (a redelivery changes nothing)."""
        rec, seq = env.record, env.seq
        if seq is None:
            return False
        if isinstance(rec, HistorySummarised):
            if rec.through_seq <= self.covered:
                return False
            self.partition = partition
            self.summary = {"seq": seq, "offset": offset, "through": rec.through_seq}
            self.entries = [e for e in self.entries if e["seq"] > rec.through_seq]
            if self.omitted_through <= rec.through_seq:
                self.omitted_through = 0
            return True
        if not isinstance(rec, (MessageRecorded, ReplyRecorded)):
            return False
        return self.add(seq, partition, offset, len(rec.text.ciphertext), budget)

    def add(self, seq: int, partition: int | None, offset: int, size: int, budget: int) -> bool:
        """Index one message or reply of ``size`` sealed bytes at ``seq``/``offset``."""
        if seq <= self.covered or (self.entries and self.entries[-1]["seq"] >= seq):
            return False
        if partition is not None:
            self.partition = partition
        entries = [*self.entries, {"seq": seq, "offset": offset, "bytes": size}]
        self.entries = recent(entries, budget)
        if len(self.entries) < len(entries):
            self.omitted_through = max(self.omitted_through,
                                       entries[len(entries) - len(self.entries) - 1]["seq"])
        return True

    def reference(self, message_seq: int, partition: int) -> dict[str, Any]:
        """What a turn of ``message_seq`` reads: positions of records up to the message."""
        return {"partition": self.partition if self.partition is not None else partition,
                "summary": None if self.summary is None
                else Position(self.summary["seq"], self.summary["offset"]).to_json(),
                "entries": [Position(e["seq"], e["offset"]).to_json()
                            for e in self.entries if e["seq"] <= message_seq],
                "omitted_through": self.omitted_through}

    def before(self, message: MessageRecorded, message_seq: int, budget: int) -> TranscriptRef:
        """What a turn of ``message`` (at ``message_seq``, not on the log yet) reads besides
        the message itself: the index as it will be once the message is in it, but for the
        message — the same positions ``reference`` gives once it is."""
        after = TranscriptIndex(self.partition, self.entries, self.summary, self.omitted_through)
        after.add(message_seq, None, -1, len(message.text.ciphertext), budget)
        return TranscriptRef(
            summary=None if after.summary is None
            else (after.summary["seq"], after.summary["offset"]),
            entries=[(e["seq"], e["offset"]) for e in after.entries if e["seq"] < message_seq],
            omitted_through=after.omitted_through)


def turn_reference(ref: TranscriptRef, message_seq: int, partition: int, offset: int
                   ) -> dict[str, Any]:
    """The positions a turn reads (as ``TranscriptIndex.reference`` names them) from what its
    ``TurnOpened`` names and where that record is itself."""
    return {"partition": partition,
            "summary": None if ref.summary is None else list(ref.summary),
            "entries": [*([s, o] for s, o in ref.entries), [message_seq, offset]],
            "omitted_through": ref.omitted_through}


def opened_at(partition: int, seq: int, offset: int) -> dict[str, Any]:
    """A turn's input ``history`` when its ``TurnOpened`` names the positions it reads: where
    that record is, a few numbers however long the conversation.

    The positions themselves (up to ``logrefs.MAX_ENTRIES`` pairs) in the input were copied,
    written to the changelog and decoded with the workflow's state at every step of it: the
    worker's CPU a turn grew by half over a 600-turn conversation (docs/benchmarks.md, issue
    14, twenty-second pass, section 6). The step reads the record (``reference_from``), then
    the records it names."""
    return {"partition": partition, "opened": [seq, offset]}


def reference_from(opened: Envelope, partition: int, offset: int) -> dict[str, Any]:
    """The positions a turn reads, from the ``TurnOpened`` its input names (``opened_at``),
    read back from ``partition``/``offset``; ``LogUnavailable`` if that record names none."""
    rec = opened.record
    if not isinstance(rec, TurnOpened) or rec.history is None or opened.seq is None:
        raise LogUnavailable(f"the record at {partition}@{offset} names no positions "
                             f"({type(rec).__name__})", retryable=False)
    return turn_reference(rec.history, opened.seq, partition, offset)
