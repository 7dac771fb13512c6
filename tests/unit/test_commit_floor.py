"""``CommitFloor``: nothing committed past a record no handler saw (a second worker joining).

Runs Faust's own ``Consumer._new_offset`` and ``perform_seek`` on a real, unstarted consumer
with the broker calls scripted.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.types import TP
from intervaltree import IntervalTree

from consumers.frame.commit_floor import CommitFloor
from consumers.frame.handover import VoiceApp

TOPIC = "t.voice.commands"
COMPACTED = "t.voice.keys"
CHANGELOG = "t.voice-table-changelog"


def consumer_with(committed: dict[TP, int | None], earliest: dict[TP, int]
                  ) -> tuple[Any, CommitFloor, list[tuple[TP, int]], list[tuple[TP, ...]]]:
    app = faust.App("commit-floor-test", broker="kafka://127.0.0.1:1", store="memory://",
                    web_enabled=False)
    consumer = app.consumer
    sought: list[tuple[TP, int]] = []
    asked: list[tuple[TP, ...]] = []

    async def seek_to_committed() -> dict[TP, int | None]:
        return dict(committed)

    async def earliest_offsets(*tps: TP) -> dict[TP, int]:
        asked.append(tps)
        return {tp: earliest[tp] for tp in tps if tp in earliest}

    async def raw_seek(tp: TP, offset: int) -> None:
        sought.append((tp, offset))

    consumer.seek_to_committed = seek_to_committed
    consumer.earliest_offsets = earliest_offsets
    consumer._seek = raw_seek
    floor = CommitFloor(consumer, lambda: frozenset({CHANGELOG}),
                        lambda topic: topic == TOPIC)
    return consumer, floor, sought, asked


def acked(consumer: Any, tp: TP, *offsets: int) -> None:
    consumer._acked[tp].extend(offsets)
    consumer._acked_index[tp].update(offsets)


def test_the_record_at_the_committed_offset_holds_the_commit() -> None:
    """Faust commits 283 over an unacknowledged 279 (its check allows one); held here."""
    tp = TP(TOPIC, 0)
    consumer, _, _, _ = consumer_with({}, {})
    consumer._committed_offset[tp] = 279
    acked(consumer, tp, 280, 281, 282)
    assert consumer._new_offset(tp) is None
    acked(consumer, tp, 279)
    assert consumer._new_offset(tp) == 283


def test_a_gap_faust_registered_at_the_floor_lets_the_commit_pass() -> None:
    """A record the guard gave up on (not on the log any more) is a registered gap."""
    tp = TP(TOPIC, 0)
    consumer, _, _, _ = consumer_with({}, {})
    consumer._committed_offset[tp] = 279
    acked(consumer, tp, 281)
    consumer._gap[tp] = IntervalTree.from_tuples([(279, 281)])
    assert consumer._new_offset(tp) == 282


def test_a_topic_with_gaps_of_its_own_is_left_to_faust() -> None:
    tp = TP(COMPACTED, 0)
    consumer, _, _, _ = consumer_with({}, {})
    consumer._committed_offset[tp] = 279
    acked(consumer, tp, 280, 281)
    assert consumer._new_offset(tp) == 282


def test_a_partition_never_committed_is_sought_to_its_start_which_is_its_floor() -> None:
    """Nothing committed: Faust would commit from whatever came first (here 1, over an
    unseen 0). Sought to its start, 0 is the floor until something is committed."""
    fresh, zero, done, log = TP(TOPIC, 0), TP(TOPIC, 1), TP(TOPIC, 2), TP(CHANGELOG, 0)
    other = TP(COMPACTED, 0)
    consumer, floor, sought, asked = consumer_with(
        {fresh: None, zero: 0, done: 41, log: None, other: None}, {fresh: 0, zero: 0})
    committed = consumer.loop.run_until_complete(consumer.seek_to_committed())
    assert committed == {fresh: None, zero: 0, done: 41, log: None, other: None}, \
        "Faust's view unchanged"
    assert asked == [(fresh, zero)], "changelogs and gapped topics left alone"
    assert sorted(sought) == [(fresh, 0), (zero, 0)]
    assert floor.floor(fresh) == 0
    acked(consumer, fresh, 1, 2)
    assert consumer._new_offset(fresh) is None
    acked(consumer, fresh, 0)
    assert consumer._new_offset(fresh) == 3


def test_a_start_is_forgotten_once_the_partition_is_committed() -> None:
    tp = TP(TOPIC, 0)
    consumer, floor, _, _ = consumer_with({tp: None}, {tp: 5})
    consumer.loop.run_until_complete(consumer.seek_to_committed())
    assert floor.floor(tp) == 5
    floor._seek_to_committed = _returning({tp: 9})
    consumer.loop.run_until_complete(consumer.seek_to_committed())
    assert floor.starts == {}


def _returning(value: dict[TP, int | None]) -> Any:
    async def seek_to_committed() -> dict[TP, int | None]:
        return dict(value)
    return seek_to_committed


def test_voice_app_installs_it() -> None:
    app = VoiceApp("commit-floor-app-test", broker="kafka://127.0.0.1:1", store="memory://",
                   web_enabled=False)
    consumer = app.consumer
    assert isinstance(app.commit_floor, CommitFloor)
    assert consumer.seek_to_committed == app.commit_floor.seek_to_committed
    assert consumer._new_offset == app.commit_floor.new_offset
