"""A worker's fetch is held by the broker at most ``VOICE_WORKER_FETCH_WAIT_MS`` (issue 14,
thirty-eighth pass): Faust makes its aiokafka consumer with a fixed 1,500 ms, and under a full
load every turn of a worker stalled for that long at once, several times a run."""

from __future__ import annotations

import asyncio

from consumers.frame.handover import VoiceApp
from streams.settings import VoiceSettings


async def _made_wait(**kwargs: object) -> int:
    app = VoiceApp("fetch-wait-test", broker="kafka://127.0.0.1:1", store="memory://",
                   web_enabled=False, **kwargs)
    consumer = app.consumer
    kafka = consumer._thread._create_worker_consumer(app.transport)
    try:
        return int(kafka._fetch_max_wait_ms)
    finally:
        await asyncio.sleep(0)


async def test_the_worker_consumer_is_made_with_the_wait_asked_for() -> None:
    assert await _made_wait(fetch_wait_ms=123) == 123


async def test_without_one_it_is_fausts_own() -> None:
    assert await _made_wait() == 1500


def test_the_setting_and_its_default() -> None:
    assert VoiceSettings().worker_fetch_wait_ms == 1500
    assert VoiceSettings(worker_fetch_wait_ms=50).worker_fetch_wait_ms == 50


async def test_the_workers_app_takes_it_from_the_settings() -> None:
    from consumers.frame.context import faust_app

    app = faust_app(VoiceSettings(kafka_bootstrap="127.0.0.1:1", worker_fetch_wait_ms=77))
    kafka = app.consumer._thread._create_worker_consumer(app.transport)
    assert kafka._fetch_max_wait_ms == 77
