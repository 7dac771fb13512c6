"""The record-once log: an aggregate that appends each item to its key's log at most once,
deduplicated by the item's own id (not by the command's), with the next dense seq.

An inbox (one per recipient) and a review queue (one per tenant) are this and nothing more: a
step that re-runs after a crash submits the same item again — under another command id — and
changes nothing, because the item's id is derived from what it is (a notification, a queue
event), never from an attempt. A subclass names its command types, the record it appends (the
command's fields and ``at``, the command's time), the field both carry the item's id in, and
whether anybody waits on an answer.

The log remembers the last ``limit`` item ids per key; a redelivery older than that would be
recorded again, so readers also dedupe by the item's id. ``decide`` stays pure, like every
aggregate's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from consumers.frame.aggregate import Ack, Aggregate, AggregateState, Decision, append, remember
from schemas.base import Record
from streams.envelope import Envelope

__all__ = ["RecordOnceLog", "RecordOnceState"]


@dataclass(kw_only=True)
class RecordOnceState(AggregateState):
    """What a record-once log keeps per key (a Faust table value, as a dict)."""

    recorded: dict[str, int] = field(default_factory=dict)
    """item id → the seq it got (insertion-ordered, bounded)."""


class RecordOnceLog(Aggregate[RecordOnceState]):
    """One item per id, in order, per key: subclass it and set the class attributes."""

    state = RecordOnceState
    recorded: ClassVar[type[Record]]
    """The record appended for an item: the command's fields, and ``at``."""
    item_id: ClassVar[str]
    """The field the commands and ``recorded`` carry the item's id in (its record id too)."""
    limit: ClassVar[int] = 4096
    """Item ids a key remembers (the oldest go first)."""
    answers: ClassVar[bool] = True
    """Whether someone waits on the answer (``False``: no acknowledgement is ever produced)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for type_ in (*cls.commands, cls.recorded):
            if cls.item_id not in type_.model_fields:
                raise TypeError(f"{cls.__name__}: {type_.__name__} has no item id field "
                                f"{cls.item_id!r}")

    def belongs(self, cmd: Envelope) -> bool:  # noqa: ARG002
        """Whether ``cmd`` is addressed to the log it is keyed by (a subclass whose key is
        derived from the command refuses a misrouted or forged one)."""
        return True

    def acknowledges(self, cmd: Envelope) -> bool:  # noqa: ARG002
        return self.answers

    def _item(self, record: Record) -> str:
        item: str = getattr(record, self.item_id)
        return item

    def remembered(self, state: RecordOnceState | None, cmd: Envelope) -> dict[str, Any] | None:
        # Deduped by the item's id, whichever command carried it.
        if state is None or not isinstance(cmd.record, self.commands):
            return None
        seq = state.recorded.get(self._item(cmd.record))
        return None if seq is None else {"seq": seq}

    def remember(self, state: RecordOnceState, cmd: Envelope,
                 memo: dict[str, Any]) -> None:  # noqa: ARG002 - the seq is the state's
        remember(state.recorded, self._item(cmd.record), state.seq, self.limit)

    def record_id(self, cmd: Envelope, seq: int, record: Record) -> str:  # noqa: ARG002
        return self._item(record)

    def decide(self, state: RecordOnceState | None, cmd: Envelope) -> Decision[RecordOnceState]:
        """Record one item in its key's log (answered with its seq where someone waits)."""
        if not isinstance(cmd.record, self.commands) or not self.belongs(cmd):
            # Not this log's (a misrouted or forged command): recorded nowhere.
            refused = Ack.rejected(f"not a command of this {self.what}: {cmd.type}")
            return Decision(state, ack=refused if self.answers else None)
        state = state or RecordOnceState()
        records = append(state, self.recorded(**cmd.record.model_dump(),
                                              at=cmd.time.isoformat()))
        return Decision(state, records, Ack.accepted(state.seq) if self.answers else None)
