"""The edge's tail without a broker: records it cannot use (decision 0008) are skipped, logged
and counted, and the views keep applying the records after them; with a history window
(decision 0011) it starts the conversation log by time and is caught up at the window's end;
every partition is assigned at once at a concrete offset, so all are in its first fetch."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from api.frame.tail import EdgeTail
from schemas.conversation import ConversationStarted
from streams.envelope import Envelope, encode
from streams.settings import VoiceSettings
from streams.topics import ASSISTANT, ISSUES, topic_name

SETTINGS = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", topic_prefix="t.")


def record(seq: int, owner: str = "alice") -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    env = Envelope(record=ConversationStarted(conversation="cnv-1", owner=owner), key="cnv-1",
                   source="/test", seq=seq)
    return encode(env)


def test_a_record_a_view_cannot_apply_is_skipped_counted_and_the_tail_goes_on() -> None:
    applied: list[int] = []

    def on_conversation(env: Envelope) -> None:
        if env.record.owner == "poison":  # type: ignore[attr-defined]
            raise ValueError("impossible content for this view")
        applied.append(env.seq or 0)

    async def go() -> EdgeTail:
        tail = EdgeTail(SETTINGS, on_conversation=on_conversation,
                        more={ISSUES: lambda env: None})
        tail._loop = asyncio.get_running_loop()  # what start() sets; no thread here
        conv = "t.voice.conversations"
        # One poll's records, handed over to the loop at once.
        tail._hand_over([(conv, 0, 0, *record(1)),
                         (conv, 0, 1, b"k", b"\xff", []),             # undecodable
                         (conv, 0, 2, *record(2, owner="poison")),    # the view raises
                         (conv, 0, 3, *record(3))])
        tail._hand_over([("t.voice.issues", 1, 5, b"k", b"\x00", None)])
        tail._hand_over([])                                          # an empty poll: nothing
        await asyncio.sleep(0)
        return tail

    before = time.monotonic()
    tail = asyncio.run(go())
    assert applied == [1, 3]
    assert tail.applied_at >= before  # when the loop last applied records: idle since
    assert tail.skipped_counts() == {
        "t.voice.conversations": {"not applied": 1, "undecodable": 1},
        "t.voice.issues": {"undecodable": 1}}


class WindowConsumer:
    """Just what the window asks a consumer: offsets by time and the logs' ends."""

    def __init__(self, found: dict[int, int], high: int) -> None:
        self.found, self.high = found, high
        self.asked_ms: list[int] = []

    def offsets_for_times(self, tps: list, timeout: float) -> list:
        self.asked_ms = [tp.offset for tp in tps]
        return [TopicPartition(tp.topic, tp.partition, self.found[tp.partition]) for tp in tps]

    def get_watermark_offsets(self, tp, timeout: float) -> tuple[int, int]:  # noqa: ANN001
        return 0, self.high

    def position(self, tps: list) -> list:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in tps]  # nothing read


def test_a_window_starts_the_conversation_log_by_time_and_is_caught_up_at_its_end() -> None:
    settings = SETTINGS.model_copy(update={"edge_history_s": 60.0})
    tail = EdgeTail(settings, on_conversation=lambda env: None)
    conv = tail.conv_topic
    consumer = WindowConsumer({0: 40, 1: -1}, high=90)  # partition 1: nothing that recent
    parts = [TopicPartition(conv, 0, OFFSET_BEGINNING), TopicPartition(conv, 1, OFFSET_BEGINNING),
             TopicPartition("t.voice.acks", 0, -1)]
    marks = {(conv, 0): (0, 90), (conv, 1): (0, 90)}
    assigned = tail._windowed(consumer, parts, marks)  # type: ignore[arg-type]
    assert {(tp.topic, tp.partition): tp.offset for tp in assigned} == {
        (conv, 0): 40, (conv, 1): 90, ("t.voice.acks", 0): -1}
    assert tail.starts == {(conv, 0): 40, (conv, 1): 90}
    assert all(abs(ms / 1000 - (time.time() - 60)) < 5 for ms in consumer.asked_ms)
    # Caught up: partition 1 starts at its end (nothing to read, no position yet); partition
    # 0 has 50 records to read first.
    tail._check_caught_up(consumer, {(conv, 0): 90, (conv, 1): 90})  # type: ignore[arg-type]
    assert not tail.caught_up.is_set()
    tail._check_caught_up(consumer, {(conv, 1): 90})  # type: ignore[arg-type]
    assert tail.caught_up.is_set()


def test_a_window_starts_the_assistant_log_by_time_too_and_only_with_a_window() -> None:
    settings = SETTINGS.model_copy(update={"edge_history_s": 60.0})
    tail = EdgeTail(settings, on_conversation=lambda env: None, windowed=(ASSISTANT,))
    conv, chats = tail.conv_topic, topic_name(settings, ASSISTANT)
    consumer = WindowConsumer({0: 40}, high=90)
    parts = [TopicPartition(conv, 0, 0), TopicPartition(chats, 0, 0),
             TopicPartition("t.voice.workflows", 0, 0)]
    marks = {(conv, 0): (0, 90), (chats, 0): (0, 90)}
    assigned = tail._windowed(consumer, parts, marks)  # type: ignore[arg-type]
    assert {(tp.topic, tp.partition): tp.offset for tp in assigned} == {
        (conv, 0): 40, (chats, 0): 40, ("t.voice.workflows", 0): 0}
    assert tail.starts == {(conv, 0): 40, (chats, 0): 40}
    # Without a window, the assistant's log is read from its start like any other.
    assert EdgeTail(SETTINGS, on_conversation=lambda env: None,
                    windowed=(ASSISTANT,)).windowed == {tail.conv_topic}


class AssignConsumer:
    """Just what ``_assign`` asks a consumer: the topics, each log's start and end, assign."""

    def __init__(self, partitions: dict[str, int], marks: dict[tuple[str, int], tuple[int, int]]
                 ) -> None:
        self.partitions, self.marks = partitions, marks
        self.assigned: list[list[TopicPartition]] = []

    def list_topics(self, timeout: float) -> SimpleNamespace:
        return SimpleNamespace(topics={
            t: SimpleNamespace(error=None, partitions=dict.fromkeys(range(n)))
            for t, n in self.partitions.items()})

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return self.marks.get((tp.topic, tp.partition), (0, 0))

    def assign(self, parts: list[TopicPartition]) -> None:
        self.assigned.append(list(parts))


def test_every_partition_is_assigned_at_once_at_a_concrete_offset() -> None:
    """Regression (issue 14, fourth pass): the tail left OFFSET_BEGINNING / OFFSET_END to the
    client, which resolved them one partition at a time after the assignment; a partition
    resolved while a fetch was held joined only the next fetch, so the tail fetched every 5 ms
    to catch up quickly — ~40 % of the broker's CPU with nothing to read."""
    tail = EdgeTail(SETTINGS, on_conversation=lambda env: None,
                    more={ISSUES: lambda env: None})
    issues = "t.voice.issues"
    consumer = AssignConsumer(
        {tail.conv_topic: 2, tail.acks_topic: 2, issues: 1},
        {(tail.conv_topic, 0): (0, 7), (tail.conv_topic, 1): (3, 9),  # 1: retention ran
         (tail.acks_topic, 0): (0, 40), (tail.acks_topic, 1): (5, 50), (issues, 0): (0, 2)})
    ends = tail._assign(consumer)  # type: ignore[arg-type]
    assert len(consumer.assigned) == 1  # one assignment, every partition in it
    at = {(tp.topic, tp.partition): tp.offset for tp in consumer.assigned[0]}
    assert at == {(tail.conv_topic, 0): 0, (tail.conv_topic, 1): 3,  # the logs' starts
                  (issues, 0): 0,
                  (tail.acks_topic, 0): 40, (tail.acks_topic, 1): 50}  # acks: their ends
    assert ends == {(tail.conv_topic, 0): 7, (tail.conv_topic, 1): 9, (issues, 0): 2}
    assert tail.assigned.is_set()


class PositionConsumer(AssignConsumer):
    """An ``AssignConsumer`` that also says how far it has read."""

    def __init__(self, partitions: dict[str, int], marks: dict[tuple[str, int], tuple[int, int]]
                 ) -> None:
        super().__init__(partitions, marks)
        self.read: dict[tuple[str, int], int] = {}

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.read.get((tp.topic, tp.partition),
                                                                      -1001)) for tp in tps]


def test_topics_apart_are_read_by_a_consumer_of_their_own() -> None:
    """The topics ``apart`` (those no turn writes to) are assigned to a second consumer, so the
    fetches a turn's records end do not name their partitions (issue 14, thirty-seventh pass);
    the tail is assigned and caught up only once both consumers are."""
    tail = EdgeTail(SETTINGS, on_conversation=lambda env: None,
                    more={ISSUES: lambda env: None}, apart=(ISSUES,))
    issues = "t.voice.issues"
    partitions = {tail.conv_topic: 2, tail.acks_topic: 1, issues: 2}
    marks = {(tail.conv_topic, 0): (0, 7), (tail.conv_topic, 1): (0, 0),
             (tail.acks_topic, 0): (0, 40), (issues, 0): (0, 2), (issues, 1): (0, 3)}
    turn_path, quiet = PositionConsumer(partitions, marks), PositionConsumer(partitions, marks)
    turn_ends = tail._assign(turn_path)  # type: ignore[arg-type]
    assert {tp.topic for tp in turn_path.assigned[0]} == {tail.conv_topic, tail.acks_topic}
    assert not tail.assigned.is_set()  # the other consumer has no partitions yet
    quiet_ends = tail._assign(quiet, apart=True)  # type: ignore[arg-type]
    assert {tp.topic for tp in quiet.assigned[0]} == {issues}
    assert tail.assigned.is_set()
    assert tail.partitions == partitions
    assert turn_ends == {(tail.conv_topic, 0): 7, (tail.conv_topic, 1): 0}
    assert quiet_ends == {(issues, 0): 2, (issues, 1): 3}

    quiet.read = {(issues, 0): 2, (issues, 1): 3}
    assert tail._check_caught_up(quiet, quiet_ends)  # type: ignore[arg-type]
    assert not tail.caught_up.is_set()  # the conversation log is not read to its end yet
    assert not tail._check_caught_up(turn_path, turn_ends)  # type: ignore[arg-type]
    turn_path.read = {(tail.conv_topic, 0): 7}
    assert tail._check_caught_up(turn_path, turn_ends)  # type: ignore[arg-type]
    assert tail.caught_up.is_set()


def test_without_topics_apart_one_consumer_reads_them_all() -> None:
    tail = EdgeTail(SETTINGS, on_conversation=lambda env: None, more={ISSUES: lambda env: None})
    consumer = AssignConsumer({tail.conv_topic: 1, tail.acks_topic: 1, "t.voice.issues": 1}, {})
    tail._assign(consumer)  # type: ignore[arg-type]
    assert {tp.topic for tp in consumer.assigned[0]} == {
        tail.conv_topic, tail.acks_topic, "t.voice.issues"}
    assert tail.assigned.is_set()
