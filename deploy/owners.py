"""``voice owners backfill``: the index by owner for conversations started before it.

The worker writes a conversation's index entry (``voice.owners``, decision 0015) as it reads
the conversation's ``ConversationStarted`` (``consumers.conversations.owners``); its group had
committed past the conversations started before that, so it never reads them again. This reads
``voice.conversations`` from its beginning to its end once, decodes only the records whose
``ce_type`` header is ``ConversationStarted``'s, and produces the same entry for each — the
index is a set, so running it twice, or beside the worker, changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from consumers.conversations.owners import index_record
from schemas.conversation import ConversationStarted
from streams.envelope import DecodeError, decode
from streams.producer import Publisher, RecordProducer
from streams.reading import read_batches
from streams.settings import VoiceSettings
from streams.topics import CONVERSATIONS, OWNERS, topic_name

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 3600.0
"""The longest the read of the whole conversation log may take."""


@dataclass
class Backfilled:
    read: int = 0
    """Records of the conversation log read (by header only, but for the ones indexed)."""
    indexed: int = 0
    """Index entries written (one a conversation started)."""
    skipped: int = 0
    """``ConversationStarted`` records that could not be decoded (their writer dead-lettered
    them; nothing to index)."""


def backfill(settings: VoiceSettings, timeout: float = READ_TIMEOUT_S) -> Backfilled:
    """Write the index entry of every conversation now on the log; what was done."""
    return asyncio.run(_backfill(settings, timeout))


async def _backfill(settings: VoiceSettings, timeout: float) -> Backfilled:
    done = Backfilled()
    started = ConversationStarted.ce_type.encode()
    producer = RecordProducer(settings)
    publisher = Publisher(settings, lambda: producer)
    try:
        for batch in read_batches(settings, topic_name(settings, CONVERSATIONS), timeout):
            done.read += len(batch)
            entries = []
            for msg in batch:
                if (dict(msg.headers() or ()).get("ce_type")) != started:
                    continue
                try:
                    env = decode(msg.key(), msg.value(), msg.headers())
                except DecodeError as exc:
                    log.warning("skipped %s[%s]@%s: %s", msg.topic(), msg.partition(),
                                msg.offset(), exc.reason)
                    done.skipped += 1
                    continue
                indexed = index_record(env)
                if indexed is not None:
                    entries.append((OWNERS, indexed))
            await publisher.send_all(entries)  # acknowledged before the next batch is read
            done.indexed += len(entries)
    finally:
        await asyncio.to_thread(producer.close)
    return done
