"""``voice tail``: decode a topic's records live into one line each."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

from streams.envelope import DecodeError, decode
from streams.fetch import READING
from streams.settings import VoiceSettings


def _show(value: Any) -> Any:
    """Sealed content is shown as sealed (key version only), never its ciphertext."""
    if isinstance(value, dict):
        if {"key_version", "nonce", "ciphertext"} <= value.keys():
            return f"<sealed v{value['key_version']}>"
        return {k: _show(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_show(v) for v in value]
    return value


def format_record(msg: Any) -> str:
    """One line: time, key, ce_type, seq, payload."""
    try:
        env = decode(msg.key(), msg.value(), msg.headers())
    except DecodeError as exc:
        ts = msg.timestamp()[1] / 1000
        return (f"{time.strftime('%H:%M:%S', time.localtime(ts))} "
                f"{(msg.key() or b'').decode(errors='replace')} UNDECODABLE {exc.reason}")
    payload = json.dumps(_show(env.record.model_dump(mode="json")), separators=(",", ":"))
    seq = "-" if env.seq is None else str(env.seq)
    return f"{env.time.isoformat(timespec='milliseconds')} {env.key} {env.type} seq={seq} {payload}"


def tail_topic(settings: VoiceSettings, topic: str, from_beginning: bool = False,
               max_records: int = 0, idle_exit: float = 0.0) -> Iterator[str]:
    """Yield formatted records of every partition of ``topic`` as they arrive."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap,
                         "group.id": f"voice-tail-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, **READING})
    try:
        md = consumer.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            raise SystemExit(f"topic {topic!r} does not exist (voice topics list)")
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(topic, p, start) for p in t.partitions])
        seen, last = 0, time.monotonic()
        while True:
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                if idle_exit and time.monotonic() - last > idle_exit:
                    return
                continue
            last = time.monotonic()
            yield format_record(msg)
            seen += 1
            if max_records and seen >= max_records:
                return
    finally:
        consumer.close()
