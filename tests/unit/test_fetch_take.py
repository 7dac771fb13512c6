"""``take``: the one way Voice's own consumers take what was fetched (issue 14, fifth pass).

Regression: the key store took records with ``consume(10_000, 0.1)``, which librdkafka returns
from only when 10,000 messages have come or the 0.1 s is over — a key made on another process
reached a worker up to 100 ms late, and each turn that needed it waited (``sync``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import streams.keyservice as keyservice
from streams.fetch import LogEnds, log_ends, take


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


class Fenced:
    """An admin client whose metadata is older than the broker's (after a restart)."""

    def list_offsets(self, request: dict[Any, Any], request_timeout: float) -> Any:
        raise KafkaException(KafkaError(KafkaError.FENCED_LEADER_EPOCH))


class Answers:
    def list_offsets(self, request: dict[Any, Any], request_timeout: float) -> Any:
        class Done:
            offset = 7

            def result(self, timeout: float) -> Any:  # noqa: ARG002
                return self

        return {tp: Done() for tp in request}


def test_a_client_whose_request_failed_is_dropped_and_a_new_one_asks_again() -> None:
    """Regression: after a broker restart the kept admin client answered every request
    FENCED_LEADER_EPOCH, and an edge's uploads were 503 for good."""
    made: list[Any] = []
    clients = iter([Fenced(), Answers(), Fenced(), Fenced()])

    def make(config: dict[str, object]) -> Any:
        made.append(next(clients))
        return made[-1]

    ends = LogEnds("127.0.0.1:1", make=make)
    assert ends("t.voice.keys", [0, 1], 5.0) == {0: 7, 1: 7} and len(made) == 2
    assert ends("t.voice.keys", [0], 5.0) == {0: 7} and len(made) == 2  # kept while it answers
    ends.drop()
    with pytest.raises(KafkaException):  # a new one fails too: once more, then the error
        ends("t.voice.keys", [0], 5.0)
    assert len(made) == 4


def test_a_request_that_used_up_its_time_is_not_asked_again() -> None:
    made: list[Any] = []

    class Slow:
        def list_offsets(self, request: dict[Any, Any], request_timeout: float) -> Any:
            time.sleep(request_timeout)
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    def make(config: dict[str, object]) -> Any:
        made.append(Slow())
        return made[-1]

    with pytest.raises(KafkaException):
        LogEnds("127.0.0.1:1", make=make)("t.voice.keys", [0], 0.2)
    assert len(made) == 1


def test_no_answer_in_time_is_the_brokers_error_not_an_os_error() -> None:
    """Regression: ``Future.result`` timing out raised ``TimeoutError`` (an ``OSError``), and
    the edge answered 'a store … is unavailable' for a broker that was down."""
    from concurrent.futures import Future

    class Silent:
        def list_offsets(self, request: dict[Any, Any], request_timeout: float) -> Any:
            return {tp: Future() for tp in request}

    with pytest.raises(KafkaException, match="no answer"):
        log_ends(Silent(), "t.voice.keys", [0], 0.05)  # type: ignore[arg-type]
