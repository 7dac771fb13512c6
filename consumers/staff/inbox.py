"""The inbox writer: the single writer of each recipient's inbox (``voice.inbox``).

``apply_inbox`` is pure. A notification's id (``{development}:{recipient}``) is its command's
record id and its inbox record's id; the writer records each id at most once and gives it the
next dense per-recipient seq, which is the inbox stream's ``id:``. An update-delivery step that
re-runs after a crash submits the same ids again and changes nothing.

The writer remembers the last ``MAX_REMEMBERED`` ids per recipient; a redelivery older than
that would be recorded again, so readers also dedupe by notification id.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from consumers.staff.issues import Output, ack
from schemas.staff import DeliverNotification, NotificationRecorded
from streams.envelope import Envelope
from streams.topics import INBOX

SOURCE = "/voice/inbox-writer"
MAX_REMEMBERED = 4096


@dataclass
class InboxState:
    """What the writer keeps per recipient (a Faust table value, as a dict)."""

    seq: int = 0
    recorded: dict[str, int] = field(default_factory=dict)
    """notification id → the seq it got (insertion-ordered, bounded)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> InboxState:
        return cls() if d is None else cls(**copy.deepcopy(d))

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(asdict(self))


def apply_inbox(state: InboxState | None, cmd: Envelope) -> tuple[InboxState, list[Output]]:
    """Record one notification in its recipient's inbox, once; returns (state, outputs)."""
    state = copy.deepcopy(state) or InboxState()
    rec = cmd.record
    if not isinstance(rec, DeliverNotification):
        return state, [ack(cmd, "rejected", None, SOURCE, reason=f"not an inbox command: "
                                                                f"{cmd.type}")]
    if rec.notification in state.recorded:
        return state, [ack(cmd, "duplicate", state.recorded[rec.notification], SOURCE)]
    state.seq += 1
    state.recorded[rec.notification] = state.seq
    while len(state.recorded) > MAX_REMEMBERED:
        state.recorded.pop(next(iter(state.recorded)))
    record = NotificationRecorded(recipient=rec.recipient, notification=rec.notification,
                                  issue=rec.issue, development=rec.development, title=rec.title,
                                  body=rec.body, at=cmd.time.isoformat())
    env = Envelope(record=record, key=cmd.key, source=SOURCE, subject=cmd.key, seq=state.seq,
                   tenant=cmd.tenant, correlation=cmd.correlation, causation=cmd.id,
                   id=rec.notification, time=cmd.time)
    return state, [(INBOX, env), ack(cmd, "accepted", state.seq, SOURCE)]
