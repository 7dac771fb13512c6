"""A table write's changelog record is held back (``consumers.frame.write_behind``): the table
changes at once, the last value of each key is sent once, a tombstone is never overtaken by a
value held before it; a held record is sent before a commit covers the record that wrote it,
once it has lingered, and all of them before a handover or a stop."""

from __future__ import annotations

from contextlib import closing
from typing import Any

import pytest
from faust.serializers import codecs

from consumers.frame.context import WorkerContext
from consumers.frame.write_behind import WriteBehind, send_before_commit
from streams.settings import VoiceSettings


def settings(**kw: Any) -> VoiceSettings:
    return VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", **kw)


class Sent:
    class message:  # noqa: N801  (Faust's FutureMessage.message)
        partition = 0


@pytest.fixture
def table_and_sent(monkeypatch: Any) -> Any:
    with closing(WorkerContext(settings(worker_changelog_linger_s=2))) as ctx:
        table = ctx.table("held", held=True)
        sent: list[tuple[Any, ...]] = []

        def send_changelog(partition: Any, key: Any, value: Any, **kw: Any) -> Any:
            sent.append((partition, key, value, kw))
            return Sent()

        monkeypatch.setattr(table, "send_changelog", send_changelog)
        partitions = {"a": 0, "b": 3}
        monkeypatch.setattr(table, "partition_for_key", lambda key: partitions[key])
        yield ctx.app.write_behind, table, sent


def test_a_write_is_held_and_only_each_key_s_last_value_is_sent(table_and_sent: Any) -> None:
    held, table, sent = table_and_sent
    assert held.holds and held.linger_s == 2
    table["a"] = {"seq": 1}
    table["a"] = {"seq": 2}
    table["b"] = {"seq": 7}
    assert sent == [] and len(held) == 2, "nothing sent before the flush"
    assert table["a"] == {"seq": 2} and table["b"] == {"seq": 7}, "the table changed at once"
    assert held.send() == 2
    raw = {"key_serializer": "raw", "value_serializer": "raw"}
    assert sorted(sent) == sorted([
        (0, codecs.dumps("json", "a"), codecs.dumps("json", {"seq": 2}), raw),
        (3, codecs.dumps("json", "b"), codecs.dumps("json", {"seq": 7}), raw)])
    assert (held.sent, held.replaced, len(held)) == (2, 1, 0)
    assert held.send() == 0 and len(sent) == 2, "sent once"


def test_a_tombstone_replaces_a_held_value_and_a_value_a_held_tombstone(
        table_and_sent: Any) -> None:
    held, table, sent = table_and_sent
    table["a"] = {"seq": 1}
    del table["a"]
    held.send()
    assert [(p, k, v) for p, k, v, _ in sent] == [(0, codecs.dumps("json", "a"), None)]
    assert "a" not in table
    sent.clear()
    table["a"] = {"seq": 1}
    held.send()
    del table["a"]
    table["a"] = {"seq": 2}
    held.send()
    assert [v for _, _, v, _ in sent] == [codecs.dumps("json", {"seq": 1}),
                                          codecs.dumps("json", {"seq": 2})]


@pytest.mark.parametrize(("linger", "held"), [(0, True), (2, False)])
def test_without_a_linger_or_in_a_table_not_held_every_write_is_sent_at_once(
        monkeypatch: Any, linger: float, held: bool) -> None:
    """An aggregate's table is not held: a command handled again after a crash must find its
    own write (and be answered from it) rather than make its records again."""
    with closing(WorkerContext(settings(worker_changelog_linger_s=linger))) as ctx:
        table = ctx.table("at-once", held=held)
        sent: list[Any] = []
        monkeypatch.setattr(table, "send_changelog",
                            lambda p, k, v, **kw: sent.append((p, k, v)) or Sent())
        monkeypatch.setattr(table, "partition_for_key", lambda _key: 0)
        table["a"] = 1
        table["a"] = 2
        del table["a"]
        assert [v for _, _, v in sent] == [b"1", b"2", None]
        assert len(ctx.app.write_behind) == 0


class Table:
    name = "t"

    def __init__(self, order: list[str]) -> None:
        self.order = order

    def send_changelog(self, partition: int, key: bytes, value: bytes | None, **kw: Any) -> None:
        self.order.append(f"send {key.decode()}={value!r}")


def test_a_commit_sends_the_writes_of_the_records_it_covers_and_keeps_the_rest() -> None:
    """A commit of offset N (the next to read) covers the records below N. A key written by a
    covered record and again by a later one goes with its last value. A running step's lease
    record is not covered: its workflow's write waits (and is replaced by its end)."""
    order: list[str] = []
    held = WriteBehind(2.0)
    t = Table(order)
    held.hold(t, 0, b"conversation", b"at-message", ("commands-0", 10))
    held.hold(t, 0, b"conversation", b"at-results", ("commands-0", 14))
    held.hold(t, 1, b"workflow", b"running", ("workflows-1", 7))
    held.hold(t, 1, b"other", b"x", ("commands-1", 3))
    assert held.send_covered({"commands-0": 11, "workflows-1": 7}) == 1
    assert order == ["send conversation=b'at-results'"]
    held.hold(t, 1, b"workflow", b"completed", ("workflows-1", 9))
    assert held.send_covered({"workflows-1": 8}) == 1
    assert order[-1] == "send workflow=b'completed'"
    assert held.send_covered({"commands-0": 100}) == 0 and len(held) == 1
    assert held.send() == 1 and order[-1] == "send other=b'x'" and len(held) == 0
    assert (held.sent, held.replaced) == (3, 2)


def test_a_write_outside_a_record_goes_with_the_next_commit() -> None:
    order: list[str] = []
    held = WriteBehind(2.0)
    held.hold(Table(order), 0, b"k", b"v", None)
    assert held.send_covered({}) == 1 and order == ["send k=b'v'"]


def test_a_write_held_past_the_linger_is_sent() -> None:
    now = [100.0]
    order: list[str] = []
    held = WriteBehind(2.0, clock=lambda: now[0])
    t = Table(order)
    held.hold(t, 0, b"old", b"1", ("w-0", 1))
    now[0] = 101.0
    held.hold(t, 0, b"new", b"2", ("w-0", 2))
    held.hold(t, 0, b"old", b"3", ("w-0", 3))  # replaced: still held since 100
    assert held.send_lingering() == 0
    now[0] = 102.0
    assert held.send_lingering() == 1 and order == ["send old=b'3'"]
    now[0] = 103.5
    assert held.send_lingering() == 1 and order[-1] == "send new=b'2'"


async def test_the_consumer_s_commit_sends_the_covered_writes_before_it_commits() -> None:
    """Faust's ``_commit_offsets`` flushes the producer, then commits: the covered records are
    handed over before, so the flush waits for them too."""
    order: list[str] = []

    class Consumer:
        async def _commit_offsets(self, offsets: Any, start_new_transaction: bool = True
                                  ) -> bool:
            order.append(f"commit {dict(offsets)}")
            return True

    held = WriteBehind(2.0)
    consumer = send_before_commit(Consumer(), held)
    held.hold(Table(order), 1, b"k", b"v1", ("tp", 4))
    held.hold(Table(order), 1, b"k", b"v2", ("tp", 5))
    assert await consumer._commit_offsets({"tp": 5}) is True
    assert order == ["send k=b'v2'", "commit {'tp': 5}"]


def test_the_worker_s_app_commits_through_the_held_writes(make_worker: Any) -> None:
    """Only the workflow runtime's table is held; the aggregates' are not."""
    worker = make_worker(settings())
    app = worker.app
    held = {name for name, table in app.tables.items() if table.held_back}
    assert held == {"workflows"}, held
    assert app.write_behind.linger_s == VoiceSettings().worker_changelog_linger_s == 2.0
    consumer = app._new_consumer()
    assert consumer._commit_offsets.__name__ == "commit_covered_writes_first"


async def test_a_handover_or_a_stop_sends_everything_held(make_worker: Any) -> None:
    order: list[str] = []
    app = make_worker(settings()).app
    app.write_behind.hold(Table(order), 0, b"lease", b"running", ("workflows-0", 3))

    class Producer:
        async def flush(self) -> None:
            order.append("flush")

    app._producer = Producer()
    await app._producer_flush(app.log)
    assert order == ["send lease=b'running'", "flush"]


def test_a_table_write_remembers_the_record_being_handled_as_its_cause(
        table_and_sent: Any) -> None:
    """Faust's current event (the record the agent handles) is the write's cause: a commit
    below its offset leaves it held, one past it sends it."""
    import weakref

    from faust.streams import _current_event

    held, table, sent = table_and_sent

    class Message:
        tp = "workflows-0"
        offset = 41

    class Event:
        message = Message()

    event = Event()
    token = _current_event.set(weakref.ref(event))
    try:
        table["a"] = {"status": "running"}
    finally:
        _current_event.reset(token)
    assert held.send_covered({"workflows-0": 41}) == 0 and sent == []
    assert held.send_covered({"workflows-0": 42}) == 1 and len(sent) == 1
