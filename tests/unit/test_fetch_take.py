"""``take``: the one way Voice's own consumers take what was fetched (issue 14, fifth pass).

Regression: the key store took records with ``consume(10_000, 0.1)``, which librdkafka returns
from only when 10,000 messages have come or the 0.1 s is over — a key made on another process
reached a worker up to 100 ms late, and each turn that needed it waited (``sync``).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import streams.keyservice as keyservice
from streams.fetch import log_ends, take


class Fetched:
    """A consumer whose fetched messages are queued; ``poll`` and ``consume`` take from it.
    ``consume`` with a timeout above 0 fails the test: nothing may wait in it."""

    def __init__(self, *arrivals: list[Any]) -> None:
        self.arrivals = list(arrivals)  # what is fetched before each poll, in turn
        self.ready: list[Any] = []
        self.polls: list[float] = []

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        assert timeout == 0, f"consume({num_messages}, {timeout}) waits out its timeout"
        out, self.ready = self.ready[:num_messages], self.ready[num_messages:]
        return out

    def poll(self, timeout: float) -> Any:
        self.polls.append(timeout)
        if self.arrivals:
            self.ready.extend(self.arrivals.pop(0))
        return self.ready.pop(0) if self.ready else None


def test_what_is_fetched_is_taken_without_waiting() -> None:
    c = Fetched()
    c.ready = ["a", "b", "c"]
    assert take(c, 0.5, most=2) == ["a", "b"] and c.polls == []  # type: ignore[arg-type]
    assert take(c, 0.5) == ["c"] and c.polls == []  # type: ignore[arg-type]


def test_otherwise_the_first_to_come_returns_with_what_came_beside_it() -> None:
    c = Fetched(["x", "y"], [])
    assert take(c, 0.5) == ["x", "y"] and c.polls == [0.5]  # type: ignore[arg-type]
    assert take(c, 0.5) == [] and c.polls == [0.5, 0.5]  # type: ignore[arg-type]
    c = Fetched(["x", "y"])
    assert take(c, 0.5, most=1) == ["x"]  # type: ignore[arg-type]


def test_the_key_store_takes_its_records_this_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its reader thread never waits in ``consume`` (the ``Fetched`` stand-in fails then)."""
    seen: list[tuple[Any, float, int]] = []

    def spy(consumer: Any, wait: float, most: int = 500) -> list[Any]:
        seen.append((consumer, wait, most))
        raise SystemExit  # one round is enough: end the reader's loop here

    class Probe:
        def __init__(self, config: dict[str, Any]) -> None:
            self.config = config

        def list_topics(self, topic: str, timeout: float) -> Any:
            part = type("P", (), {})()
            return type("M", (), {"topics": {topic: type("T", (), {
                "error": None, "partitions": {0: part}})()}})()

        def assign(self, tps: Any) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(keyservice, "Consumer", Probe)
    monkeypatch.setattr(keyservice, "take", spy)
    store = keyservice.ClusterKeyStore.__new__(keyservice.ClusterKeyStore)
    store._bootstrap, store._topic = "127.0.0.1:1", "t.voice.keys"
    store._stop = threading.Event()
    store._cond = threading.Condition()
    with pytest.raises(SystemExit):
        store._run()
    [(consumer, wait, most)] = seen
    assert isinstance(consumer, Probe) and wait == 0.1 and most == 10_000


def test_where_a_log_ends_is_one_request_for_all_its_partitions() -> None:
    """The key store's ``sync`` asked each partition apart (two requests each, in turn)."""
    asked: list[dict[Any, Any]] = []

    class Done:
        def __init__(self, offset: int) -> None:
            self.offset = offset

        def result(self, timeout: float) -> Any:  # noqa: ARG002
            return self

    class Admin:
        def list_offsets(self, request: dict[Any, Any], request_timeout: float) -> Any:
            asked.append(request)
            return {tp: Done(10 * tp.partition) for tp in request}

    assert log_ends(Admin(), "t.voice.keys", [0, 1, 2], 5.0) == {0: 0, 1: 10, 2: 20}  # type: ignore[arg-type]
    [request] = asked
    assert sorted(tp.partition for tp in request) == [0, 1, 2]
