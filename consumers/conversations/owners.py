"""The index of conversations by owner (``voice.owners``, decision 0015), written from the log.

The worker's reader of ``voice.conversations`` hands each record here (``index_record``): a
``ConversationStarted`` gives its ``ConversationIndexed``, produced — and acknowledged by the
broker — before the conversation record is, so a crash between the two writes it again, never
loses it (at least once: the index is a set, and the record's id is derived from the started
record's, so a reader can tell the same entry twice). ``voice owners backfill``
(``deploy.owners``) writes the same records for conversations started before the index.
"""

from __future__ import annotations

from schemas.conversation import ConversationIndexed, ConversationStarted
from streams.envelope import Envelope
from streams.ids import owner_key

SOURCE = "/voice/owners"


def index_record(env: Envelope) -> Envelope | None:
    """The index record of a conversation's ``ConversationStarted`` (None for any other)."""
    rec = env.record
    if not isinstance(rec, ConversationStarted):
        return None
    return Envelope(record=ConversationIndexed(conversation=rec.conversation, owner=rec.owner),
                    key=owner_key(env.tenant, rec.owner), source=SOURCE,
                    subject=rec.conversation, tenant=env.tenant, correlation=env.correlation,
                    causation=env.id, id=f"{env.id}:indexed", time=env.time)
