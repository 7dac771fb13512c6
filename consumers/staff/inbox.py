"""The inbox writer: the aggregate whose single writer appends each recipient's inbox
(``voice.inbox``).

``InboxWriter.decide`` is pure. A notification's id (``{development}:{recipient}``) is its
command's id and its inbox record's id; the writer records each id at most once and gives it
the next dense per-recipient seq, which is the inbox stream's ``id:``. An update-delivery step
that re-runs after a crash submits the same ids again and changes nothing.

The writer remembers the last ``MAX_NOTIFICATIONS`` ids per recipient; a redelivery older than
that would be recorded again, so readers also dedupe by notification id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from consumers.frame import Ack, Aggregate, AggregateState, Decision, append, remember
from schemas.base import Record
from schemas.staff import DeliverNotification, NotificationRecorded
from streams.envelope import Envelope
from streams.topics import INBOX

SOURCE = "/voice/inbox-writer"
MAX_NOTIFICATIONS = 4096
"""Notification ids an inbox remembers (an inbox sees many more ids than an issue commands)."""


@dataclass(kw_only=True)
class InboxState(AggregateState):
    """What the writer keeps per recipient (a Faust table value, as a dict)."""

    recorded: dict[str, int] = field(default_factory=dict)
    """notification id → the seq it got (insertion-ordered, bounded)."""


class InboxWriter(Aggregate[InboxState]):
    """Inboxes: each notification recorded once, in order, per recipient."""

    name = "staff_inboxes"
    what = "inbox"
    state = InboxState
    log = INBOX
    source = SOURCE
    commands = (DeliverNotification,)

    def remembered(self, state: InboxState | None, cmd: Envelope) -> dict[str, Any] | None:
        # Deduped by notification id, whichever command carried it.
        rec = cmd.record
        if state is None or not isinstance(rec, DeliverNotification):
            return None
        seq = state.recorded.get(rec.notification)
        return None if seq is None else {"seq": seq}

    def remember(self, state: InboxState, cmd: Envelope, memo: dict[str, Any]) -> None:
        rec = cmd.record
        assert isinstance(rec, DeliverNotification)
        remember(state.recorded, rec.notification, memo["seq"], MAX_NOTIFICATIONS)

    def record_id(self, cmd: Envelope, seq: int, record: Record) -> str:  # noqa: ARG002
        assert isinstance(record, NotificationRecorded)
        return record.notification

    def decide(self, state: InboxState | None, cmd: Envelope) -> Decision[InboxState]:
        """Record one notification in its recipient's inbox."""
        rec = cmd.record
        if not isinstance(rec, DeliverNotification):
            return Decision(state, ack=Ack.rejected(f"not an inbox command: {cmd.type}"))
        state = state or InboxState()
        records = append(state, NotificationRecorded(
            recipient=rec.recipient, notification=rec.notification, issue=rec.issue,
            development=rec.development, title=rec.title, body=rec.body,
            at=cmd.time.isoformat()))
        return Decision(state, records, Ack.accepted(state.seq))
