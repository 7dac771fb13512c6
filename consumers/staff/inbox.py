"""The inbox writer: the record-once log whose single writer appends each recipient's inbox
(``voice.inbox``).

A notification's id (``{development}:{recipient}``) is its command's id and its inbox record's
id; the writer records each id at most once and gives it the next dense per-recipient seq, which
is the inbox stream's ``id:``. An update-delivery step that re-runs after a crash submits the
same ids again and changes nothing (``consumers.frame.record_once``: dedupe, seq, the bound).
"""

from __future__ import annotations

from consumers.frame.record_once import RecordOnceLog
from schemas.staff import DeliverNotification, NotificationRecorded
from streams.topics import INBOX

__all__ = ["MAX_NOTIFICATIONS", "InboxWriter"]

SOURCE = "/voice/inbox-writer"
MAX_NOTIFICATIONS = 4096
"""Notification ids an inbox remembers (an inbox sees many more ids than an issue commands)."""


class InboxWriter(RecordOnceLog):
    """Inboxes: each notification recorded once, in order, per recipient."""

    name = "staff_inboxes"
    what = "inbox"
    log = INBOX
    source = SOURCE
    commands = (DeliverNotification,)
    recorded = NotificationRecorded
    item_id = "notification"
    limit = MAX_NOTIFICATIONS
