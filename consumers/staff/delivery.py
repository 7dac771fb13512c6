"""The update-delivery workflow (id = development id, ``{issue}:dev-{n}``), and the watcher that
tells the issue when it ended.

Steps: ``render`` (the update from the development record; no model) → ``notify`` (one
notification per follower the developments consumer put in the input). A notification is a
command to the follower's inbox writer whose record id is ``{development}:{follower}``; the
writer records each id once, so a ``notify`` re-run after a crash sends every follower the
update exactly once however far the first run got.

The watcher reads ``voice.workflows`` beside the workflow engine and, when a delivery
completes or fails, submits ``EndDelivery`` to the issue's writer (id derived from the
workflow), so the developments consumer can start the issue's next development. It acts on
the log rather than on the engine's ``on_end`` hook because the hook runs once, in memory,
after the workflow's state is written: a crash in between would lose it, the log does not.
"""

from __future__ import annotations

import re
from typing import Any

from consumers.staff.render import render_update
from consumers.staff.steps import StepDelays
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef
from schemas.staff import DeliverNotification, EndDelivery
from schemas.workflow import WorkflowCompleted, WorkflowFailed
from streams.envelope import Envelope
from streams.ids import inbox_key
from streams.producer import Publisher
from streams.topics import COMMANDS

KIND = "update-delivery"
SOURCE = "/voice/update-delivery"
DEVELOPMENT = re.compile(r"^(?P<issue>iss-[0-9a-f]{8,32}):dev-[1-9][0-9]*$")


def notification_id(development: str, follower: str) -> str:
    """The one id of a development's notification to one follower."""
    return f"{development}:{follower}"


class Delivery:
    """The update-delivery workflow's definition and steps, and the end watcher."""

    def __init__(self, out: Publisher, delays: StepDelays) -> None:
        self.out = out
        self.delays = delays
        self.definition = WorkflowDef(KIND, (StepDef("render", self.render_step),
                                             StepDef("notify", self.notify_step)))

    async def render_step(self, ctx: StepContext) -> dict[str, Any]:
        i = ctx.input
        return render_update(i.get("issue_title", ""), i["title"], i["body"],
                             i.get("at", "")).to_dict()

    async def notify_step(self, ctx: StepContext) -> dict[str, Any]:
        """One notification per follower, each sent (and acknowledged by the broker) in turn."""
        i, update = ctx.input, ctx.outputs["render"]
        development = i["development"]
        sent = []
        for follower in i.get("followers") or []:
            nid = notification_id(development, follower)
            await self.out.send(COMMANDS, Envelope(
                record=DeliverNotification(notification=nid, recipient=follower,
                                           issue=i["issue"], development=development,
                                           title=update["title"], body=update["body"]),
                key=inbox_key(i.get("tenant"), follower), source=SOURCE, subject=follower,
                tenant=i.get("tenant"),
                correlation=ctx.workflow, id=nid))
            sent.append(nid)
            await self.delays.midpoint("notify")
        return {"notified": len(sent), "notifications": sent}

    async def on_workflow_record(self, env: Envelope) -> None:
        """A delivery that completed or failed ends on its issue's log."""
        rec = env.record
        if not isinstance(rec, (WorkflowCompleted, WorkflowFailed)):
            return
        m = DEVELOPMENT.match(rec.workflow)
        if m is None:
            return
        failed = isinstance(rec, WorkflowFailed)
        end = EndDelivery(issue=m["issue"], development=rec.workflow,
                          status="failed" if failed else "completed",
                          reason=rec.error if isinstance(rec, WorkflowFailed) else None)
        await self.out.send(COMMANDS, Envelope(
            record=end, key=m["issue"], source=SOURCE, subject=m["issue"], tenant=env.tenant,
            correlation=rec.workflow, causation=env.id, id=f"{rec.workflow}:ended:{env.id}"))
