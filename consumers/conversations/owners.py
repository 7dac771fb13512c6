"""The index of conversations by owner (``voice.owners``, decision 0015): each started
conversation's entry.

A ``ConversationStarted`` gives its ``ConversationIndexed`` (``index_record``), whose id is
derived from the started record's, so a reader can tell the same entry twice (the index is a
set). The conversation's writer produces it once the ``ConversationStarted`` is on the log and
before it writes the conversation's state (``consumers.conversations.follow_ups``, decision
0016): a worker lost in between decides the command again and writes the same entry, so none
is ever lost. ``voice owners backfill`` (``deploy.owners``) writes the same entries for
conversations started before the index.
"""

from __future__ import annotations

from schemas.conversation import ConversationIndexed, ConversationStarted
from streams.envelope import Envelope
from streams.ids import owner_key

SOURCE = "/voice/owners"


def index_record(env: Envelope) -> Envelope | None:
    """The index entry of a conversation's ``ConversationStarted`` (None for any other)."""
    rec = env.record
    if not isinstance(rec, ConversationStarted):
        return None
    return Envelope(record=ConversationIndexed(conversation=rec.conversation, owner=rec.owner),
                    key=owner_key(env.tenant, rec.owner), source=SOURCE,
                    subject=rec.conversation, tenant=env.tenant, correlation=env.correlation,
                    causation=env.id, id=f"{env.id}:indexed", time=env.time)
