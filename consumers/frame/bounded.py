"""The worker's tables, whose changelog records stay under the record bound.

Faust writes every table value to the table's changelog topic from its own producer buffer;
a value over the broker's ``max.message.bytes`` is not refused where it is set but later, in
that buffer, and the error stops the whole worker (``MessageSizeTooLargeError``). So a table
value's size is checked where it is set: ``BoundedTable.on_key_set`` measures the changelog
record exactly as Faust will encode it and raises ``RecordTooLarge`` before anything is stored
or sent. The caller's record fails (and is dead-lettered, decision 0008); the worker goes on.

Tables are kept small by design (positions rather than content, bounded memories): this is
the backstop that turns a design mistake into one failed record instead of a stopped service.

A value stored is in the table at once. In a table made ``held_back`` (the workflow runtime's),
its changelog record (and a deleted key's tombstone) is held back where the worker's app holds
them (``consumers.frame.write_behind``) and sent before a commit covers the record that wrote
it, so a workflow written at its start and at its end within the linger is sent once.

Values are JSON by Faust's codec, which is orjson's (``orjson`` is a dependency: the standard
library's encoder took 7 % of the worker's loop on a conversation's state). Keys keep the
standard library's bytes (``TABLE_KEYS``): a changelog is compacted by key bytes.
"""

from __future__ import annotations

import json
from typing import Any

import faust
from faust.serializers import codecs
from faust.streams import current_event

from streams.producer import RecordTooLarge

DEFAULT_MAX_BYTES = 900_000
"""``VOICE_MAX_RECORD_BYTES``'s default; ``WorkerContext.table`` sets the configured one."""


class StableKeys(codecs.Codec):  # type: ignore[misc]  # Faust's classes are untyped
    """A table key as the standard library's JSON writes it (non-ASCII escaped), whichever
    library Faust picks for values (orjson, which writes UTF-8).

    Kafka compacts a changelog by the key's bytes, and a delete is a tombstone under them. A
    key written two ways (``"\\u00e9"`` by a worker before orjson, ``"é"`` after) would leave
    the older value beside the newer tombstone: compaction keeps it, and a recovering worker
    brings the deleted key back. So a key must encode to the same bytes in every version.
    """

    def _dumps(self, obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def _loads(self, s: bytes) -> Any:
        return json.loads(s)


TABLE_KEYS = StableKeys()
"""Every table's key serializer (``WorkerContext.table``)."""


def changelog_key(table: Any, key: Any) -> bytes:
    """``key`` in the changelog, encoded as the table encodes it."""
    return codecs.dumps(table.key_serializer or "json", key) or b""


def changelog_record(table: Any, key: Any, value: Any) -> tuple[bytes, bytes]:
    """The changelog record of ``key → value`` (key and value bytes), encoded as the table
    encodes them."""
    value_bytes = codecs.dumps(table.value_serializer or "json", value)
    return changelog_key(table, key), value_bytes or b""


class BoundedTable(faust.Table):  # type: ignore[misc]  # Faust's classes are untyped
    """A Faust table that refuses a value whose changelog record would be over ``max_bytes``,
    and holds its changelog records back where its app does (``write_behind``)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    held_back: bool = False
    """Whether its changelog records are held back where the app holds them (``WorkerContext.
    table``): the workflow runtime's table, not an aggregate's."""

    def on_key_set(self, key: Any, value: Any) -> None:
        """Encode the changelog record once, check its size, then store and send those bytes
        as ``faust.Table.on_key_set`` sends the value (which would encode it again: a long
        conversation's state is tens of kilobytes, written twice a turn)."""
        key_bytes, value_bytes = changelog_record(self, key, value)
        size = len(key_bytes) + len(value_bytes)
        if size > self.max_bytes:
            raise RecordTooLarge(self.changelog_topic.get_topic_name(), size, self.max_bytes,
                                 key=key)
        partition = self._changelog(key_bytes, value_bytes, self.partition_for_key(key))
        self._maybe_set_key_ttl(key, partition)
        self._sensor_on_set(self, key, value)

    def on_key_del(self, key: Any) -> None:
        """A tombstone, held (or sent) as a value is: never overtaken by a held value."""
        partition = self._changelog(changelog_key(self, key), None, self.partition_for_key(key))
        self._maybe_del_key_ttl(key, partition)
        self._sensor_on_del(self, key)

    def _changelog(self, key: bytes, value: bytes | None, partition: int | None) -> int:
        """Hold the changelog record where the app holds writes, else send it; its
        partition."""
        held = getattr(self.app, "write_behind", None) if self.held_back else None
        if held is not None and held.holds and partition is not None:
            event = current_event()
            cause = None if event is None else (event.message.tp, event.message.offset)
            held.hold(self, partition, key, value, cause)
            return partition
        fut = self.send_changelog(partition, key, value, key_serializer="raw",
                                  value_serializer="raw")
        sent = fut.message.partition
        assert sent is not None
        return int(sent)
