"""``streams.reading``: reading a topic to its end survives the broker's momentary answers."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streams.reading import end_offset


class Flaky:
    """A consumer whose watermark query fails with ``errors`` first, then answers 7."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.calls = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        self.calls += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 0, 7


def test_a_new_topics_not_leader_answer_is_asked_again() -> None:
    """Regression: right after its topic was created, test_spine's read failed on
    NOT_LEADER_FOR_PARTITION (a loaded machine; the leader was still being elected)."""
    c = Flaky(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)
    assert end_offset(c, TopicPartition("t", 0), timeout=10) == 7  # type: ignore[arg-type]
    assert c.calls == 3


def test_a_lasting_error_is_raised() -> None:
    c = Flaky(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        end_offset(c, TopicPartition("t", 0), timeout=10)  # type: ignore[arg-type]
    assert c.calls == 1
