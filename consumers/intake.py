"""Decode a raw Kafka record or dead-letter it: the one place consumers turn bytes into records.

A consumer never dies of one record: anything ``decode`` refuses — or a decoded record its
consumer cannot handle (``dead_letter``) — goes to ``<topic>.dlq`` with the reason and its
origin (``topic[partition]@offset``) in headers, and the caller moves on. A record too large
for the dead-letter topic is kept there cut to ``DLQ_VALUE_KEPT`` bytes, its full length in the
``voice_dlq_truncated`` header: the reason and the origin always arrive.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from confluent_kafka import KafkaException

from streams.envelope import DecodeError, Envelope, decode, encode
from streams.producer import ProduceError, RecordProducer, dlq_headers
from streams.topics import dlq_name

log = logging.getLogger(__name__)

DLQ_VALUE_KEPT = 64 * 1024
"""Bytes of a too-large record's value its dead letter keeps."""


async def _to_dlq(producer: RecordProducer, topic: str, key: bytes | None, value: bytes | None,
                  headers: Sequence[tuple[str, bytes | None]] | None, reason: str,
                  partition: int | None, offset: int | None) -> None:
    out = dlq_headers(headers, reason, topic, partition, offset)
    try:
        await producer.produce_raw(dlq_name(topic), key, value, out)
    except (ProduceError, KafkaException) as exc:
        too_large = getattr(exc, "too_large", False) or "size too large" in str(exc).lower()
        if not too_large or value is None:
            raise
        # Half the record bound leaves room for the key and headers whatever it is set to.
        kept = min(DLQ_VALUE_KEPT, getattr(producer, "max_bytes", 2 * DLQ_VALUE_KEPT) // 2)
        await producer.produce_raw(dlq_name(topic), key, value[:kept],
                                   [*out, ("voice_dlq_truncated", str(len(value)).encode())])


async def decode_or_dead_letter(
    producer: RecordProducer,
    topic: str,
    partition: int | None,
    offset: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
) -> Envelope | None:
    """The record's envelope, or ``None`` after it was produced to the DLQ (and acked)."""
    try:
        return decode(key, value, headers)
    except DecodeError as exc:
        reason = exc.reason
    log.warning("dead-lettering %s[%s]@%s: %s", topic, partition, offset, reason)
    await _to_dlq(producer, topic, key, value, headers, reason, partition, offset)
    return None


async def dead_letter(producer: RecordProducer, topic: str, env: Envelope, reason: str,
                      partition: int | None = None, offset: int | None = None) -> None:
    """Produce a decoded record that could not be handled to ``<topic>.dlq`` (and await it)."""
    log.warning("dead-lettering %s[%s]@%s (%s): %s", topic, partition, offset, env.id, reason)
    key, value, headers = encode(env)
    await _to_dlq(producer, topic, key, value, headers, reason, partition, offset)


def decode_or_none(key: bytes | None, value: bytes | None,
                   headers: Sequence[tuple[str, bytes | None]] | None) -> Envelope | None:
    """The envelope, or ``None`` for a record another agent of the topic dead-letters."""
    try:
        return decode(key, value, headers)
    except DecodeError:
        return None
