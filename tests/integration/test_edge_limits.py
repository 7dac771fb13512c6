"""The edge's limits against a real broker: a record over ``VOICE_MAX_RECORD_BYTES`` is
refused at the edge and never reaches the broker, which refuses records over its own
``max.message.bytes``; with the broker gone the edge answers 503 with ``Retry-After`` within
the gateway bound, and records again once it is back."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from confluent_kafka.admin import ConfigResource

from deploy.kafka_local import LocalKafka, free_port
from streams.producer import ProduceError, RecordProducer
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import DATASETS, admin_client, topic_name
from tests.support import read_all, settings_with_topics, spawn_voice, stop, wait_http_ready

pytestmark = pytest.mark.integration

FILES = "/api/v1/assistant/files"


def csv_of(size: int) -> bytes:
    row = b"Bayou Solvents,LA,30.1,-91.2,RCRA\n"
    return b"name,state,lat,lon,program\n" + row * (size // len(row))


def upload(url: str, settings: VoiceSettings, data: bytes) -> httpx.Response:
    token = mint_token(settings, "alice", "participant")
    return httpx.post(f"{url}{FILES}", files={"file": ("f.csv", data, "text/csv")},
                      headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_a_record_over_the_limit_is_413_and_never_reaches_the_broker(
        settings: VoiceSettings, start_edge: Callable[..., str]) -> None:
    url = start_edge(VOICE_MAX_RECORD_BYTES=str(64 * 1024))
    big = upload(url, settings, csv_of(100 * 1024))  # within VOICE_MAX_UPLOAD_BYTES
    assert big.status_code == 413, big.text
    assert "VOICE_MAX_RECORD_BYTES" in big.json()["detail"] and "65536" in big.json()["detail"]
    assert read_all(settings, topic_name(settings, DATASETS)) == []  # never attempted
    small = upload(url, settings, csv_of(10 * 1024))
    assert small.status_code == 201, small.text
    (rec,) = read_all(settings, topic_name(settings, DATASETS))
    assert rec.key().decode() == small.json()["dataset_id"]


def test_the_broker_refuses_what_the_default_limit_keeps_out(settings: VoiceSettings) -> None:
    topic = topic_name(settings, DATASETS)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = admin_client(settings)  # kept: its futures fail if the client is collected
    (configs,) = admin.describe_configs([resource]).values()
    broker_limit = int(configs.result(timeout=10)["max.message.bytes"].value)
    # The default leaves the batch framing and the writer's larger records room under it.
    assert settings.max_record_bytes + 64 * 1024 <= broker_limit

    async def produce(size: int) -> None:
        producer = RecordProducer(settings, **{"message.max.bytes": 4 * broker_limit})
        try:
            # Random bytes: the broker measures the batch as compressed.
            await producer.produce_raw(topic, b"k", os.urandom(size))
        finally:
            producer.close()

    with pytest.raises(ProduceError) as refused:  # a client that would send it anyway
        asyncio.run(produce(broker_limit + 1024))
    assert refused.value.too_large


def test_the_edge_answers_503_with_retry_after_while_the_broker_is_down(
        own_broker: LocalKafka, tmp_path: Path) -> None:
    settings = settings_with_topics(own_broker.bootstrap, tmp_path, gateway_bound_s=6.0)
    port = free_port()
    edge = spawn_voice(settings, "edge", "--port", str(port), log=tmp_path / "edge.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(f"{url}/readyz", proc=edge)
        assert upload(url, settings, csv_of(1024)).status_code == 201
        own_broker.stop()

        began = time.monotonic()
        down = upload(url, settings, csv_of(1024))
        assert down.status_code == 503, down.text
        assert time.monotonic() - began < settings.gateway_bound_s
        assert int(down.headers["Retry-After"]) > 0 and down.headers["X-Request-ID"]
        assert "broker" in down.json()["detail"] and "voice.datasets" not in down.text
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200  # alive, not stuck

        own_broker.start()
        deadline = time.monotonic() + 60
        while (status := upload(url, settings, csv_of(1024)).status_code) != 201:
            assert status == 503 and time.monotonic() < deadline
            time.sleep(1)
    finally:
        stop(edge)
