"""The producer's delivery reports reach each event loop in batches (one hop per ``poll`` per
loop, not one per record), every future still settles on its own loop, in order, and one a
caller cancelled stays cancelled. No broker: the records time out against a closed port, so
every report is a failure the client makes itself."""

from __future__ import annotations

import asyncio
import threading

from streams.producer import ProduceError, RecordProducer
from streams.settings import VoiceSettings

RECORDS = 40


def producer() -> RecordProducer:
    settings = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1")
    return RecordProducer(settings, **{"message.timeout.ms": 300})


async def produce_and_wait(p: RecordProducer, hops: list[int]) -> list[BaseException]:
    """``RECORDS`` records from the running loop; the outcomes in produce order."""
    loop = asyncio.get_running_loop()
    real = loop.call_soon_threadsafe

    def counting(callback, *args, **kw):  # noqa: ANN001, ANN202 - the loop's own signature
        hops.append(len(args[0]) if args and isinstance(args[0], list) else 0)
        return real(callback, *args, **kw)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    futs = [p.produce_raw("voice.test", str(i).encode(), b"v") for i in range(RECORDS)]
    futs[3].cancel()
    done = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 30)
    assert all(f.get_loop() is loop for f in futs)
    return list(done)


async def test_reports_reach_two_loops_in_batches_and_every_future_settles() -> None:
    p = producer()
    try:
        mine: list[int] = []
        theirs: list[int] = []
        other: list[list[BaseException]] = []
        thread = threading.Thread(
            target=lambda: other.append(asyncio.run(produce_and_wait(p, theirs))))
        thread.start()
        outcomes = await produce_and_wait(p, mine)
        thread.join(30)
        for got, hops in ((outcomes, mine), (other[0], theirs)):
            assert isinstance(got[3], asyncio.CancelledError)
            failures = [o for i, o in enumerate(got) if i != 3]
            assert all(isinstance(o, ProduceError) for o in failures), failures
            assert all("'voice.test'" in str(o) for o in failures)
            assert sum(hops) == RECORDS and len(hops) < RECORDS  # batched, none lost
        assert p._thread.is_alive()
    finally:
        p._producer.purge()
        p.close(timeout=1)
