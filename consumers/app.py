"""The worker process: a Faust app whose agents run Voice's consumers.

Agents read raw bytes and decode through ``consumers.intake`` (bad records → DLQ). Records are
produced with the shared confluent-kafka producer and acknowledged by the broker *before* the
agent moves on, so Faust commits an offset only after its outputs are on the log
(at-least-once; readers dedupe by record id or per-aggregate seq). Workflow records are
acknowledged only when their step is done (see ``consumers.workflows.runtime``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import faust

from consumers.agents.concern import (
    ConcernReply,
    IssueCatalog,
    MemoryIssueCatalog,
    concern_spec,
    run_concern_extraction,
)
from consumers.assistant import Assistant
from consumers.engine import KafkaEffectSink
from consumers.intake import decode_or_dead_letter, decode_or_none
from consumers.model_client import model_client
from consumers.sequencer import ConversationState, sequence
from consumers.staff import Staff
from consumers.turns import Turns
from consumers.workflows.runtime import WorkflowRuntime
from schemas.workflow import LeaseCheck, WorkflowCommandReceived
from streams.envelope import Envelope, encode
from streams.producer import RecordProducer
from streams.sealing import sealer_for
from streams.settings import VoiceSettings
from streams.topics import COMMANDS, CONVERSATIONS, WORKFLOWS, TopicSpec, topic_name

log = logging.getLogger(__name__)

Dispatch = Callable[[Envelope, Any], Awaitable[None]]


class Worker:
    """The Faust app, the producer, the tables and the handlers of each topic it reads."""

    def __init__(self, settings: VoiceSettings, agent: Any = None) -> None:
        self.settings = settings
        self.app = faust.App(
            f"{settings.group_prefix}-{settings.topic_prefix}worker".replace(".", "-"),
            broker=f"kafka://{settings.bootstrap}",
            store="memory://",
            topic_partitions=settings.topic_partitions,
            topic_replication_factor=settings.replication_factor,
            web_enabled=False,
            consumer_auto_offset_reset="earliest",
            producer_acks=-1,
            broker_commit_every=100,
            broker_commit_interval=0.5,
            # A dead worker's partitions move on within ~10 s; a model call never needs the
            # poll loop (steps run as tasks), so these can stay short.
            broker_session_timeout=10,
            broker_heartbeat_interval=2,
        )
        self._producer: RecordProducer | None = None
        self.sealer = sealer_for(settings)
        tables = {"partitions": settings.topic_partitions}
        self.conversations = self.app.Table("conversations", default=None, **tables)
        self.transcripts = self.app.Table("transcripts", default=None, **tables)
        self.workflows = self.app.Table("workflows", default=None, **tables)
        self.runtime = WorkflowRuntime(settings, self.workflows, lambda: self.producer)
        self.turns = Turns(settings, self.transcripts, self.sealer, lambda: self.producer,
                           agent or self._concern_agent)
        self.runtime.register(self.turns.definition)
        self._client: Any = None
        self.staff = Staff(self, settings)
        self.staff.register()
        self.assistant = Assistant(self, settings)
        self.assistant.register()
        self.issues: IssueCatalog = MemoryIssueCatalog()
        self.concern_spec = concern_spec(settings, self.issues)

        self.wire(COMMANDS, self._on_command)
        self.wire(CONVERSATIONS, self._on_conversation_record)
        self.wire(WORKFLOWS, self._on_workflow_record, manual_ack=True)

        @self.app.timer(1.0)
        async def _lease_check() -> None:
            # Running workflows of our partitions with no local task (their worker died):
            # probe each through the log, where the agent resumes it.
            topic = topic_name(self.settings, WORKFLOWS)
            active = {tp.partition for tp in self.app.assignor.assigned_actives()
                      if tp.topic == topic}
            for workflow in self.runtime.unheld(active, self.settings.topic_partitions):
                await self._produce(WORKFLOWS, Envelope(
                    record=LeaseCheck(workflow=workflow), key=workflow,
                    source="/voice/worker", subject=workflow, correlation=workflow))

        @self.app.on_partitions_assigned.connect
        async def _assigned(app: Any, assigned: set[Any], **kw: Any) -> None:  # noqa: ARG001
            self.runtime.keep_only(set(assigned))

        @self.app.on_before_shutdown.connect
        async def _close(app: Any, **kw: Any) -> None:  # noqa: ARG001
            # Running steps stop now: their records stay unacknowledged, so the partitions'
            # next owner resumes them (a shutdown never waits for a model call).
            self.runtime.keep_only(set())
            if self._producer is not None:
                self._producer.close()

    @property
    def producer(self) -> RecordProducer:
        if self._producer is None:  # created lazily inside the worker's event loop
            self._producer = RecordProducer(self.settings)
        return self._producer

    def wire(self, spec: TopicSpec, dispatch: Dispatch, manual_ack: bool = False,
             agent_name: str | None = None, dead_letter: bool = True) -> None:
        """Run ``dispatch(envelope, event)`` for every decodable record of ``spec``.

        Several agents may read one topic (each names itself); exactly one of them — the
        topic's first, ``dead_letter=True`` — sends undecodable records to the DLQ.
        """
        name = topic_name(self.settings, spec)
        topic = self.app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                               value_serializer="raw", partitions=self.settings.topic_partitions)

        async def agent(stream: Any) -> None:
            source = stream.noack() if manual_ack else stream
            async for event in source.events():
                msg = event.message
                headers = (list(msg.headers.items()) if isinstance(msg.headers, dict)
                           else msg.headers)
                try:
                    if dead_letter:
                        env = await decode_or_dead_letter(
                            self.producer, name, msg.partition, msg.offset, msg.key, msg.value,
                            headers)
                    else:
                        env = decode_or_none(msg.key, msg.value, headers)
                    if env is not None:
                        await dispatch(env, event)
                    elif manual_ack:
                        event.ack()
                except Exception:  # one record never stops the consumer
                    log.exception("record %s[%s]@%s failed", name, msg.partition, msg.offset)
                    if manual_ack:
                        event.ack()

        agent.__name__ = agent_name or f"{spec.name.replace('.', '_')}_agent"
        self.app.agent(topic, name=agent.__name__)(agent)

    def _produce(self, spec: TopicSpec, env: Envelope) -> Any:
        key, value, headers = encode(env)
        return self.producer.produce_raw(topic_name(self.settings, spec), key, value, headers)

    async def _on_command(self, env: Envelope, event: Any) -> None:  # noqa: ARG002
        if env.type.startswith("voice.conversation."):
            await self._sequence(env)
        elif isinstance(env.record, WorkflowCommandReceived):
            # Forward to the workflow's own log, where its single owner applies it.
            await self._produce(WORKFLOWS, Envelope(
                record=env.record, key=env.record.workflow, source="/voice/worker",
                subject=env.record.workflow, tenant=env.tenant, correlation=env.correlation,
                causation=env.id, id=env.id))
        await self.staff.on_command(env)

    async def _sequence(self, cmd: Envelope) -> None:
        state = ConversationState.from_dict(self.conversations.get(cmd.key))
        new_state, outputs = sequence(state, cmd)
        # Outputs first, table second: a crash in between replays the command to the same seqs.
        futures = [self._produce(spec, env) for spec, env in outputs]
        for fut in futures:
            await fut
        if new_state is not None:
            self.conversations[cmd.key] = new_state.to_dict()

    async def _on_conversation_record(self, env: Envelope, event: Any) -> None:  # noqa: ARG002
        await self.turns.on_conversation_record(env)

    async def _on_workflow_record(self, env: Envelope, event: Any) -> None:
        await self.runtime.handle(env, event.ack, event.message.tp, event.message.offset)

    async def _concern_agent(self, conversation: str, turn: str, attempt: int,
                             history: list[dict[str, Any]], cancel: Any) -> ConcernReply:
        if self._client is None:
            self._client = model_client(self.settings)
        sink = KafkaEffectSink(self.producer, self.settings, turn, self.sealer)
        return await run_concern_extraction(self.concern_spec, self._client, sink,
                                            conversation, turn, attempt, history, cancel)


def declare_changelogs(worker: Worker) -> None:
    """Create every table's changelog topic before the app starts.

    Faust creates them at start, racing its consumer's first metadata snapshot; a table whose
    changelog missed it fails every write (``PartitionsMismatch``) until the next metadata
    refresh, minutes later. Best effort: Faust still creates whatever is missing.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    s = worker.settings
    try:
        admin = AdminClient({"bootstrap.servers": s.bootstrap})
        new = [NewTopic(t.changelog_topic.get_topic_name(), num_partitions=s.topic_partitions,
                        replication_factor=s.replication_factor,
                        config={"cleanup.policy": "compact"})
               for t in worker.app.tables.values()]
        for name, fut in admin.create_topics(new, operation_timeout=10).items():
            try:
                fut.result(timeout=15)
            except Exception as exc:
                if "already exists" not in str(exc) and "TOPIC_ALREADY_EXISTS" not in str(exc):
                    log.warning("could not create %s now (Faust will): %s", name, exc)
    except Exception as exc:
        log.warning("could not create the changelog topics now (Faust will): %s", exc)


def create_worker(settings: VoiceSettings, agent: Any = None) -> Worker:
    """Build a worker (Faust app + agents) for the given settings."""
    return Worker(settings, agent)


def run_worker(settings: VoiceSettings, loglevel: str = "warning") -> None:
    """Run the worker in the foreground until SIGINT/SIGTERM."""
    from faust.worker import Worker as FaustWorker

    w = create_worker(settings)
    declare_changelogs(w)
    fw = FaustWorker(w.app, loglevel=loglevel, quiet=True)
    # Faust's spinner sets the root logger to DEBUG, so every debug call of aiokafka and Faust
    # builds a record nobody prints: ~6 % of a worker's CPU (docs/benchmarks.md).
    fw.spinner = None
    fw.execute_from_commandline()
