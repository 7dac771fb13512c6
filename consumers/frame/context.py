"""The worker as a typed context that products plug into.

A ``Product`` is a package of the worker (conversations, the assistant chat, staff) with one
method, ``register(ctx)``: it adds its aggregates (``ctx.aggregate``), tables (``ctx.table``),
workflows (``ctx.workflow``), consumers (``ctx.wire``), followers of a whole topic
(``ctx.follow``) and plain command handlers (``ctx.on_command``). ``WorkerContext`` owns
what they share: the settings, the Faust app, the one ``Publisher``, the sealer, the
workflow runtime, the agent runner (the one owner of the model client), the reader of records
by position (``log_reader``) and the writer of ``voice.commands``. Its tables refuse a value
over the record bound where it is set.

Records of ``voice.commands`` go to the aggregate that owns their record type (see
``consumers.frame.writer``); nothing routes them by hand. Every agent consumes through
``consumers.frame.failures``: a record it cannot process is retried, then dead-lettered, and
never committed past unless it was one or the other. It must never import a product.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from consumers.engine.runner import AgentRunner
from consumers.frame import state_dump
from consumers.frame.aggregate import Ack, Aggregate
from consumers.frame.bounded import TABLE_KEYS, BoundedTable
from consumers.frame.failures import Halt, Lane, RawDispatch, RecordGuard, Skip, by_key, consume
from consumers.frame.follow import Apply, Follower
from consumers.frame.handover import VoiceApp
from consumers.frame.janitor import Janitor
from consumers.frame.logrefs import KafkaLogReader
from consumers.frame.readiness import READY_CHECK_S, ReadyFile, faust_ready
from consumers.frame.writer import Raw, Writer, acknowledgement
from consumers.intake import decode_or_dead_letter, decode_or_none
from consumers.workflows.engine import WorkflowDef
from consumers.workflows.runtime import WorkflowRuntime
from consumers.workflows.steploop import StepLoop
from schemas.base import Record
from schemas.workflow import LeaseCheck, WorkflowCommandReceived
from streams.crashpoints import CrashPoints
from streams.envelope import Envelope
from streams.producer import Publisher, RecordProducer
from streams.retry import RetryPolicy
from streams.sealing import sealer_for
from streams.settings import VoiceSettings
from streams.topics import (
    ACKS,
    CHANGELOG_CONFIG,
    COMMANDS,
    TOPICS,
    WORKFLOWS,
    TopicSpec,
    topic_name,
)

log = logging.getLogger(__name__)

UNFETCHED_CHECK_S = 2.0
"""How often the worker checks that it reads every partition assigned to it."""

PARTITION_FETCH_BYTES = 8 * 1024 * 1024
"""At most this much of one partition per fetch (aiokafka's ``max_partition_fetch_bytes``;
Faust's default is 1 MiB). A backlog — a changelog read back, commands that queued while no
worker ran — is read a fetch at a time, and Faust's fetches wait up to 1.5 s on the
partitions that have nothing new: at 1 MiB a worker read a changelog of ~360-byte values back
at 2,900 records/s, at 8 MiB at 8,500 (then its own loop is the limit). A fetch of a few new
records is as small as before."""
Dispatch = Callable[[Envelope, Any], Awaitable[None]]
SOURCE = "/voice/worker"


class Product(Protocol):
    """A part of the worker that registers itself on the context."""

    name: str

    def register(self, ctx: WorkerContext) -> None:
        """Add tables, aggregates, workflows and consumers (once, before the app runs)."""


def faust_app(settings: VoiceSettings) -> VoiceApp:
    """The worker's Faust app (one per process; its group id comes from the settings)."""
    return VoiceApp(
        f"{settings.group_prefix}-{settings.topic_prefix}worker".replace(".", "-"),
        broker=f"kafka://{settings.bootstrap}",
        store="memory://",
        Table=BoundedTable,  # every table value's changelog record stays under the bound
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=settings.replication_factor,
        web_enabled=False,
        gapless_topics=[topic_name(settings, spec) for spec in TOPICS if not spec.compacted],
        changelog_linger_s=settings.worker_changelog_linger_s,
        fetch_wait_ms=settings.worker_fetch_wait_ms,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        broker_commit_every=100,
        broker_commit_interval=0.5,
        # A dead worker's partitions move on within ~10 s; a model call never needs the
        # poll loop (steps run as tasks), so these can stay short.
        broker_session_timeout=10,
        broker_heartbeat_interval=2,
        broker_max_poll_interval=settings.worker_max_poll_interval_s,
        # A handover waits for the records in flight, so that their table writes reach the
        # changelog before the next owner recovers it — ``VoiceApp``'s own bounded wait (the
        # held leases of running steps released first), not Faust's, which has no bound.
        stream_wait_empty=False,
        table_standby_replicas=settings.worker_standby_replicas,
        consumer_max_fetch_size=PARTITION_FETCH_BYTES,
    )


class WorkerContext:
    """What every product of one worker shares, and how it plugs in."""

    def __init__(self, settings: VoiceSettings, client: Any = None) -> None:
        """``client`` replaces the model client for every agent (a ``ModelPort`` fake)."""
        self.settings = settings
        self.app = faust_app(settings)
        self._producer: RecordProducer | None = None
        self.publisher = Publisher(settings, lambda: self.producer)
        self.sealer = sealer_for(settings)
        self.crash = CrashPoints.parse(settings.test_crash_at)
        """Where this worker kills itself (tests only; ``streams.crashpoints``), parsed once
        for every part that has a point."""
        self.agents = AgentRunner(settings, lambda: self.producer, self.sealer, client=client,
                                  crash=self.crash)
        self.log_reader = KafkaLogReader(settings)
        """Reads an aggregate's records back by position (what a step's input refers to)."""
        self.on_shutdown(self.log_reader.close)
        self.steps = StepLoop() if settings.worker_step_thread else None
        """Where steps run: a loop of their own, so none delays the writer (0007's acks)."""
        self.runtime = WorkflowRuntime(settings, self.table("workflows", held=True),
                                       self.publisher, self.sealer, steps=self.steps,
                                       crash=self.crash, in_flight=self.app.in_flight)
        self.app.before_handover.append(self.runtime.release_leases)
        self.retry_policy = RetryPolicy.from_settings(settings)
        self.writer = Writer(self.publisher, topic_name(settings, COMMANDS), self.retry_policy,
                             self.crash,
                             self.log_reader.produced)
        self.janitor = Janitor(settings.topic_partitions)
        """Ends the turns of this worker's aggregates that are past their deadline."""
        self.products: list[Product] = []
        self.guards: dict[str, RecordGuard] = {}
        """Each agent's guard, by agent name (its dead-letter count)."""
        self.on_command((WorkflowCommandReceived,), self._forward_workflow_command)
        # One lane per aggregate: its commands in order, different aggregates' at once
        # (each command waits on the broker for its records before it is acknowledged).
        self.wire_raw(COMMANDS, self._on_command_record, agent_name="voice_commands_agent",
                      lane=by_key)
        self.wire(WORKFLOWS, self._on_workflow_record, manual_ack=True,
                  skip=self.runtime.already_applied)
        self._lifecycle()

    @property
    def producer(self) -> RecordProducer:
        if self._producer is None:  # created lazily inside the worker's event loop
            self._producer = RecordProducer(self.settings)
        return self._producer

    # --- what products call -------------------------------------------------------------

    def register(self, *products: Product) -> None:
        """Register products, in order."""
        for product in products:
            product.register(self)
            self.products.append(product)

    def table(self, name: str, held: bool = False) -> Any:
        """A changelog-backed Faust table (default ``None``), partitioned like the topics; a
        value whose changelog record would be over ``VOICE_MAX_RECORD_BYTES`` is refused
        where it is set (``consumers.frame.bounded``). ``held``: its changelog records are
        held back until a commit covers them (``consumers.frame.write_behind``) — only for a
        table whose records, handled again after a crash without its writes, make no record
        twice on a log a reader sees."""
        table = self.app.Table(name, default=None, partitions=self.settings.topic_partitions,
                               extra_topic_configs=CHANGELOG_CONFIG)
        # Faust takes a key codec only from a key type. Every changelog record is sent with
        # the table's (``changelog_key``); recovery decodes keys as JSON, whichever wrote them.
        table.key_serializer = TABLE_KEYS
        table.max_bytes = self.settings.max_record_bytes
        table.held_back = held
        return table

    def aggregate(self, agg: Aggregate[Any]) -> Any:
        """Make the writer run ``agg`` for its command types; returns its table."""
        table = self.table(agg.name)
        self.writer.register(agg, table)
        self.janitor.watch(agg, table)
        return table

    def on_recorded(self, log: TopicSpec, hook: Callable[[Envelope, int, int], Awaitable[None]]
                    ) -> None:
        """Tell ``hook`` each record this worker's writer puts on ``log`` (an aggregate's),
        with its partition and offset, before its aggregate's state is written
        (``Writer.on_recorded``): instead of consuming the log the writer just wrote."""
        self.writer.on_recorded(log, hook)

    def workflow(self, *definitions: WorkflowDef) -> None:
        """Register workflow kinds with the runtime."""
        for definition in definitions:
            self.runtime.register(definition)

    def on_command(self, types: tuple[type[Record], ...],
                   handler: Callable[[Envelope], Awaitable[None]]) -> None:
        """Hand commands of ``types`` that no aggregate owns to ``handler``."""
        self.writer.route(types, handler)

    def follow(self, spec: TopicSpec, apply: Apply, name: str,
               types: frozenset[str] | None = None) -> Follower:
        """Apply every record of ``spec`` (of ``types`` only, when given) — all partitions,
        not only this worker's — to an in-memory view, on the follower's own thread from the
        worker's start (``consumers.frame.follow``)."""
        follower = Follower(self.settings, spec, apply, name, types)

        @self.app.task
        async def _start() -> None:
            follower.start()

        self.on_shutdown(follower.stop)
        return follower

    def on_shutdown(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the worker stops."""

        @self.app.on_before_shutdown.connect
        async def _stop(app: Any, **kw: Any) -> None:  # noqa: ARG001
            fn()

    def wire(self, spec: TopicSpec, dispatch: Dispatch, manual_ack: bool = False,
             agent_name: str | None = None, dead_letter: bool = True,
             skip: Skip | None = None) -> None:
        """Run ``dispatch(envelope, event)`` for every decodable record of ``spec``.

        Several agents may read one topic (each names itself); exactly one of them — the
        topic's first, ``dead_letter=True`` — sends undecodable records to the DLQ. Failures
        of ``dispatch`` are retried, then dead-lettered, as ``wire_raw`` says. An aggregate's
        own log is not consumed: its writer tells what it put there (``on_recorded``). A
        record ``skip`` picks is acknowledged undecoded (``consumers.frame.failures.consume``).
        """

        async def on_raw(raw: Raw, event: Any) -> None:
            if dead_letter:
                env = await decode_or_dead_letter(self.producer, raw.topic, raw.partition,
                                                  raw.offset, raw.key, raw.value, raw.headers)
            else:
                env = decode_or_none(raw.key, raw.value, raw.headers)
            if env is None:
                if manual_ack:
                    event.ack()
                return
            await dispatch(env, event)

        self.wire_raw(spec, on_raw, manual_ack, agent_name, skip=skip)

    def wire_raw(self, spec: TopicSpec, dispatch: RawDispatch, manual_ack: bool = False,
                 agent_name: str | None = None, lane: Lane | None = None,
                 skip: Skip | None = None) -> None:
        """Run ``dispatch(raw, event)`` for every record of ``spec``, undecoded.

        A record ``dispatch`` fails on is retried (``VOICE_CONSUMER_RETRY_*``), then sent to
        ``<topic>.dlq`` with the reason, and the agent goes on; if even the dead letter fails,
        the worker stops without committing it (``consumers.frame.failures``). With
        ``manual_ack`` the handler acknowledges what it handled (when it is done with it).
        With ``lane`` records of different lanes are handled at once, each lane's in order
        (``consumers.frame.failures.consume``).
        """
        name = topic_name(self.settings, spec)
        topic = self.app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                               value_serializer="raw", partitions=self.settings.topic_partitions)
        agent_name = agent_name or f"{spec.name.replace('.', '_')}_agent"
        guard = RecordGuard(agent_name, lambda: self.producer, self.retry_policy)
        self.guards[agent_name] = guard

        async def agent(stream: Any) -> None:
            # Never acknowledged by the stream: ``consume`` acknowledges a record once it is
            # handled or dead-lettered, and never one that is neither.
            await consume(stream.noack().events(), name, guard, dispatch, manual_ack,
                          self._halt, self.app.in_flight, lane=lane, skip=skip)

        agent.__name__ = agent_name
        self.app.agent(topic, name=agent_name)(agent)

    async def _halt(self, exc: Halt) -> None:
        """Stop the worker: a record could be neither processed nor dead-lettered."""
        await self.app.crash(exc)

    # --- what the context itself consumes ---------------------------------------------------

    async def _on_command_record(self, raw: Raw, event: Any) -> None:  # noqa: ARG002
        await self.writer.receive(raw)

    async def _forward_workflow_command(self, env: Envelope) -> None:
        rec = env.record
        assert isinstance(rec, WorkflowCommandReceived)
        # Forward to the workflow's own log, where its single owner decides it and answers
        # (``consumers.workflows.commands``): the edge learns accepted or refused and why.
        # A cancel is a signal, not a decision — answered here, once it is on that log.
        await self.publisher.send(WORKFLOWS, Envelope(
            record=rec, key=rec.workflow, source=SOURCE, subject=rec.workflow,
            tenant=env.tenant, correlation=env.correlation, causation=env.id, id=env.id))
        if rec.command == "cancel":
            await self.publisher.send(ACKS, acknowledgement(
                env, Ack.accepted(None, workflow=rec.workflow, command=rec.command), SOURCE))

    async def _on_workflow_record(self, env: Envelope, event: Any) -> None:
        await self.runtime.handle(env, event.ack, event.message.tp, event.message.offset)

    def close(self) -> None:
        """Let go of what the context holds: the steps' loop, the producer, the key store's
        reader (its consumer is made with the context). The worker's shutdown calls it; so
        does a test that builds a context without running it."""
        if self.steps is not None:
            self.steps.close()
        if self._producer is not None:
            self._producer.close()
        self.sealer.close()

    def _lifecycle(self) -> None:
        @self.app.timer(1.0)
        async def _lease_check() -> None:
            # Running workflows of our partitions with no local task (their worker died):
            # probe each through the log, where the agent resumes it.
            topic = topic_name(self.settings, WORKFLOWS)
            active = {tp.partition for tp in self.app.assignor.assigned_actives()
                      if tp.topic == topic}
            for workflow in self.runtime.unheld(active, self.settings.topic_partitions,
                                                faust_ready(self.app)):
                await self.publisher.send(WORKFLOWS, Envelope(
                    record=LeaseCheck(workflow=workflow), key=workflow, source=SOURCE,
                    subject=workflow, correlation=workflow))
            # Workflows ended long ago: forgotten through the log too, where only their
            # partition's owner writes the table.
            for forgotten in self.runtime.forgettable():
                first = forgotten.workflows[0]
                await self.publisher.send(WORKFLOWS, Envelope(
                    record=forgotten, key=first, source=SOURCE, subject=first))

        @self.app.timer(self.settings.janitor_interval_s)
        async def _janitor() -> None:
            # Turns past their deadline, of the aggregates whose writer runs here.
            topic = topic_name(self.settings, COMMANDS)
            active = {tp.partition for tp in self.app.assignor.assigned_actives()
                      if tp.topic == topic}
            try:
                for env in self.janitor.due(active, datetime.now(UTC)):
                    await self.publisher.send(COMMANDS, env)
            except Exception:  # the next pass tries again; the timer must not die
                log.exception("the janitor's pass failed")

        if self.app.write_behind.holds:
            @self.app.timer(min(self.app.write_behind.linger_s / 4, 0.5))
            async def _send_held_writes() -> None:
                # Held no longer than about the linger, however long a step runs.
                self.app.write_behind.send_lingering()

        @self.app.timer(UNFETCHED_CHECK_S)
        async def _fetch_check() -> None:
            self.app.resume_unfetched()
            await self.app.reread_holes()

        if self.settings.worker_ready_file is not None:
            shown = ReadyFile(self.settings.worker_ready_file)
            self.on_shutdown(shown.close)

            @self.app.timer(READY_CHECK_S)
            async def _readiness() -> None:
                shown.show(faust_ready(self.app))

        @self.app.task
        async def _state_on_request() -> None:
            # ``kill -USR1 <pid>``: what the worker holds and where it waits, logged.
            state_dump.install(
                {"runtime": self.runtime.snapshot, "consumer": self.app.snapshot},
                {"worker": asyncio.get_running_loop,
                 "steps": lambda: self.steps.started if self.steps is not None else None})

        @self.app.on_partitions_assigned.connect
        async def _assigned(app: Any, assigned: set[Any], **kw: Any) -> None:  # noqa: ARG001
            self.runtime.keep_only(set(assigned))

        @self.app.on_before_shutdown.connect
        async def _close(app: Any, **kw: Any) -> None:  # noqa: ARG001
            # Running steps stop now: their records stay unacknowledged, so the partitions'
            # next owner resumes them (a shutdown never waits for a model call).
            self.runtime.keep_only(set())
            self.close()
