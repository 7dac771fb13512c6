"""The staff domain inside the worker: its writers, its consumer, its workflows.

``Staff(worker, settings).register()`` is all the worker needs: it adds the tables, registers
the research, disclosure-review and update-delivery workflows with the worker's engine, wires
the developments consumer on ``voice.issues`` and the delivery watcher on ``voice.workflows``,
and ``on_command`` takes the commands it owns off ``voice.commands``.

The writers follow the sequencer's order: produce the outputs and wait for the broker's acks,
then write the table. A crash in between replays the command to identical records (same ids,
same seqs), which readers dedupe.
"""

from __future__ import annotations

import logging
from typing import Any

from consumers.staff.delivery import Delivery
from consumers.staff.developments import DeliveryQueue, apply_development
from consumers.staff.inbox import InboxState, apply_inbox
from consumers.staff.issues import IssueState, ack, apply_issue
from consumers.staff.research import Research
from consumers.staff.review import Review
from consumers.staff.steps import Agents, Producing, StepDelays
from schemas.staff import ISSUE_COMMANDS, DeliverNotification
from schemas.workflow import WorkflowCommandReceived
from streams.envelope import DecodeError, Envelope, decode
from streams.settings import VoiceSettings
from streams.topics import ISSUES, WORKFLOWS, topic_name

log = logging.getLogger(__name__)


class Staff:
    """Issues, inboxes and the three staff workflows, registered on one worker."""

    def __init__(self, worker: Any, settings: VoiceSettings) -> None:
        self.worker = worker
        self.settings = settings
        tables = {"partitions": settings.topic_partitions}
        self.issues = worker.app.Table("staff_issues", default=None, **tables)
        self.deliveries = worker.app.Table("staff_deliveries", default=None, **tables)
        self.inboxes = worker.app.Table("staff_inboxes", default=None, **tables)
        self.out = Producing(settings, lambda: worker.producer)
        delays = StepDelays.from_env()
        agents = Agents(settings, self.out, worker.sealer)
        self.research = Research(self.out, agents, delays)
        self.review = Review(self.out, worker.sealer, agents, delays)
        self.delivery = Delivery(self.out, delays)

    def register(self) -> None:
        """Register the workflows and wire the consumers (call once, before the app runs)."""
        for wf in (self.research, self.review, self.delivery):
            self.worker.runtime.register(wf.definition)
        self.worker.wire(ISSUES, self._on_issue_record)
        self._watch_workflows()

    async def on_command(self, env: Envelope) -> None:
        """A record of ``voice.commands``: apply the staff ones; acknowledge workflow commands
        (the worker has forwarded them to ``voice.workflows`` by now)."""
        rec = env.record
        if isinstance(rec, ISSUE_COMMANDS):
            state = IssueState.from_dict(self.issues.get(env.key))
            new_state, outputs = apply_issue(state, env)
            await self.out.send_all(outputs)
            if new_state is not None:
                self.issues[env.key] = new_state.to_dict()
        elif isinstance(rec, DeliverNotification):
            inbox, outputs = apply_inbox(InboxState.from_dict(self.inboxes.get(env.key)), env)
            await self.out.send_all(outputs)
            self.inboxes[env.key] = inbox.to_dict()
        elif isinstance(rec, WorkflowCommandReceived):
            # The engine dedupes by command id, so "accepted" means "on the workflow's log".
            await self.out.send_all([ack(env, "accepted", None, "/voice/worker",
                                         workflow=rec.workflow, command=rec.command)])

    async def _on_issue_record(self, env: Envelope, event: Any) -> None:  # noqa: ARG002
        """The developments consumer: start each issue's deliveries one at a time."""
        queue, start = apply_development(DeliveryQueue.from_dict(self.deliveries.get(env.key)),
                                         env)
        if start is not None:
            await self.out.send(WORKFLOWS, start)
        self.deliveries[env.key] = queue.to_dict()

    def _watch_workflows(self) -> None:
        """A second agent on ``voice.workflows`` (Faust hands each record to every agent of a
        topic). It only produces commands; the engine's agent dead-letters bad records."""
        name = topic_name(self.settings, WORKFLOWS)
        topic = self.worker.app.topic(name, key_type=bytes, value_type=bytes,
                                      key_serializer="raw", value_serializer="raw",
                                      partitions=self.settings.topic_partitions)

        async def staff_workflow_watch(stream: Any) -> None:
            async for event in stream.events():
                msg = event.message
                headers = (list(msg.headers.items()) if isinstance(msg.headers, dict)
                           else msg.headers)
                try:
                    env = decode(msg.key, msg.value, headers)
                except DecodeError:
                    continue
                try:
                    await self.delivery.on_workflow_record(env)
                except Exception:  # one record never stops the consumer
                    log.exception("watching %s[%s]@%s failed", name, msg.partition, msg.offset)

        self.worker.app.agent(topic, name="staff_workflow_watch")(staff_workflow_watch)
