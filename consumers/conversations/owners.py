"""The index of conversations by owner (``voice.owners``, decision 0015), written from the log.

The worker's reader of ``voice.conversations`` hands each record to ``IndexWriter.take``: a
``ConversationStarted`` gives its ``ConversationIndexed`` (``index_record``), produced without
holding the reader up, and the conversation record is acknowledged only once the broker has
the entry — so a worker lost before that leaves the record to the next one, which writes the
entry again, and none is ever lost (at least once: the index is a set, and the entry's id is
derived from the started record's, so a reader can tell the same entry twice). A produce that
fails is tried again, backing off as the worker's consumers do (``RetryPolicy.delay``,
``VOICE_CONSUMER_RETRY_*``), until it goes (the record's commit waits meanwhile).
``voice owners backfill`` (``deploy.owners``) writes the same entries for conversations
started before the index.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from schemas.conversation import ConversationIndexed, ConversationStarted
from streams.crashpoints import CrashPoints
from streams.envelope import Envelope
from streams.free_text import describe
from streams.ids import owner_key
from streams.producer import Publisher
from streams.retry import RetryPolicy
from streams.topics import OWNERS

log = logging.getLogger(__name__)

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


class IndexWriter:
    """Writes each started conversation's entry; acknowledges its log record once written."""

    def __init__(self, publisher: Publisher, backoff: RetryPolicy | None = None,
                 crash: CrashPoints | None = None) -> None:
        """``backoff``: the waits between produces of one entry (its ``attempts`` do not
        apply: an entry is tried until it goes)."""
        self.publisher = publisher
        self.backoff = backoff or RetryPolicy()
        self.crash = crash or CrashPoints()

    def take(self, env: Envelope, ack: Callable[[], None]) -> bool:
        """For a ``ConversationStarted``: produce its entry and call ``ack`` once the broker
        has it (trying again until then); True. Any other record: False (``ack`` is the
        caller's). Never waits."""
        indexed = index_record(env)
        if indexed is None:
            return False
        self.crash.hit("before_index", env.key)
        self._send(indexed, ack, 0)
        return True

    def _send(self, indexed: Envelope, ack: Callable[[], None], attempt: int) -> None:
        try:
            fut = self.publisher.produce(OWNERS, indexed)
        except Exception as exc:  # refused at once (the client's queue, a closed producer)
            self._again(indexed, ack, attempt, exc)
            return
        fut.add_done_callback(lambda f: self._sent(f, indexed, ack, attempt))

    def _sent(self, fut: asyncio.Future[object], indexed: Envelope, ack: Callable[[], None],
              attempt: int) -> None:
        exc = asyncio.CancelledError() if fut.cancelled() else fut.exception()
        if exc is None:
            ack()
        else:
            self._again(indexed, ack, attempt, exc)

    def _again(self, indexed: Envelope, ack: Callable[[], None], attempt: int,
               exc: BaseException) -> None:
        delay = self.backoff.delay(attempt + 1)
        log.warning("the index entry of conversation %s was not written (%s); trying again "
                    "in %.1f s", indexed.subject, describe(exc), delay)
        asyncio.get_running_loop().call_later(delay, self._send, indexed, ack, attempt + 1)
