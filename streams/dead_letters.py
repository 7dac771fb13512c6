"""The one way any Voice consumer dead-letters a record: ``<topic>.dlq``, reason in headers.

The record goes as it came (key, value, its own headers) plus ``voice_dlq_reason`` and its
origin (``voice_dlq_topic``/``_partition``/``_offset``, see ``streams.producer.dlq_headers``),
and the call returns once the broker has it. A record too large for the dead-letter topic is
kept there cut to ``DLQ_VALUE_KEPT`` bytes (or half the producer's record bound, if less), its
full length in the ``voice_dlq_truncated`` header: the reason and the origin always arrive.

The worker (``consumers.intake``, ``consumers.frame.failures``) and the telemetry sink use it;
nothing else produces to a ``.dlq`` topic. A failure here is raised to the caller, which must
then not commit the record (see ``docs/decisions/0008-consumer-failures.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from confluent_kafka import KafkaException

from streams.producer import ProduceError, RecordProducer, dlq_headers
from streams.topics import dlq_name

log = logging.getLogger(__name__)

DLQ_VALUE_KEPT = 64 * 1024
"""Bytes of a too-large record's value its dead letter keeps."""


async def send_dead_letter(producer: RecordProducer, topic: str, partition: int | None,
                           offset: int | None, key: bytes | None, value: bytes | None,
                           headers: Sequence[tuple[str, bytes | None]] | None,
                           reason: str) -> None:
    """Produce one record of ``topic`` to ``<topic>.dlq`` with ``reason``; await the broker."""
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
