"""The staff product on the worker: its writers, its consumer, its workflows.

``Staff().register(ctx)`` is all the worker needs: the issue, inbox and review-queue writers
become the writers of their commands (``consumers.frame``), the research, disclosure-review and
update-delivery workflows are registered, the issue writer tells the developments handler each
record it put on ``voice.issues`` (``ctx.on_recorded``, decision 0016), and the delivery
watcher reads ``voice.workflows``.
"""

from __future__ import annotations

import logging
from typing import Any

from consumers.frame.context import WorkerContext
from consumers.staff.delivery import Delivery, of_a_delivery
from consumers.staff.developments import DeliveryQueue, apply_development
from consumers.staff.inbox import InboxWriter
from consumers.staff.issues import IssueWriter
from consumers.staff.queue import ReviewQueueWriter
from consumers.staff.research import Research
from consumers.staff.review import Review
from consumers.staff.steps import Agents, StepDelays
from streams.envelope import Envelope
from streams.topics import ISSUES, WORKFLOWS

log = logging.getLogger(__name__)


class Staff:
    """Issues, inboxes, review queues and the three staff workflows, registered on one worker."""

    name = "staff"

    def register(self, ctx: WorkerContext) -> None:
        """Add the writers, the workflows and the consumers (once, before the app runs)."""
        self.out = ctx.publisher
        ctx.aggregate(IssueWriter())
        ctx.aggregate(InboxWriter())
        ctx.aggregate(ReviewQueueWriter())
        self.deliveries = ctx.table("staff_deliveries")
        delays = StepDelays.parse(ctx.settings.staff_step_delay_ms)
        agents = Agents(ctx.agents)
        self.research = Research(self.out, agents, delays, ctx.log_reader)
        self.review = Review(self.out, ctx.sealer, agents, delays)
        self.delivery = Delivery(self.out, delays, ctx.log_reader)
        ctx.workflow(self.research.definition, self.review.definition, self.delivery.definition)
        ctx.on_recorded(ISSUES, self._on_issue_record)
        # A second agent on ``voice.workflows`` (Faust hands each record to every agent of a
        # topic). It only produces commands; the runtime's agent dead-letters bad records. It
        # decodes only the records of deliveries (by key): a turn's are acknowledged unread.
        ctx.wire(WORKFLOWS, self._on_workflow_record, agent_name="staff_workflow_watch",
                 dead_letter=False, skip=lambda raw: not of_a_delivery(raw.key))

    async def _on_issue_record(self, env: Envelope, partition: int, offset: int) -> None:
        """Told by the issue's writer of each record it put at ``partition``/``offset``
        (``ctx.on_recorded``, decision 0016): start each issue's deliveries one at a time."""
        queue, start = apply_development(DeliveryQueue.from_dict(self.deliveries.get(env.key)),
                                         env, partition, offset)
        if start is not None:
            await self.out.send(WORKFLOWS, start)
        self.deliveries[env.key] = queue.to_dict()

    async def _on_workflow_record(self, env: Envelope, event: Any) -> None:  # noqa: ARG002
        await self.delivery.on_workflow_record(env)
