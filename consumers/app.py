"""The worker process: a Faust app whose agents run Voice's consumers.

Agents read raw bytes and decode through ``consumers.intake`` (bad records → DLQ). Records are
produced with the shared confluent-kafka producer and acknowledged *before* the agent moves on,
so Faust commits an offset only after its outputs are on the log (at-least-once; readers dedupe
by record id or per-conversation seq).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import faust

from consumers.intake import decode_or_dead_letter
from consumers.sequencer import ConversationState, sequence
from streams.envelope import Envelope
from streams.producer import RecordProducer
from streams.settings import VoiceSettings
from streams.topics import COMMANDS, CONVERSATIONS, WORKFLOWS, TopicSpec, topic_name

log = logging.getLogger(__name__)

Handler = Callable[[Envelope], Awaitable[None]]


class Worker:
    """Holds the Faust app, the producer and the handlers of each topic the worker reads."""

    def __init__(self, settings: VoiceSettings) -> None:
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
        )
        self._producer: RecordProducer | None = None
        self.handlers: dict[str, dict[str, Handler]] = {}
        self.conversations = self.app.Table(
            "conversations", default=None, partitions=settings.topic_partitions
        )
        self._wire(COMMANDS, self._on_command)
        self._wire(CONVERSATIONS, self._on_conversation_record)
        self._wire(WORKFLOWS, self._on_workflow_record)

        @self.app.on_before_shutdown.connect
        async def _close(app: Any, **kw: Any) -> None:  # noqa: ARG001
            if self._producer is not None:
                self._producer.close()

    @property
    def producer(self) -> RecordProducer:
        if self._producer is None:  # created lazily inside the worker's event loop
            self._producer = RecordProducer(self.settings)
        return self._producer

    def on(self, spec: TopicSpec, ce_type: str, handler: Handler) -> None:
        """Register a handler for one record type on a topic (other types are skipped)."""
        self.handlers.setdefault(spec.name, {})[ce_type] = handler

    def _wire(self, spec: TopicSpec, dispatch: Callable[[Envelope], Awaitable[None]]) -> None:
        name = topic_name(self.settings, spec)
        topic = self.app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                               value_serializer="raw", partitions=self.settings.topic_partitions)

        async def agent(stream: Any) -> None:
            async for event in stream.events():
                msg = event.message
                try:
                    env = await decode_or_dead_letter(
                        self.producer, name, msg.partition, msg.offset, msg.key, msg.value,
                        list(msg.headers.items()) if isinstance(msg.headers, dict)
                        else msg.headers,
                    )
                    if env is not None:
                        await dispatch(env)
                except Exception:  # one record never stops the consumer
                    log.exception("record %s[%s]@%s failed", name, msg.partition, msg.offset)

        agent.__name__ = f"{spec.name.replace('.', '_')}_agent"
        self.app.agent(topic, name=agent.__name__)(agent)

    async def _dispatch(self, spec: TopicSpec, env: Envelope) -> None:
        handler = self.handlers.get(spec.name, {}).get(env.type)
        if handler is not None:
            await handler(env)

    async def _on_command(self, env: Envelope) -> None:
        if env.type.startswith("voice.conversation."):
            await self._sequence(env)
        else:
            await self._dispatch(COMMANDS, env)

    async def _sequence(self, cmd: Envelope) -> None:
        state = ConversationState.from_dict(self.conversations.get(cmd.key))
        new_state, outputs = sequence(state, cmd)
        # Outputs first, table second: a crash in between replays the command to the same seqs.
        futures = [
            self.producer.produce_raw(*_encode_for(self.settings, spec, env))
            for spec, env in outputs
        ]
        for fut in futures:
            await fut
        if new_state is not None:
            self.conversations[cmd.key] = new_state.to_dict()

    async def _on_conversation_record(self, env: Envelope) -> None:
        await self._dispatch(CONVERSATIONS, env)

    async def _on_workflow_record(self, env: Envelope) -> None:
        await self._dispatch(WORKFLOWS, env)


def _encode_for(
    settings: VoiceSettings, spec: TopicSpec, env: Envelope
) -> tuple[str, bytes, bytes, list[tuple[str, bytes]]]:
    from streams.envelope import encode

    key, value, headers = encode(env)
    return topic_name(settings, spec), key, value, headers


def create_worker(settings: VoiceSettings) -> Worker:
    """Build a worker (Faust app + agents) for the given settings."""
    return Worker(settings)


def run_worker(settings: VoiceSettings, loglevel: str = "warning") -> None:
    """Run the worker in the foreground until SIGINT/SIGTERM."""
    from faust.worker import Worker as FaustWorker

    w = create_worker(settings)
    FaustWorker(w.app, loglevel=loglevel, quiet=True).execute_from_commandline()
