"""A seek runs on the consumer's thread (issue 14, thirteenth pass).

From the worker's event loop aiokafka's ``seek`` raced its fetch on the consumer's thread and
killed Faust's fetcher (``KeyError`` in ``Fetcher.fetched_records``). Drives the real Faust
consumer of a ``VoiceApp`` (not started) whose consumer thread runs its own loop and Faust's
own method queue, as in a worker, with an aiokafka stand-in that notes which thread seeks.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from faust.types import TP

from consumers.frame.handover import VoiceApp

TP0 = TP("t.voice.conversations", 0)


class Kafka:
    """``AIOKafkaConsumer.seek``, noting the thread it runs on."""

    def __init__(self) -> None:
        self.seeks: list[tuple[TP, int, int]] = []

    def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset, threading.get_ident()))

    async def stop(self) -> None:
        pass


async def test_every_seek_runs_on_the_consumers_thread_and_moves_the_read_offset() -> None:
    app = VoiceApp("thread-seek-test", broker="kafka://127.0.0.1:1", store="memory://",
                   web_enabled=False)
    consumer = app.consumer
    kafka = Kafka()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    delegate: Any = consumer._thread
    delegate.thread_loop = loop
    delegate.parent_loop = asyncio.get_running_loop()
    delegate._consumer = kafka
    try:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            delegate.on_thread_started(), loop))
        await asyncio.wait_for(consumer.seek(TP0, 854), 5)
        assert [(tp, offset) for tp, offset, _ in kafka.seeks] == [(TP0, 854)]
        assert kafka.seeks[0][2] == thread.ident != threading.get_ident()
        assert consumer._read_offset[TP0] == 854
    finally:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            delegate.on_thread_stop(), loop))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
