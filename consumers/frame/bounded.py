"""The worker's tables, whose changelog records stay under the record bound.

Faust writes every table value to the table's changelog topic from its own producer buffer;
a value over the broker's ``max.message.bytes`` is not refused where it is set but later, in
that buffer, and the error stops the whole worker (``MessageSizeTooLargeError``). So a table
value's size is checked where it is set: ``BoundedTable.on_key_set`` measures the changelog
record exactly as Faust will encode it and raises ``RecordTooLarge`` before anything is stored
or sent. The caller's record fails (and is dead-lettered, decision 0008); the worker goes on.

Tables are kept small by design (positions rather than content, bounded memories): this is
the backstop that turns a design mistake into one failed record instead of a stopped service.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.serializers import codecs

from streams.producer import RecordTooLarge

DEFAULT_MAX_BYTES = 900_000
"""``VOICE_MAX_RECORD_BYTES``'s default; ``WorkerContext.table`` sets the configured one."""


def changelog_record(table: Any, key: Any, value: Any) -> tuple[bytes, bytes]:
    """The changelog record of ``key → value`` (key and value bytes), encoded as the table
    encodes them."""
    key_bytes = codecs.dumps(table.key_serializer or "json", key)
    value_bytes = codecs.dumps(table.value_serializer or "json", value)
    return key_bytes or b"", value_bytes or b""


class BoundedTable(faust.Table):  # type: ignore[misc]  # Faust's classes are untyped
    """A Faust table that refuses a value whose changelog record would be over ``max_bytes``."""

    max_bytes: int = DEFAULT_MAX_BYTES

    def on_key_set(self, key: Any, value: Any) -> None:
        """Encode the changelog record once, check its size, then store and send those bytes
        as ``faust.Table.on_key_set`` sends the value (which would encode it again: a long
        conversation's state is tens of kilobytes, written twice a turn)."""
        key_bytes, value_bytes = changelog_record(self, key, value)
        size = len(key_bytes) + len(value_bytes)
        if size > self.max_bytes:
            raise RecordTooLarge(self.changelog_topic.get_topic_name(), size, self.max_bytes,
                                 key=key)
        fut = self.send_changelog(self.partition_for_key(key), key_bytes, value_bytes,
                                  key_serializer="raw", value_serializer="raw")
        partition = fut.message.partition
        assert partition is not None
        self._maybe_set_key_ttl(key, partition)
        self._sensor_on_set(self, key, value)
