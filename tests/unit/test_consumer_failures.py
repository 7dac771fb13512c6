"""What a consumer does with a record it cannot process (decision 0008), without a broker.

The retry policy (``streams.retry``) with an injected sleep; the worker's guard and agent body
(``consumers.frame.failures``) with a fake producer and fake Faust events; and each path that
used to lose a record silently — an exception logged and the offset committed, a command type
nobody owns, a workflow kind nobody runs, a log record without its seq, a dead letter the
broker refused — run through the agents a real worker registers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumers.app import create_worker
from consumers.frame.context import WorkerContext
from consumers.frame.failures import Halt, RecordGuard, consume
from consumers.frame.writer import Raw
from schemas.base import Sealed
from schemas.conversation import ConversationStarted, TurnRequested
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope, encode
from streams.producer import ProduceError
from streams.retry import RetryPolicy, Unprocessable, attempt, retryable
from streams.settings import VoiceSettings
from streams.topics import CONVERSATIONS, TOPICS, WORKFLOWS, topic_name

SETTINGS = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", topic_prefix="t.",
                         consumer_retry_initial_ms=0)
SEALED = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy")
CNV = "cnv-00112233aabbccdd"


class Sleeps:
    """An injected ``sleep`` that only records what it was asked to wait."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


class Flaky:
    """Work that fails with ``errors`` in order, then succeeds."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


# --- the policy --------------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap_and_comes_from_the_settings() -> None:
    p = RetryPolicy(attempts=5, initial_s=0.1, max_s=0.3)
    assert [p.delay(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]
    s = VoiceSettings(consumer_retry_attempts=4, consumer_retry_initial_ms=50,
                      consumer_retry_max_ms=400)
    assert RetryPolicy.from_settings(s) == RetryPolicy(4, 0.05, 0.4)
    assert RetryPolicy.from_settings(VoiceSettings()) == RetryPolicy(3, 0.2, 2.0)
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_a_transient_failure_is_retried_with_backoff_and_then_succeeds() -> None:
    sleeps, work = Sleeps(), Flaky(ProduceError("broker away", retryable=True),
                                   ConnectionError("reset"))
    failure, tries = asyncio.run(attempt(work, RetryPolicy(3, 0.2, 2.0), sleeps))
    assert failure is None and tries == 3 and work.calls == 3
    assert sleeps.waits == [0.2, 0.4]


def test_a_failure_that_keeps_happening_is_tried_only_the_policys_attempts() -> None:
    sleeps = Sleeps()
    work = Flaky(*[KeyError("state")] * 10)  # a bug: deterministic, but not marked so
    failure, tries = asyncio.run(attempt(work, RetryPolicy(3, 0.2, 2.0), sleeps))
    assert isinstance(failure, KeyError) and tries == 3 == work.calls
    assert sleeps.waits == [0.2, 0.4]


@pytest.mark.parametrize("error", [
    Unprocessable("no writer takes it"),
    ProduceError("Broker: Message size too large", retryable=False),
    KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)),
])
def test_a_failure_that_says_it_is_not_retryable_gets_one_attempt(error: Exception) -> None:
    sleeps, work = Sleeps(), Flaky(error)
    failure, tries = asyncio.run(attempt(work, RetryPolicy(5, 0.2, 2.0), sleeps))
    assert failure is error and tries == 1 == work.calls and sleeps.waits == []


def test_retryability_is_an_attribute_of_the_failure() -> None:
    assert retryable(ProduceError("x", retryable=True))
    assert not retryable(ProduceError("x", retryable=False))
    assert retryable(KafkaException(KafkaError(KafkaError._TRANSPORT, retriable=True)))
    assert retryable(RuntimeError("anything else"))


def test_a_cancellation_is_never_caught() -> None:
    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(attempt(cancelled, RetryPolicy(3, 0, 0), Sleeps()))


# --- the guard and the agent body ----------------------------------------------------------


class FakeProducer:
    """``produce_raw`` as the worker's producer has it; dead letters kept, failures scripted."""

    def __init__(self, failures: int = 0) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, dict[str, bytes]]] = []
        self.failures = failures
        self.calls = 0

    def produce_raw(self, topic: str, key: bytes | None, value: bytes | None,
                    headers: Any = None, partition: int | None = None) -> Any:
        self.calls += 1
        fut = asyncio.get_running_loop().create_future()
        if self.failures:
            self.failures -= 1
            fut.set_exception(ProduceError(f"produce to {topic!r} failed: Local: Broker "
                                           "transport failure", retryable=True))
        else:
            self.sent.append((topic, key, value, dict(headers or [])))
            fut.set_result(None)
        return fut

    def reasons(self) -> list[str]:
        return [h["voice_dlq_reason"].decode() for _t, _k, _v, h in self.sent]


@dataclass
class Message:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any
    topic: str = "t.voice.conversations"

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)


@dataclass
class Event:
    """A Faust event as an agent sees it: the message, and ``ack``."""

    message: Message
    acks: list[int] = field(default_factory=list)

    def ack(self) -> bool:
        self.acks.append(self.message.offset)
        return True


def event(offset: int, env: Envelope | None = None, value: bytes | None = None,
          topic: str = "t.voice.conversations") -> Event:
    if env is not None:
        k, v, h = encode(env)
        return Event(Message(0, offset, k, v, dict(h), topic))
    return Event(Message(0, offset, b"k", value, {}, topic))


async def events_of(*items: Event) -> AsyncIterator[Event]:
    for e in items:
        yield e


def raw(offset: int = 7) -> Raw:
    return Raw("t.voice.issues", 2, offset, b"iss-1", b"{}", [("ce_id", b"r-1")])


def test_a_record_whose_handler_keeps_failing_is_dead_lettered_as_it_came() -> None:
    producer, sleeps = FakeProducer(), Sleeps()
    guard = RecordGuard("voice_issues_agent", lambda: producer, RetryPolicy(3, 0.1, 1), sleeps)
    handler = Flaky(*[ValueError("impossible content")] * 3)
    assert asyncio.run(guard.run(raw(), handler)) is False
    assert handler.calls == 3 and sleeps.waits == [0.1, 0.2] and guard.dead_lettered == 1
    [(topic, key, value, headers)] = producer.sent
    assert topic == "t.voice.issues.dlq" and key == b"iss-1" and value == b"{}"
    assert headers["ce_id"] == b"r-1"  # the record's own headers travel with it
    # Described, not quoted: an exception's message may echo the record's values.
    assert headers["voice_dlq_reason"] == b"voice_issues_agent failed after 3 attempts: ValueError"
    assert (headers["voice_dlq_topic"], headers["voice_dlq_partition"],
            headers["voice_dlq_offset"]) == (b"t.voice.issues", b"2", b"7")


def test_a_handler_that_recovers_within_the_attempts_is_not_dead_lettered() -> None:
    producer = FakeProducer()
    guard = RecordGuard("a", lambda: producer, RetryPolicy(3, 0, 0), Sleeps())
    assert asyncio.run(guard.run(raw(), Flaky(ProduceError("away", retryable=True)))) is True
    assert producer.sent == [] and guard.dead_lettered == 0


def test_a_dead_letter_is_retried_and_when_it_never_goes_the_guard_halts() -> None:
    producer = FakeProducer(failures=2)  # the DLQ produce fails twice, then goes
    guard = RecordGuard("a", lambda: producer, RetryPolicy(3, 0, 0), Sleeps())
    assert asyncio.run(guard.run(raw(), Flaky(Unprocessable("no")))) is False
    assert producer.calls == 3 and len(producer.sent) == 1

    producer = FakeProducer(failures=10**6)
    guard = RecordGuard("a", lambda: producer, RetryPolicy(3, 0, 0), Sleeps())
    with pytest.raises(Halt, match=r"t.voice.issues\[2\]@7 could be neither processed"):
        asyncio.run(guard.run(raw(), Flaky(Unprocessable("no"))))
    assert producer.calls == 3 and guard.dead_lettered == 0


def test_the_agent_acks_what_it_handled_or_dead_lettered_and_goes_on() -> None:
    producer = FakeProducer()
    guard = RecordGuard("a", lambda: producer, RetryPolicy(2, 0, 0), Sleeps())
    seen: list[int] = []

    async def dispatch(r: Raw, _event: Any) -> None:
        if r.value == b"poison":
            raise ValueError("cannot apply")
        seen.append(r.offset or 0)

    evs = [event(0, value=b"ok"), event(1, value=b"poison"), event(2, value=b"ok")]
    halts: list[Halt] = []

    async def halt(exc: Halt) -> None:
        halts.append(exc)

    asyncio.run(consume(events_of(*evs), "t.voice.conversations", guard, dispatch, False, halt))
    assert seen == [0, 2] and [e.acks for e in evs] == [[0], [1], [2]] and halts == []
    assert producer.reasons() == ["a failed after 2 attempts: ValueError"]


def test_a_holding_agent_acks_only_the_records_it_dead_lettered() -> None:
    producer = FakeProducer()
    guard = RecordGuard("a", lambda: producer, RetryPolicy(1, 0, 0), Sleeps())
    held: list[Event] = []

    async def dispatch(r: Raw, ev: Any) -> None:
        if r.value == b"poison":
            raise Unprocessable("impossible")
        held.append(ev)  # the handler acknowledges when it is done (the workflow lease)

    evs = [event(0, value=b"ok"), event(1, value=b"poison")]
    asyncio.run(consume(events_of(*evs), "t", guard, dispatch, True, _no_halt))
    assert held == [evs[0]] and evs[0].acks == [] and evs[1].acks == [1]


async def _no_halt(exc: Halt) -> None:
    raise AssertionError(f"halted: {exc}")


def test_a_record_neither_handled_nor_dead_lettered_is_never_acked_and_stops_the_agent() -> None:
    """Regression: the agent used to log the exception and ack the record, so Faust committed
    past a record that went nowhere."""
    producer = FakeProducer(failures=10**6)  # the broker takes no dead letter
    guard = RecordGuard("a", lambda: producer, RetryPolicy(2, 0, 0), Sleeps())
    seen: list[int] = []

    async def dispatch(r: Raw, _event: Any) -> None:
        seen.append(r.offset or 0)
        raise ValueError("cannot apply")

    evs = [event(0), event(1)]
    halts: list[Halt] = []

    async def halt(exc: Halt) -> None:
        halts.append(exc)

    asyncio.run(consume(events_of(*evs), "t", guard, dispatch, False, halt))
    assert len(halts) == 1 and evs[0].acks == [] and seen == [0, 0]  # and no record after it
    assert evs[1].acks == []


# --- the worker's own agents: each silent-loss path, closed --------------------------------


class Stream:
    """What a Faust agent is given: ``noack().events()`` over fake events."""

    def __init__(self, *evs: Event) -> None:
        self.evs = evs

    def noack(self) -> Stream:
        return self

    def events(self) -> AsyncIterator[Event]:
        return events_of(*self.evs)


MADE: list[WorkerContext] = []
"""The contexts ``worker`` made, closed after each test (``close_workers``)."""


@pytest.fixture(autouse=True)
def close_workers() -> Iterator[None]:
    yield
    while MADE:
        ctx = MADE.pop()
        ctx._producer = None  # the fake has nothing to close
        ctx.close()


def worker(**overrides: object) -> tuple[WorkerContext, FakeProducer, list[Halt]]:
    ctx = create_worker(SETTINGS.model_copy(update=overrides))
    MADE.append(ctx)
    producer = FakeProducer()
    ctx._producer = producer  # type: ignore[assignment]  # the lazily made producer
    halts: list[Halt] = []

    async def crash(exc: BaseException) -> None:
        halts.append(exc)  # type: ignore[arg-type]

    ctx.app.crash = crash  # type: ignore[method-assign]
    return ctx, producer, halts


def run_agent(ctx: WorkerContext, name: str, *evs: Event) -> None:
    asyncio.run(ctx.app.agents[name].fun(Stream(*evs)))


def test_a_command_type_nobody_writes_is_dead_lettered_not_skipped() -> None:
    """Regression: the writer left a command of a type no aggregate owns alone, and Faust
    committed past it."""
    ctx, producer, halts = worker()
    stray = Envelope(record=ConversationStarted(conversation=CNV, owner="alice"), key=CNV,
                     source="/test", id="stray-1")
    ev = event(3, stray, topic="t.voice.commands")
    run_agent(ctx, "voice_commands_agent", ev)
    assert ev.acks == [3] and halts == []
    [(topic, _k, _v, headers)] = producer.sent
    assert topic == "t.voice.commands.dlq" and headers["ce_id"] == b"stray-1"
    assert ("no writer takes 'voice.conversation.started.v1' on 't.voice.commands'"
            in headers["voice_dlq_reason"].decode())
    # Unprocessable: dead-lettered on the first attempt, not retried.
    assert headers["voice_dlq_reason"].startswith(b"voice_commands_agent failed after 1 attempt:")


def test_a_workflow_kind_nobody_runs_is_dead_lettered_not_logged_and_committed() -> None:
    """Regression: the runtime logged 'no workflow kind' and acknowledged the record."""
    ctx, producer, halts = worker()
    started = Envelope(record=WorkflowStarted(workflow="wf-x", kind="no-such-kind"),
                       key="wf-x", source="/test", seq=1, id="wf-x:1")
    ev = event(5, started, topic="t.voice.workflows")
    run_agent(ctx, "voice_workflows_agent", ev)
    assert ev.acks == [5] and halts == []
    [(topic, _k, _v, headers)] = producer.sent
    assert topic == "t.voice.workflows.dlq"
    assert b"no workflow kind 'no-such-kind'" in headers["voice_dlq_reason"]
    # The delivery watcher reads the same topic and leaves dead letters to the runtime.
    ev2 = event(5, started, topic="t.voice.workflows")
    run_agent(ctx, "staff_workflow_watch", ev2)
    assert ev2.acks == [5] and len(producer.sent) == 1


def test_the_worker_consumes_exactly_the_topics_marked_read_by_workers() -> None:
    """Decision 0016: an aggregate's log is not consumed by its own worker — its writer tells
    it what it put there — so no worker dedupes a log's records by seq any more (one without
    a seq was the regression of three consumers: skipped, applied twice, misordered). And
    the sink dead-letters the undecodable records of exactly the topics no worker reads."""
    ctx, _producer, _halts = worker()
    read = {t for agent in ctx.app.agents.values() for t in agent.channel.topics}
    assert read == {topic_name(SETTINGS, s) for s in TOPICS if s.read_by_workers}
    assert read == {"t.voice.commands", "t.voice.workflows"}


def test_undecodable_bytes_are_dead_lettered_once_per_topic() -> None:
    ctx, producer, _ = worker()
    run_agent(ctx, "voice_workflows_agent", event(1, value=b"\xff", topic="t.voice.workflows"))
    run_agent(ctx, "staff_workflow_watch", event(1, value=b"\xff", topic="t.voice.workflows"))
    assert [t for t, *_ in producer.sent] == ["t.voice.workflows.dlq"]
    assert producer.reasons() == ["ce_specversion is None, expected '1.0'"]


def test_a_handler_whose_produce_fails_is_retried_then_dead_lettered_not_committed_past(
) -> None:
    """Regression: ``wire`` logged the exception and Faust committed the offset, so a turn
    whose ``WorkflowStarted`` the broker refused was gone without a trace."""
    ctx, producer, halts = worker(consumer_retry_attempts=3)
    calls: list[int] = []

    async def start_turn(env: Envelope, _event: Any) -> None:
        calls.append(env.seq or 0)
        raise ProduceError("produce to 't.voice.workflows' failed: Broker: Message size too "
                           "large", retryable=False)

    ctx.wire(CONVERSATIONS, start_turn, agent_name="turn_starter", dead_letter=False)
    rec = TurnRequested(conversation=CNV, turn=f"{CNV}:turn-2", message_seq=2)
    ev = event(4, Envelope(record=rec, key=CNV, source="/test", seq=3, id="tr-1"))
    run_agent(ctx, "turn_starter", ev)
    assert calls == [3] and ev.acks == [4] and halts == []  # refused for good: one attempt
    assert producer.reasons() == ["turn_starter failed after 1 attempt: ProduceError: produce "
                                  "to 't.voice.workflows' failed: Broker: Message size too "
                                  "large"]

    flaky = Flaky(ProduceError("Local: Broker transport failure", retryable=True),
                  ProduceError("Local: Broker transport failure", retryable=True))

    async def start_turn_later(env: Envelope, _event: Any) -> None:
        await flaky()

    ctx.wire(WORKFLOWS, start_turn_later, agent_name="flaky", dead_letter=False)
    ev = event(5, Envelope(record=rec, key=CNV, source="/test", seq=4, id="tr-2"))
    run_agent(ctx, "flaky", ev)
    assert flaky.calls == 3 and ev.acks == [5] and len(producer.sent) == 1  # handled at last


def test_the_worker_stops_without_acking_when_not_even_the_dead_letter_goes() -> None:
    ctx, producer, halts = worker()
    producer.failures = 10**6
    ev = event(6, value=b"\xff", topic="t.voice.commands")
    run_agent(ctx, "voice_commands_agent", ev)
    assert ev.acks == [] and len(halts) == 1 and isinstance(halts[0], Halt)
    assert "t.voice.commands[0]@6 could be neither processed" in str(halts[0])


def test_a_record_counts_as_in_flight_while_it_is_handled_and_not_after() -> None:
    """What a worker's handover waits for (``VoiceApp``): the records being handled — a held
    one (the workflow lease) is not, once its handler returned; a failing one is until it is
    dead-lettered."""
    from consumers.frame.failures import InFlight

    producer = FakeProducer()
    guard = RecordGuard("a", lambda: producer, RetryPolicy(2, 0, 0), Sleeps())
    in_flight = InFlight()
    during: list[list[int | None]] = []

    async def dispatch(r: Raw, _event: Any) -> None:
        during.append([x.offset for x in in_flight.records()])
        if r.value == b"poison":
            raise ValueError("cannot apply")

    evs = [event(0, value=b"ok"), event(1, value=b"poison"), event(2, value=b"held")]
    asyncio.run(consume(events_of(*evs), "t", guard, dispatch, True, _no_halt, in_flight))
    assert during == [[0], [1], [1], [2]]
    assert in_flight.records() == [] and evs[2].acks == []


def test_a_partition_assigned_but_left_out_of_the_fetch_is_found() -> None:
    """What ``VoiceApp.resume_unfetched`` puts back after a rebalance (fault 4): assigned
    stream partitions neither fetched nor held back for a full buffer; changelogs are the
    recovery's to read."""
    from faust.types import TP

    from consumers.frame.handover import unfetched

    a0, a1, a2, cl = TP("t.c", 0), TP("t.c", 1), TP("t.c", 2), TP("t.c-changelog", 1)
    assert unfetched({a0, a1, a2, cl}, {"t.c-changelog"}, {a0}, {a2}) == {a1}
    assert unfetched({a0, cl}, {"t.c-changelog"}, {a0}, set()) == set()


# --- lanes: the writer's aggregates at once, each one's commands in order ------------------


def keyed(offset: int, key: bytes, value: bytes = b"ok") -> Event:
    return Event(Message(offset % 3, offset, key, value, {}, "t.voice.commands"))


def test_records_of_different_lanes_are_handled_at_once_each_acked_when_done() -> None:
    """Regression: the writer handled one command at a time across all its partitions, each
    waiting on the broker for its records, so every command queued behind all the others."""
    from consumers.frame.failures import by_key

    guard = RecordGuard("a", FakeProducer, RetryPolicy(1, 0, 0), Sleeps())
    b_done = asyncio.Event()
    order: list[int] = []

    async def dispatch(r: Raw, _event: Any) -> None:
        if r.key == b"a":  # waits on the broker; b's command must not wait behind it
            await asyncio.wait_for(b_done.wait(), 10)
        else:
            b_done.set()
        order.append(r.offset or 0)

    evs = [keyed(0, b"a"), keyed(1, b"b")]
    asyncio.run(consume(events_of(*evs), "t", guard, dispatch, False, _no_halt, lane=by_key))
    assert order == [1, 0] and [e.acks for e in evs] == [[0], [1]]


def test_one_lanes_records_are_handled_in_order_and_a_failing_one_is_dead_lettered() -> None:
    from consumers.frame.failures import InFlight, by_key

    producer = FakeProducer()
    guard = RecordGuard("a", lambda: producer, RetryPolicy(1, 0, 0), Sleeps())
    in_flight = InFlight()
    seen: list[tuple[bytes | None, int | None]] = []
    most = 0

    async def dispatch(r: Raw, _event: Any) -> None:
        nonlocal most
        most = max(most, len(in_flight.records()))
        await asyncio.sleep(0.03 if r.offset in (0, 3) else 0)  # the first ones are slowest
        if r.value == b"poison":
            raise Unprocessable("impossible")
        seen.append((r.key, r.offset))

    evs = [keyed(0, b"a"), keyed(1, b"b"), keyed(2, b"a", b"poison"), keyed(3, b"b"),
           keyed(4, b"a"), keyed(5, b"b")]
    asyncio.run(consume(events_of(*evs), "t", guard, dispatch, False, _no_halt, in_flight,
                        lane=by_key, window=4))
    assert [o for k, o in seen if k == b"a"] == [0, 4]  # 2 dead-lettered, in its place
    assert [o for k, o in seen if k == b"b"] == [1, 3, 5]
    assert [e.acks for e in evs] == [[0], [1], [2], [3], [4], [5]]
    assert producer.reasons() == ["a failed after 1 attempt: Unprocessable: impossible"]
    assert 1 < most <= 4 and in_flight.records() == []  # at once, within the window


def test_a_lane_that_halts_stops_the_agent_and_its_record_is_never_acked() -> None:
    from consumers.frame.failures import by_key

    producer = FakeProducer(failures=10**6)  # no dead letter goes
    guard = RecordGuard("a", lambda: producer, RetryPolicy(1, 0, 0), Sleeps())
    halts: list[Halt] = []

    async def halt(exc: Halt) -> None:
        halts.append(exc)

    async def dispatch(r: Raw, _event: Any) -> None:
        if r.key == b"a":
            raise ValueError("cannot apply")

    evs = [keyed(0, b"a"), keyed(1, b"a")]
    asyncio.run(consume(events_of(*evs), "t", guard, dispatch, False, halt, lane=by_key))
    assert len(halts) == 1 and evs[0].acks == [] and evs[1].acks == []


def test_the_worker_parses_its_crash_points_once_for_every_part_that_has_one() -> None:
    ctx, _producer, _halts = worker(test_crash_at="before_step@cnv-a, before_follow_ups")
    assert ctx.crash.armed("before_step", "cnv-a:turn-2")
    products = [p for p in ctx.products if hasattr(p, "crash")]  # the assistant
    turns = [p.turns for p in ctx.products if hasattr(p, "turns")]  # the conversations'
    parts = [ctx.runtime, ctx.agents, ctx.writer, *products, *turns]
    assert products and turns and all(part.crash is ctx.crash for part in parts)
