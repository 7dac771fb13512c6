"""The worker's follower of a whole topic (``consumers.frame.follow``) without a broker: which
records it applies, what it skips, and when ``fresh`` answers (the broker path runs in
``tests/integration/test_catalog.py``)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import TopicPartition

from consumers.frame import follow
from consumers.frame.follow import Follower
from schemas.staff import FollowerAdded, IssueOpened
from streams.envelope import Envelope, encode
from streams.fetch import LogEnds
from streams.settings import VoiceSettings
from streams.topics import ISSUES


class Msg:
    def __init__(self, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes]]) -> None:
        self._k, self._v, self._h = key, value, headers

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> list[tuple[str, bytes]]:
        return self._h

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7


def msg(record: Any) -> Msg:
    key, value, headers = encode(Envelope(record=record, key="iss-0a0a0a0a", source="/t",
                                          seq=1, tenant="t1"))
    return Msg(key, value, headers)


def follower(applied: list[Envelope], types: frozenset[str] | None = None,
             fail: bool = False) -> Follower:
    def apply(env: Envelope) -> None:
        if fail:
            raise ValueError("boom")
        applied.append(env)

    return Follower(VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1"), ISSUES, apply,
                    "test", types)


def test_only_the_named_types_are_decoded_and_bad_records_are_skipped() -> None:
    applied: list[Envelope] = []
    f = follower(applied, types=frozenset({IssueOpened.ce_type}))
    f._handle(msg(IssueOpened(issue="iss-0a0a0a0a", title="t", summary="", by="s", at="a")))
    f._handle(msg(FollowerAdded(issue="iss-0a0a0a0a", participant="p")))
    assert [type(e.record) for e in applied] == [IssueOpened] and f.skipped == 0
    f._handle(Msg(b"k", b"not a record", [("ce_type", IssueOpened.ce_type.encode())]))
    assert f.skipped == 1
    failing = follower([], fail=True)
    failing._handle(msg(FollowerAdded(issue="iss-0a0a0a0a", participant="p")))
    assert failing.skipped == 1


class FakeConsumer:
    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends
        self.at = {p: -1001 for p in ends}

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, self.ends[tp.partition]

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.at[tp.partition]) for tp in tps]


def test_fresh_answers_once_every_record_there_when_asked_is_applied() -> None:
    f = follower([])
    f._thread = threading.current_thread()  # started: fresh() must not start a thread
    consumer = FakeConsumer({0: 3, 1: 0, 2: 5})
    asked = threading.Event()
    f._asked.append(asked)
    f._answer(consumer, [0, 1, 2])
    assert not asked.is_set()
    consumer.ends = {0: 9, 1: 9, 2: 9}  # records produced after the question do not count
    consumer.at = {0: 3, 1: -1001, 2: 4}
    f._answer(consumer, [0, 1, 2])
    assert not asked.is_set()
    consumer.at[2] = 5
    f._answer(consumer, [0, 1, 2])
    assert asked.is_set() and f._waiting == []


def test_fresh_answers_at_once_when_the_follower_has_applied_where_the_topic_ends() -> None:
    # The caller asks where the topic ends itself; a follower already there is not waited for
    # (the wait for its next poll was most of a turn in turn.overhead).
    f = follower([])
    f._thread = threading.current_thread()
    f.ends = lambda timeout: {0: 3, 1: 0, 2: 5}  # type: ignore[method-assign]
    f._applied = {0: 3, 2: 5}
    started = time.monotonic()
    assert f.fresh(5.0) is True
    assert time.monotonic() - started < 1.0 and f._waiting == [] and f._asked == []


def test_fresh_waits_for_a_follower_behind_until_its_thread_has_applied_that_far() -> None:
    f = follower([])
    f._thread = threading.current_thread()
    f.ends = lambda timeout: {0: 3, 1: 0}  # type: ignore[method-assign]
    f._applied = {0: 2}
    assert f.fresh(0.05) is False  # behind, and nothing applies more: it times out
    consumer = FakeConsumer({0: 3, 1: 0})
    consumer.at = {0: 3, 1: -1001}
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.append(f.fresh(10.0)))
    waiter.start()
    deadline = time.monotonic() + 10
    while len(f._waiting) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    f._answer(consumer, [0, 1])  # the thread's pass after the record at offset 2 was applied
    waiter.join(10)
    assert answers == [True] and f._waiting == []


def test_fresh_falls_back_to_the_thread_when_the_ends_cannot_be_asked() -> None:
    f = follower([])
    f._thread = threading.current_thread()

    def down(timeout: float) -> dict[int, int]:
        raise OSError("broker down")

    f.ends = down  # type: ignore[method-assign]
    assert f.fresh(0.01) is False and len(f._asked) == 1


class FakeAdmin:
    """Just what ``Follower.ends`` asks an admin client: the topic's partitions, their ends."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic, self.partitions = topic, partitions
        self.metadata_asked = 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.metadata_asked += 1
        meta = SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.partitions)))
        return SimpleNamespace(topics={self.topic: meta})

    def list_offsets(self, asked: dict, request_timeout: float) -> dict:
        done: dict = {}
        for tp in asked:
            fut: Future = Future()
            fut.set_result(SimpleNamespace(offset=10 + tp.partition))
            done[tp] = fut
        return done


def test_ends_looks_the_partitions_up_once_not_on_every_call() -> None:
    # Regression (issue 14, fourth pass): a metadata request on every ``fresh`` was one more
    # broker request per turn; the partitions are looked up again only after a while.
    f = follower([])
    admin = FakeAdmin(f.topic, 3)
    f._ends_now = LogEnds("127.0.0.1:1", make=lambda config: admin)  # type: ignore[arg-type]
    assert f.ends(1.0) == {0: 10, 1: 11, 2: 12}
    assert f.ends(1.0) == {0: 10, 1: 11, 2: 12}
    assert admin.metadata_asked == 1
    admin.partitions = 4  # a partition added: seen once the lookup is old enough
    f._partitions_at -= follow.PARTITIONS_FRESH_S + 1
    assert f.ends(1.0) == {0: 10, 1: 11, 2: 12, 3: 13}
    assert admin.metadata_asked == 2
