"""The bench's reader of the local broker's request counts, on a broker of its own with a JMX
port: each produce that waits for its ack is one ``Produce`` request, and the counts a unit
are worked out between two readings."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.broker_requests import BrokerRequests, per_unit, reading
from deploy.kafka_local import LocalKafka, check_java, free_port, port_open
from streams.producer import PRODUCER_CONFIG

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("javac") is None,
                                 reason="the reader is a single-file Java source: needs a JDK")]


@pytest.fixture
def jmx_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    broker = LocalKafka(data_dir=tmp_path / "kafka", port=free_port(), heap="512m",
                        jmx_port=free_port())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def test_each_awaited_produce_is_one_produce_request(jmx_broker: LocalKafka) -> None:
    assert jmx_broker.jmx_port is not None and port_open("127.0.0.1", jmx_broker.jmx_port)
    admin = AdminClient({"bootstrap.servers": jmx_broker.bootstrap})
    for f in admin.create_topics([NewTopic("counted", 3, 1)]).values():
        f.result(30)
    producer = Producer({**PRODUCER_CONFIG, "bootstrap.servers": jmx_broker.bootstrap})
    producer.produce("counted", b"warm", key=b"k")
    assert producer.flush(30) == 0
    reader = BrokerRequests.start(check_java(), jmx_broker.jmx_port)
    try:
        before = reader.read()
        for i in range(10):
            producer.produce("counted", b"x", key=f"k{i}".encode())
            assert producer.flush(30) == 0
        after = reading(reader)
    finally:
        reader.close()
    per_record = per_unit(before, after, 10)
    assert per_record is not None
    assert per_record["Produce"] == 1.0
    assert per_record["total"] >= 1.0

