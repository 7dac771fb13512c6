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

from consumers.frame.logrefs import MAX_ENTRIES, LogUnavailable, Position
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

    An entry is added, and the oldest ones it pushes out are dropped, in time that does not
    grow with the index (``total`` is kept, not summed): a writer's index work was a quarter
    of its loop at 1,000 entries when each add summed and bisected them all
    (docs/benchmarks.md, issue 14, twenty-fourth pass).
    """

    partition: int | None = None
    entries: list[list[int]] = field(default_factory=list)
    """``[seq, offset, bytes]`` of each message and reply after the summary, oldest first (a
    list, as JSON keeps it; ``{"seq", "offset", "bytes"}`` dicts of states written before
    are read as such)."""
    summary: dict[str, int] | None = None
    """``{"seq", "offset", "through"}`` of the latest ``HistorySummarised``."""
    omitted_through: int = 0
    """The last seq left out of the index unsummarised (over the read budget); 0 if none."""
    total: int | None = None
    """The entries' bytes together; None until first needed in a state written before it was
    kept."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TranscriptIndex:
        if not isinstance(d, dict):
            return cls()
        entries = d.get("entries") or []
        if entries and isinstance(entries[0], dict):  # written before entries were triples
            entries = [[e["seq"], e["offset"], e.get("bytes", 0)] for e in entries]
        return cls(d.get("partition"), entries, d.get("summary"), d.get("omitted_through", 0),
                   d.get("total"))

    def to_dict(self) -> dict[str, Any]:
        """Its fields as a dict, sharing their lists and dicts with it: nothing here changes
        an entry in place (``add`` and ``apply`` make new lists), and the writer's state copies
        what it stores. ``asdict``'s deep copy was ~11 % of a busy worker's CPU once a
        conversation had a few hundred turns (``docs/benchmarks.md``, eleventh pass)."""
        return {"partition": self.partition, "entries": self.entries, "summary": self.summary,
                "omitted_through": self.omitted_through, "total": self._total()}

    @property
    def covered(self) -> int:
        """The last seq the summary covers (0 without one)."""
        return self.summary["through"] if self.summary else 0

    def _total(self) -> int:
        if self.total is None:
            self.total = sum(e[2] for e in self.entries)
        return self.total

    def _takes(self, seq: int) -> bool:
        """Whether an entry at ``seq`` would be new (not covered, after the last one)."""
        return seq > self.covered and not (self.entries and self.entries[-1][0] >= seq)

    def _pushed_out(self, size: int, budget: int) -> tuple[int, int]:
        """How many of the oldest entries a new entry of ``size`` bytes pushes out — while
        together they are over ``budget`` bytes or ``MAX_ENTRIES`` entries; never the new
        one — and the bytes of the entries left with it. As ``logrefs.recent`` keeps them."""
        entries = self.entries
        total = self._total() + size
        count = len(entries) + 1
        drop = 0
        while drop < len(entries) and (count - drop > MAX_ENTRIES or total > budget):
            total -= entries[drop][2]
            drop += 1
        return drop, total

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
            self.entries = [e for e in self.entries if e[0] > rec.through_seq]
            self.total = None
            if self.omitted_through <= rec.through_seq:
                self.omitted_through = 0
            return True
        if not isinstance(rec, (MessageRecorded, ReplyRecorded)):
            return False
        return self.add(seq, partition, offset, len(rec.text.ciphertext), budget)

    def add(self, seq: int, partition: int | None, offset: int, size: int, budget: int) -> bool:
        """Index one message or reply of ``size`` sealed bytes at ``seq``/``offset``."""
        if not self._takes(seq):
            return False
        if partition is not None:
            self.partition = partition
        drop, self.total = self._pushed_out(size, budget)
        if drop:
            self.omitted_through = max(self.omitted_through, self.entries[drop - 1][0])
        self.entries = [*self.entries[drop:], [seq, offset, size]]
        return True

    def reference(self, message_seq: int, partition: int) -> dict[str, Any]:
        """What a turn of ``message_seq`` reads: positions of records up to the message."""
        return {"partition": self.partition if self.partition is not None else partition,
                "summary": None if self.summary is None
                else Position(self.summary["seq"], self.summary["offset"]).to_json(),
                "entries": [[e[0], e[1]] for e in self.entries if e[0] <= message_seq],
                "omitted_through": self.omitted_through}

    def before(self, message: MessageRecorded, message_seq: int, budget: int) -> TranscriptRef:
        """What a turn of ``message`` (at ``message_seq``, not on the log yet) reads besides
        the message itself: the index as it will be once the message is in it, but for the
        message — the same positions ``reference`` gives once it is."""
        omitted, drop = self.omitted_through, 0
        if self._takes(message_seq):
            drop, _ = self._pushed_out(len(message.text.ciphertext), budget)
            if drop:
                omitted = max(omitted, self.entries[drop - 1][0])
            entries = [(e[0], e[1]) for e in self.entries[drop:]]
        else:
            entries = [(e[0], e[1]) for e in self.entries if e[0] < message_seq]
        # Built from the index's own integers: validating up to 1,000 pairs again cost more
        # than the rest of a turn's index work together (~90 µs at 1,000).
        return TranscriptRef.model_construct(
            summary=None if self.summary is None
            else (self.summary["seq"], self.summary["offset"]),
            entries=entries, omitted_through=omitted)


def turn_reference(ref: TranscriptRef, message_seq: int, partition: int, offset: int
                   ) -> dict[str, Any]:
    """The positions a turn reads (as ``TranscriptIndex.reference`` names them) from what its
    ``TurnOpened`` names and where that record is itself."""
    return {"partition": partition,
            "summary": None if ref.summary is None else list(ref.summary),
            "entries": [*ref.entries, (message_seq, offset)],  # (seq, offset) pairs as read
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
