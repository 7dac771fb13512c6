"""Recording on the log from the edge: commands to their writer (waiting for the ack), and the
records the edge writes itself (a dataset, a contribution, a workflow's first record).

``CommandsDep`` is the one way a route records anything: it carries the caller's tenant, the
``Publisher`` and the tail. A record the broker does not take answers 503.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from confluent_kafka import Message
from fastapi import Depends, HTTPException

from api.frame.auth import Principal
from api.frame.deps import PrincipalDep, ProducerDep, SettingsDep, TailDep, not_found
from api.frame.tail import AckTimeout, EdgeTail
from schemas.base import Record
from schemas.system import CommandAcknowledged
from schemas.workflow import WorkflowCommandReceived, WorkflowStarted
from streams.envelope import Envelope, new_id
from streams.producer import ProduceError, Publisher
from streams.settings import VoiceSettings
from streams.topics import COMMANDS, WORKFLOWS, TopicSpec

EDGE_SOURCE = "/voice/edge"


@dataclass
class Commands:
    """What a route records with, on behalf of ``principal``."""

    settings: VoiceSettings
    publisher: Publisher
    tail: EdgeTail
    principal: Principal

    def envelope(self, record: Record, key: str, **attrs: Any) -> Envelope:
        """``record`` keyed (and subject) ``key``, from the edge, in the caller's tenant."""
        return Envelope(record=record, key=key, source=EDGE_SOURCE, subject=key,
                        tenant=self.principal.tenant, **attrs)

    async def record(self, spec: TopicSpec, env: Envelope, what: str) -> Message:
        """Produce ``env`` and wait for the broker's ack; 503 "could not {what}" if refused."""
        try:
            return await self.publisher.send(spec, env)
        except ProduceError as exc:
            raise HTTPException(503, f"could not {what}: {exc}") from None

    async def submit(self, aggregate: str, record: Record, correlation: str | None = None
                     ) -> CommandAcknowledged:
        """Produce ``record`` on the commands topic and return its writer's acknowledgement.

        Waits at most a third of the gateway bound; past that the command is still on the log
        and will be applied, so the caller gets 503 and may retry with the same idempotency key.
        """
        cmd_id = new_id()
        env = self.envelope(record, aggregate, correlation=correlation or cmd_id, id=cmd_id)
        fut = self.tail.expect_ack(cmd_id)  # before producing: the ack may come back at once
        await self.record(COMMANDS, env, "record the command")
        try:
            return await self.tail.wait_ack(cmd_id, fut, self.settings.gateway_bound_s / 3)
        except AckTimeout as exc:
            raise HTTPException(503, f"{exc}; retry with the same Idempotency-Key") from None

    async def cancel(self, workflow: str) -> CommandAcknowledged:
        """Ask a running workflow (a turn) to stop, on behalf of the caller."""
        return await self.submit(workflow, WorkflowCommandReceived(
            workflow=workflow, command="cancel", command_id=new_id(), by=self.principal.sub))

    async def start_workflow(self, started: WorkflowStarted) -> None:
        """Produce a workflow's first record (seq 1, id ``{workflow}:1``): the engine takes it."""
        workflow = started.workflow
        env = self.envelope(started, workflow, seq=1, correlation=workflow, id=f"{workflow}:1")
        await self.record(WORKFLOWS, env, f"start {workflow!r}")


def refused(ack: CommandAcknowledged, what: str,
            not_found: HTTPException | None = None) -> HTTPException:
    """The HTTP error of a command its writer refused: 503 when it could not record it (try
    again), 404 for an unknown aggregate (``not_found`` when given), else 409 with the reason."""
    reason = str(ack.detail.get("reason") or "refused")
    if ack.detail.get("retryable"):
        return HTTPException(503, f"{what}: {reason}")
    if reason.startswith("no such"):
        return not_found or HTTPException(404, f"{what}: {reason}")
    return HTTPException(409, f"{what}: {reason}")


def conversation_refused(ack: CommandAcknowledged, conversation: str) -> HTTPException:
    """``refused`` for a command to a conversation (either product's)."""
    return refused(ack, f"conversation {conversation!r}", not_found("conversation", conversation))


async def get_commands(settings: SettingsDep, producer: ProducerDep, tail: TailDep,
                       principal: PrincipalDep) -> Commands:
    return Commands(settings, Publisher(settings, lambda: producer), tail, principal)


CommandsDep = Annotated[Commands, Depends(get_commands)]
