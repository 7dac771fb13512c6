"""Decode a raw Kafka record or dead-letter it: the one place consumers turn bytes into records.

A consumer never dies of one record: anything ``decode`` refuses — or a decoded record its
consumer cannot handle (``dead_letter``) — goes to ``<topic>.dlq`` with the reason and its
origin (``topic[partition]@offset``) in headers (``streams.dead_letters``, the one way any
consumer dead-letters), and the caller moves on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from streams.dead_letters import DLQ_VALUE_KEPT, send_dead_letter
from streams.envelope import DecodeError, Envelope, decode, encode
from streams.producer import RecordProducer

log = logging.getLogger(__name__)

__all__ = ["DLQ_VALUE_KEPT", "dead_letter", "decode_or_dead_letter", "decode_or_none"]


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
    await send_dead_letter(producer, topic, partition, offset, key, value, headers, reason)
    return None


async def dead_letter(producer: RecordProducer, topic: str, env: Envelope, reason: str,
                      partition: int | None = None, offset: int | None = None) -> None:
    """Produce a decoded record that could not be handled to ``<topic>.dlq`` (and await it)."""
    log.warning("dead-lettering %s[%s]@%s (%s): %s", topic, partition, offset, env.id, reason)
    key, value, headers = encode(env)
    await send_dead_letter(producer, topic, partition, offset, key, value, headers, reason)


def decode_or_none(key: bytes | None, value: bytes | None,
                   headers: Sequence[tuple[str, bytes | None]] | None) -> Envelope | None:
    """The envelope, or ``None`` for a record another agent of the topic dead-letters."""
    try:
        return decode(key, value, headers)
    except DecodeError:
        return None
