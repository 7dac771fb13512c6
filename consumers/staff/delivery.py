"""The update-delivery workflow (id = development id, ``{issue}:dev-{n}``), and the watcher that
tells the issue when it ended.

Steps: ``render`` (the update from the development record, read back by its position on the
issue's log; no model) → ``notify`` (one notification per follower as of the delivery's
start: the step folds the issue's follow records from its first record to the seq the input
names, so no record carries the followers, however many). A notification is a command to the
follower's inbox writer whose record id is ``{development}:{follower}``; the writer records
each id once, so a ``notify`` re-run after a crash sends every follower the update exactly
once however far the first run got. Deliveries started before inputs were references (their
input a copy) still run.

The watcher reads ``voice.workflows`` beside the workflow engine and, when a delivery
completes or fails, submits ``EndDelivery`` to the issue's writer (id derived from the
workflow), so the developments handler can start the issue's next development. It acts on
the log rather than on the engine's ``on_end`` hook because the hook runs once, in memory,
after the workflow's state is written: a crash in between would lose it, the log does not.
"""

from __future__ import annotations

import re
from typing import Any

from consumers.frame.logrefs import LogReader, Position
from consumers.staff.render import render_update
from consumers.staff.steps import StepDelays
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef
from consumers.workflows.runtime import StepError
from schemas.staff import (
    DeliverNotification,
    DevelopmentRecorded,
    EndDelivery,
    FollowerAdded,
    FollowerRemoved,
)
from schemas.workflow import WorkflowCompleted, WorkflowFailed
from streams.envelope import Envelope
from streams.ids import inbox_key
from streams.producer import Publisher
from streams.topics import COMMANDS, ISSUES

KIND = "update-delivery"
SOURCE = "/voice/update-delivery"
NOTIFY_BATCH = 200
"""Notifications produced before waiting for the broker's acks."""
DEVELOPMENT = re.compile(r"^(?P<issue>iss-[0-9a-f]{8,32}):dev-[1-9][0-9]*$")


def of_a_delivery(key: bytes | None) -> bool:
    """Whether a ``voice.workflows`` record (keyed by its workflow) is a delivery's, by key
    alone: the watch leaves every other record unread (a turn's four a turn among them)."""
    return key is not None and DEVELOPMENT.match(key.decode("utf-8", "replace")) is not None


def notification_id(development: str, follower: str) -> str:
    """The one id of a development's notification to one follower."""
    return f"{development}:{follower}"


class Delivery:
    """The update-delivery workflow's definition and steps, and the end watcher."""

    def __init__(self, out: Publisher, delays: StepDelays, log: LogReader) -> None:
        self.out = out
        self.delays = delays
        self.log = log
        self.definition = WorkflowDef(KIND, (StepDef("render", self.render_step),
                                             StepDef("notify", self.notify_step)))

    async def render_step(self, ctx: StepContext) -> dict[str, Any]:
        i = ctx.input
        if "record" in i:
            [env] = await self.log.read(ISSUES, i["partition"], i["issue"],
                                        [Position.from_json(i["record"])])
            dev = env.record
            if not isinstance(dev, DevelopmentRecorded) or dev.development != i["development"]:
                raise StepError(f"the record at {i['record']} of {i['issue']!r} is not "
                                f"development {i['development']!r}", retryable=False)
            title, body, at = dev.title, dev.body, dev.at
        else:  # an input of before references
            title, body, at = i["title"], i["body"], i.get("at", "")
        return render_update(i.get("issue_title", ""), title, body, at).to_dict()

    async def followers(self, i: dict[str, Any]) -> list[str]:
        """The issue's followers as of the delivery's start (its log up to ``through``)."""
        if isinstance(i.get("followers"), list):  # an input of before references
            return list(i["followers"])
        following: dict[str, bool] = {}
        for env in await self.log.scan(ISSUES, i["partition"], i["issue"], i["opened"],
                                       i["through"]):
            if isinstance(env.record, (FollowerAdded, FollowerRemoved)):
                following[env.record.participant] = isinstance(env.record, FollowerAdded)
        return sorted(p for p, on in following.items() if on)

    async def notify_step(self, ctx: StepContext) -> dict[str, Any]:
        """One notification per follower, each sent (and acknowledged by the broker) in turn.

        Its output is a count, not the ids: those are ``{development}:{follower}``, and a
        list of them would grow with the followers."""
        i, update = ctx.input, ctx.outputs["render"]
        development = i["development"]
        followers = await self.followers(i)
        # In batches (each acknowledged before the next); one at a time when a test delays
        # the step, so it can stop a worker between two notifications.
        size = 1 if self.delays.delays.get("notify") else NOTIFY_BATCH
        for n in range(0, len(followers), size):
            await self.out.send_all([(COMMANDS, Envelope(
                record=DeliverNotification(notification=notification_id(development, f),
                                           recipient=f, issue=i["issue"],
                                           development=development, title=update["title"],
                                           body=update["body"]),
                key=inbox_key(i.get("tenant"), f), source=SOURCE, subject=f,
                tenant=i.get("tenant"), correlation=ctx.workflow,
                id=notification_id(development, f))) for f in followers[n:n + size]])
            await self.delays.midpoint("notify")
        return {"notified": len(followers)}

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
