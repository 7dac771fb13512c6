"""``kafka.turn_chain`` plays a Voice turn's record flow: the records a turn produces, topic
by topic, each stage produced only on the acks of the one before (as the stack awaits them)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.chain import FLOW, TOPICS, WORKER_READS, Flow, Out, records_per_turn

VOICE_RECORDS_BY_TOPIC = {
    "commands": 2, "conversations": 2, "acks": 1, "agent": 3, "deltas": 1, "telemetry": 1,
    "workflows": 3, "conversations-changelog": 2, "workflows-changelog": 2}
"""A turn of ``turn.sustained`` (its ``records_per_turn_by_topic``, the keys topic aside)."""


class _Broker:
    """A producer whose acks come only when ``ack_all`` is called; what it took, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.unacked: list[Any] = []

    def produce(self, topic: str, value: bytes, key: bytes, headers: list[tuple[str, bytes]],
                on_delivery: Any = None) -> None:
        kind = dict(headers)["ce_type"].decode()
        self.log.append((topic, kind))
        if on_delivery is not None:
            self.unacked.append(on_delivery)

    def ack_all(self) -> None:
        while self.unacked:
            batch, self.unacked = self.unacked, []
            for cb in batch:
                cb(None, None)


def _flow(broker: _Broker) -> Flow:
    flow = Flow.__new__(Flow)
    flow.producer = broker  # type: ignore[assignment]
    flow.topics = {t: t for t in TOPICS}
    flow.value = b"v"
    flow.errors = 0
    return flow


def _play_turn(broker: _Broker, flow: Flow) -> None:
    """One turn: the command, then every record the worker reads played as ``FLOW`` says,
    acks served between the worker's reads."""
    flow.produce(Out("commands", "send", "c"), b"cnv-1", b"cnv-1:turn-1", 0)
    read = 0
    while read < len(broker.log) or broker.unacked:
        broker.ack_all()
        while read < len(broker.log):
            topic, kind = broker.log[read]
            read += 1
            if topic in WORKER_READS and (stages := FLOW.get((topic, kind))):
                flow.run(stages, b"cnv-1", b"cnv-1:turn-1")


def test_a_turn_produces_what_a_voice_turn_produces() -> None:
    broker = _Broker()
    _play_turn(broker, _flow(broker))
    assert Counter(t for t, _ in broker.log) == VOICE_RECORDS_BY_TOPIC
    assert len(broker.log) == records_per_turn() == 17
    assert broker.log.count(("conversations", "reply")) == 1


def test_each_stage_waits_for_the_acks_of_the_one_before() -> None:
    broker = _Broker()
    flow = _flow(broker)
    flow.run(FLOW[("workflows", "started")], b"cnv-1", b"cnv-1:turn-1")
    assert broker.log == [("workflows", "step_started")]  # the lease alone, until its ack
    broker.unacked.pop()(None, None)
    assert broker.log[1:] == [("workflows-changelog", "cl"), ("agent", "model"),
                              ("agent", "tool"), ("agent", "model"), ("deltas", "delta"),
                              ("telemetry", "t")]
    for cb in broker.unacked[:-1]:  # all of the step's records but one acked: no results yet
        cb(None, None)
    assert ("commands", "results") not in broker.log
    broker.unacked[-1](None, None)
    assert broker.log[-1] == ("commands", "results")
    broker.unacked = broker.unacked[-1:]
    broker.unacked.pop()(None, None)  # the results' ack
    # The step's outcome, applied where it ran: the workflow completed, then its table.
    assert broker.log[-1] == ("workflows", "completed")
    broker.ack_all()
    assert broker.log[-1] == ("workflows-changelog", "cl")
