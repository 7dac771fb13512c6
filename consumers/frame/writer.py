"""The single writer of every aggregate: one runner, one order, for all of them.

For each record of ``voice.commands`` (consumed by one agent, key = the aggregate id, so one
aggregate's commands arrive in order at one writer):

1. **decode** — bytes that are not a record go to ``<topic>.dlq`` with the reason;
2. **route** — by record type, to the aggregate (or plain handler) that owns it; a type
   nobody owns goes to ``<topic>.dlq``;
3. **tenant, then dedupe** — a command of another tenant than the aggregate's is answered
   ``no such …`` (as if it did not exist) and applied nowhere; a command id the state
   remembers is answered again ("duplicate", with the detail it got the first time) and never
   re-applied;
4. **decide** — the aggregate's pure ``decide``; if it raises, the command goes to
   ``<topic>.dlq`` with the reason and the writer goes on; a state it makes gets the
   command's tenant;
5. **produce the records** (seq and id from the command) and **await their acks**; the
   aggregate is told where they landed (``Aggregate.placed``: partition and offset from the
   delivery reports), for a state that keeps positions of its own log;
5b. **produce what they start** (``Aggregate.follow_ups``: a turn's workflow, an index entry;
   decision 0016) and tell the hooks of the log (``on_recorded``), if any: the
   acknowledgement (7) first — what it announces is on the log, and the aggregate's next
   command waits for this one's table write all the same — then the follow-ups, awaited, then
   the hooks; tried until the broker takes them (a follow-up it refuses for good — too large
   for its topic — goes to ``<its topic>.dlq``, a record a hook fails on otherwise to
   ``<log>.dlq``, each with the reason, and the command goes on);
6. **write the table** (only once the records are on the log; if the broker refused them,
   see ``_not_recorded``: the seqs move on, the command is dead-lettered and answered
   rejected, retryable);
7. **produce the command's acknowledgement** (``CommandAcknowledged`` on ``voice.acks``),
   without waiting for its own delivery: the records it announces are durable and the table
   says so already, and waiting would cost every command a second broker round trip;
8. Faust commits the offset after the agent has moved on.

Anything else that fails (a table write, a plain handler's produce, a dead letter the broker
does not take) is raised to the agent, which retries the record and then dead-letters it — or
stops without committing it (``consumers.frame.failures``, decision 0008).

A crash before 6 redelivers the command against the old state: the same records with the same
ids and seqs (``decide`` is deterministic), which readers dedupe, and the same follow-ups under
the same ids (a workflow starts once; the index is a set). A crash between 6 and 7
redelivers it against the new state: step 3 answers it, so the edge still gets its ack. An
acknowledgement lost after the offset was committed costs its caller a 503 and a retry (with
the same idempotency key, answered ``duplicate``); it never announces records that are not on
the log. The edge waits on the ack and then on its view of the log, which holds the records.

It never calls a model and never opens sealed content.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaException

from consumers.frame.aggregate import Ack, Aggregate, Decision, seqs_of
from consumers.intake import dead_letter, decode_or_dead_letter
from schemas.base import Record
from schemas.system import CommandAcknowledged
from streams.crashpoints import CrashPoints
from streams.envelope import Envelope
from streams.free_text import describe, trace_of
from streams.producer import ProduceError, RecordProducer, deliver_all, too_large
from streams.retry import RetryPolicy, Unprocessable
from streams.topics import ACKS, TopicSpec, topic_name

log = logging.getLogger(__name__)

Output = tuple[TopicSpec, Envelope]
Remember = Callable[[TopicSpec, int, int, Envelope, int], None]
Recorded = Callable[[Envelope, int, int], Awaitable[None]]
Handler = Callable[[Envelope], Awaitable[None]]


class SeqMismatch(ValueError):
    """A ``decide`` returned records it did not ``append`` (a bug in that aggregate)."""

    plain_message = True  # names the aggregate and seqs, never the command's values


class Publishing(Protocol):
    """What the writer needs of ``streams.producer.Publisher`` (tests pass a fake)."""

    @property
    def producer(self) -> RecordProducer: ...

    def produce(self, spec: TopicSpec, env: Envelope) -> Awaitable[Any]: ...


@dataclass(frozen=True)
class Raw:
    """One record as it came off the broker."""

    topic: str
    partition: int | None
    offset: int | None
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] | None


def acknowledgement(cmd: Envelope, ack: Ack, source: str) -> Envelope:
    """The ``CommandAcknowledged`` of ``cmd`` (key = command id) the edge waits on."""
    return answer_to(cmd.id, cmd.key, cmd.tenant, cmd.correlation, ack, source)


def answer_to(command_id: str, aggregate: str, tenant: str | None, correlation: str | None,
              ack: Ack, source: str) -> Envelope:
    """``acknowledgement`` of a command known by its fields (one decided after its record was
    handled: a workflow's queued command)."""
    rec = CommandAcknowledged(command_id=command_id, aggregate=aggregate, outcome=ack.outcome,
                              seq=ack.seq, detail=ack.detail)
    return Envelope(record=rec, key=command_id, source=source, subject=aggregate,
                    tenant=tenant, correlation=correlation, causation=command_id,
                    id=f"{command_id}-ack")


def appended(agg: Aggregate[Any], cmd: Envelope, decision: Decision[Any]) -> list[Output]:
    """The envelopes of a decision's records: dense seqs ending at ``state.seq`` (a record
    that folds others holds one for each), ids and time from the command,
    tenant/correlation/causation copied from it."""
    if not decision.records or decision.state is None:
        return []
    seq = decision.state.seq - seqs_of(decision.records) + 1
    out: list[Output] = []
    for record in decision.records:
        out.append((agg.log, Envelope(
            record=record, key=cmd.key, source=agg.source, subject=cmd.key, seq=seq,
            tenant=cmd.tenant, correlation=cmd.correlation or cmd.id, causation=cmd.id,
            id=agg.record_id(cmd, seq, record), time=cmd.time)))
        seq += record.seqs
    return out


def landed(records: Sequence[Output], delivered: Sequence[object]
           ) -> list[tuple[TopicSpec, Envelope, int, int, int]]:
    """(topic, envelope, partition, offset, bytes of key and value) of each delivered record
    whose report says where."""
    out = []
    for (spec, env), report in zip(records, delivered, strict=False):
        partition = getattr(report, "partition", None)
        offset = getattr(report, "offset", None)
        if callable(partition) and callable(offset):
            p, o = partition(), offset()
            if isinstance(p, int) and isinstance(o, int) and o >= 0:
                out.append((spec, env, p, o, _size(report)))
                continue
        # Not from a broker that says where (acks=0, a stand-in): its aggregate does not learn
        # this record's position, which a reader by position then cannot find.
        log.warning("the delivery report of %s (seq %s) names no position", env.id, env.seq)
    return out


def _size(report: object) -> int:
    """The bytes of a delivered record's key and value, as its report gives them (0 if not)."""
    value, key = getattr(report, "len", None), getattr(report, "key", None)
    n = value() if callable(value) else 0
    k = key() if callable(key) else None
    return (n if isinstance(n, int) else 0) + (len(k) if isinstance(k, bytes) else 0)


def apply(agg: Aggregate[Any], state: Any, cmd: Envelope, *, owned: bool = False
          ) -> tuple[Any, list[Output], Envelope | None]:
    """Steps 3–4, pure: (new state, records to append, acknowledgement or None).

    Raises what ``decide`` raises. The given state is not modified — unless ``owned``: the
    caller gives it up (the writer, which loaded it from the table for this command alone),
    so ``decide`` gets it without the copy, which was most of a long conversation's cost.
    """
    if state is not None and state.tenant is not None and cmd.tenant != state.tenant:
        # A command naming another tenant's aggregate (a forged or misrouted one): answered
        # as if the aggregate did not exist, and nothing is applied.
        log.warning("%s %r belongs to tenant %r, not to command %s's %r", agg.name, cmd.key,
                    state.tenant, cmd.id, cmd.tenant)
        ack = Ack.rejected(f"no such {agg.what}") if agg.acknowledges(cmd) else None
        return state, [], None if ack is None else acknowledgement(cmd, ack, agg.source)
    memo = agg.remembered(state, cmd)
    if memo is not None:  # a redelivered command: answer it again, apply nothing
        ack = Ack.again(memo) if agg.acknowledges(cmd) else None
        return state, [], None if ack is None else acknowledgement(cmd, ack, agg.source)
    # Unless the caller gave it up (``owned``), a copy: ``decide`` changes what it gets.
    before = 0 if state is None else state.seq
    copy = state if owned or state is None else agg.load(agg.dump(state))
    decision = agg.decide(copy, cmd)
    if decision.records:
        after = -1 if decision.state is None else decision.state.seq
        if after != before + seqs_of(decision.records):  # a decide that did not ``append``
            raise SeqMismatch(f"{agg.name}: {len(decision.records)} records took seq "
                             f"{before!r} to {after!r}")
    if decision.state is not None and decision.state.tenant is None:
        decision.state.tenant = cmd.tenant  # made now (or before tenants were recorded)
    if decision.remembered and decision.state is not None:
        agg.remember(decision.state, cmd, decision.ack.memo() if decision.ack else {})
    ack = None if decision.ack is None else acknowledgement(cmd, decision.ack, agg.source)
    return decision.state, appended(agg, cmd, decision), ack


def outputs(agg: Aggregate[Any], state: Any, cmd: Envelope) -> tuple[Any, list[Output]]:
    """``apply`` as one list in produce order (records, then the acknowledgement)."""
    new, records, ack = apply(agg, state, cmd)
    return new, [*records, *([(ACKS, ack)] if ack is not None else [])]


def _refusal(exc: BaseException) -> Ack:
    """The answer to a command whose records the broker (or the client) refused."""
    if too_large(exc):
        return Ack.rejected("the log refused the command's records as too large for their "
                            "topic (its max.message.bytes, or VOICE_MAX_RECORD_BYTES); send "
                            "less", too_large=True)
    return Ack.rejected("could not record the command; try again", retryable=True)


class Writer:
    """Consumes one commands topic for every registered aggregate (see the module docstring)."""

    def __init__(self, publisher: Publishing, topic: str, backoff: RetryPolicy | None = None,
                 crash: CrashPoints | None = None, remember: Remember | None = None) -> None:
        """``backoff``: the waits between tries of a command's follow-ups (its ``attempts``
        do not apply: they are tried until they go); ``crash``: the test-only crash points;
        ``remember``: told each record put on an aggregate's log (topic, partition, offset,
        envelope, bytes), for this worker's steps to read back without a fetch."""
        self.publisher = publisher
        self.topic = topic
        self.remember = remember
        self.backoff = backoff or RetryPolicy()
        self.crash = crash or CrashPoints()
        self._owners: dict[type[Record], tuple[Aggregate[Any], MutableMapping[Any, Any]]] = {}
        self._handlers: dict[type[Record], Handler] = {}
        self._recorded: dict[TopicSpec, list[Recorded]] = {}
        self._acks: set[asyncio.Future[Any]] = set()
        """Acknowledgements on their way to the broker (held so they are not collected)."""

    def register(self, agg: Aggregate[Any], table: MutableMapping[Any, Any]) -> None:
        """Make ``agg`` the writer of its command types, its states kept in ``table``."""
        for type_ in agg.commands:
            self._claim(type_)
        for type_ in agg.commands:
            self._owners[type_] = (agg, table)

    def on_recorded(self, log: TopicSpec, hook: Recorded) -> None:
        """Tell ``hook`` each record put on ``log`` — (envelope, partition, offset) — once it
        is there and before its aggregate's state is written (step 5b): a crash in between
        tells it again, after the same records are put again. What a worker did as a consumer
        of its own writer's log, without the log's round trip (decision 0016)."""
        self._recorded.setdefault(log, []).append(hook)

    def route(self, types: tuple[type[Record], ...], handler: Handler) -> None:
        """Hand commands of ``types`` that no aggregate writes to ``handler``."""
        for type_ in types:
            self._claim(type_)
        for type_ in types:
            self._handlers[type_] = handler

    def _claim(self, type_: type[Record]) -> None:
        if type_ in self._owners or type_ in self._handlers:
            raise ValueError(f"command type {type_.__name__!r} already has a writer")

    async def receive(self, raw: Raw) -> None:
        """Steps 1–2: decode (or dead-letter) and route one record."""
        env = await decode_or_dead_letter(self.publisher.producer, raw.topic, raw.partition,
                                          raw.offset, raw.key, raw.value, raw.headers)
        if env is not None:
            await self.dispatch(env, raw)

    async def dispatch(self, env: Envelope, raw: Raw | None = None) -> None:
        """Step 2 for a decoded record. A record nobody owns is ``Unprocessable``: every
        worker runs every product, so no other writer will take it (it is dead-lettered)."""
        owner = self._owners.get(type(env.record))
        if owner is not None:
            await self.handle(owner[0], owner[1], env, raw)
            return
        handler = self._handlers.get(type(env.record))
        if handler is None:
            raise Unprocessable(f"no writer takes {env.type!r} on {self.topic!r}")
        await handler(env)

    async def handle(self, agg: Aggregate[Any], table: MutableMapping[Any, Any], cmd: Envelope,
                     raw: Raw | None = None) -> None:
        """Steps 3–7 for one command of ``agg``."""
        # A copy of the table's value, this command's own: decided on in place, stored once
        # its records are on the log (the table keeps the value before it until then).
        state = agg.load(table.get(cmd.key))
        try:
            new, records, ack = apply(agg, state, cmd, owned=True)
        except Exception as exc:  # a command that cannot be decided never stops the writer
            # Described, not quoted: an exception may echo the command's values.
            reason = f"{agg.name} could not decide {cmd.type!r}: {describe(exc)}"
            log.error("dead-lettering command %s (%s)\n%s", cmd.id, reason, trace_of(exc))
            await self._dead_letter(cmd, reason, raw)
            return
        try:
            delivered = await deliver_all(self.publisher.produce, records)
        except (ProduceError, KafkaException) as exc:  # the broker's (or client's) refusal
            await self._not_recorded(agg, table, new, cmd, raw, exc)
            return
        if new is not None:
            if records:
                ack = await self._placed(agg, new, cmd.key, landed(records, delivered), ack)
            table[cmd.key] = agg.dump(new)
        if ack is not None:
            self._send_ack(ack)

    async def _placed(self, agg: Aggregate[Any], new: Any, key: str,
                      found: list[tuple[TopicSpec, Envelope, int, int, int]],
                      ack: Envelope | None) -> Envelope | None:
        """The end of step 5 (each record remembered where it landed, the aggregate told),
        then 5b; returns the acknowledgement still to send (None once 5b sent it)."""
        if self.remember is not None:
            for spec, env, partition, offset, size in found:
                self.remember(spec, partition, offset, env, size)
        where = [(env, partition, offset) for _spec, env, partition, offset, _size in found]
        agg.placed(new, where)
        follow = agg.follow_ups(new, where)
        hooks = self._recorded.get(agg.log, ())
        if not (follow or hooks):
            return ack
        if ack is not None:  # what it announces is on the log (step 7, early)
            self._send_ack(ack)
        self.crash.hit("before_follow_ups", key)
        await self._until_taken(agg.log, follow, hooks, where)
        self.crash.hit("before_state_write", key)
        return None

    async def _until_taken(self, spec: TopicSpec, follow: list[Output],
                           hooks: Sequence[Recorded],
                           where: list[tuple[Envelope, int, int]]) -> None:
        """Step 5b: produce what the placed records start, awaited, and tell each hook of
        their log of each; again, backing off as the worker's consumers do, until the broker
        takes it all. The decided records are on the log already, so no answer can take them
        back: the command is held (its aggregate's next waits, its offset uncommitted) rather
        than written without what it started."""
        attempt = 0
        while True:
            try:
                if follow:
                    await self._follow(follow)
                for env, partition, offset in where:
                    for hook in hooks:
                        await self._tell(hook, spec, env, partition, offset)
                return
            except (ProduceError, KafkaException) as exc:
                attempt += 1
                delay = self.backoff.delay(attempt)
                log.warning("what %s started was not recorded (%s); trying again in %.1f s",
                            where[0][0].causation, describe(exc), delay)
                await asyncio.sleep(delay)

    async def _follow(self, follow: list[Output]) -> None:
        """Produce what the placed records start, awaited. One the broker refuses for good — too
        large for its topic, which no try can change — goes to ``<its topic>.dlq`` with the
        reason, as a hook's failure does, rather than holding its aggregate's commands for
        ever; any other refusal is raised, to be tried again."""
        try:
            await deliver_all(self.publisher.produce, follow)
            return
        except (ProduceError, KafkaException) as exc:
            if not too_large(exc):
                raise
        for spec, env in follow:  # one at a time: which of them the topic cannot take
            try:
                await self.publisher.produce(spec, env)
            except (ProduceError, KafkaException) as exc:
                if not too_large(exc):
                    raise
                reason = (f"what {env.causation} started was refused for good: "
                          f"{describe(exc)}")
                log.error("%s", reason)
                await self._dead_letter_record(spec, env, reason)

    async def _tell(self, hook: Recorded, spec: TopicSpec, env: Envelope, partition: int,
                    offset: int) -> None:
        """``hook`` told of ``env``; a failure other than the broker's is not the command's.

        The command is decided and its records are on the log: were its state left unwritten
        (a hook's bug, an index value over the record bound), the aggregate's next command would
        be given the same seqs. So the record goes to ``<log>.dlq`` with the reason — as a
        consumer of the log sent a record it could not process — and the command goes on.
        """
        try:
            await hook(env, partition, offset)
        except Exception as exc:
            if isinstance(exc, ProduceError | KafkaException) and not too_large(exc):
                raise  # the broker's: tried again with what the command started
            name = getattr(hook, "__qualname__", type(hook).__name__)
            reason = f"{name} could not take {env.type!r}: {describe(exc)}"
            log.error("%s\n%s", reason, trace_of(exc))
            await self._dead_letter_record(spec, env, reason, partition, offset)

    async def _not_recorded(self, agg: Aggregate[Any], table: MutableMapping[Any, Any],
                            new: Any, cmd: Envelope, raw: Raw | None,
                            exc: BaseException) -> None:
        """The broker refused the command's records (after the producer's own retries).

        Some of them may be on the log all the same, so their seqs are never given again: the
        *old* state is kept with its seq moved past them. Not the decided state — it would
        remember the command (and its idempotency key) as applied. The command goes to the
        dead-letter topic with the reason and is answered rejected: retryable (a retry is
        decided afresh, under new seqs) — unless a record was refused as too large for its
        topic, which no retry can change: then the answer says so (the edge answers 413).
        """
        reason = f"{agg.name} could not record {cmd.type!r}: {describe(exc)}"
        if too_large(exc):
            reason += " (a record too large for its topic's max.message.bytes)"
        log.error("command %s not recorded: %s", cmd.id, reason)
        state = agg.load(table.get(cmd.key))  # as before the command: not written since
        if state is not None and new is not None:
            state.seq = new.seq
            table[cmd.key] = agg.dump(state)
        # Raised when it fails: the command is then neither recorded nor dead-lettered, so the
        # agent retries it (decided afresh under the new seqs) and never commits past it.
        await self._dead_letter(cmd, reason, raw)
        if agg.acknowledges(cmd):
            self._send_ack(acknowledgement(cmd, _refusal(exc), agg.source))

    async def _dead_letter_record(self, spec: TopicSpec, env: Envelope, reason: str,
                                  partition: int | None = None, offset: int | None = None
                                  ) -> None:
        """``env``, a record of ``spec`` (placed at ``partition``/``offset``, or never placed),
        to ``<its topic>.dlq`` with ``reason``."""
        await dead_letter(self.publisher.producer, topic_name(self.publisher.settings, spec),
                          env, reason, partition, offset)

    async def _dead_letter(self, cmd: Envelope, reason: str, raw: Raw | None) -> None:
        await dead_letter(self.publisher.producer, self.topic, cmd, reason,
                          raw.partition if raw else None, raw.offset if raw else None)

    def _send_ack(self, ack: Envelope) -> None:
        delivery = asyncio.ensure_future(self.publisher.produce(ACKS, ack))
        self._acks.add(delivery)
        delivery.add_done_callback(self._acked)

    def _acked(self, delivery: asyncio.Future[Any]) -> None:
        self._acks.discard(delivery)
        if not delivery.cancelled() and delivery.exception() is not None:
            # The command's records are on the log; its caller times out and retries.
            log.warning("an acknowledgement was not delivered: %s", delivery.exception())
