"""Recording on the log from the edge: commands to their writer (waiting for the ack), and the
records the edge writes itself (a dataset, a contribution, a workflow's first record).

``CommandsDep`` is the one way a route records anything: it carries the caller's tenant, the
``Publisher`` and the tail. ``Commands.record`` is the edge's one produce path, so its checks
hold for every route: a record over ``VOICE_MAX_RECORD_BYTES`` answers 413 and is never sent
(the broker would refuse it); a record the broker does not take, or a client that cannot queue
it, answers 503 (``Retry-After`` is added to every 503 by ``api.frame.errors``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Annotated, Any

from confluent_kafka import KafkaException, Message
from fastapi import Depends, HTTPException, Request

from api.frame.auth import Principal
from api.frame.deadline import remaining
from api.frame.deps import PrincipalDep, not_found
from api.frame.tail import AckTimeout, EdgeTail
from schemas.base import Record
from schemas.system import CommandAcknowledged
from schemas.workflow import WorkflowCommandReceived, WorkflowStarted
from streams.envelope import Envelope, new_id
from streams.producer import ProduceError, Publisher, RecordProducer, RecordTooLarge, too_large
from streams.settings import VoiceSettings
from streams.topics import COMMANDS, WORKFLOWS, TopicSpec

EDGE_SOURCE = "/voice/edge"

log = logging.getLogger(__name__)


def edge_producer(settings: VoiceSettings) -> RecordProducer:
    """The edge's producer: a record not acknowledged within half the gateway bound fails
    (→ 503) instead of waiting out librdkafka's five minutes, and a full local queue (the
    broker gone for a while) fails at once instead of blocking the event loop. Half: the
    first record of a fresh producer also waits for its producer id, slower on a busy broker;
    the writer's acknowledgement then gets what is left of the request's bound."""
    timeout_ms = max(1000, math.ceil(settings.gateway_bound_s * 1000 / 2))
    return RecordProducer(settings, wait_when_full=False, **{"message.timeout.ms": timeout_ms})


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
        """Produce ``env`` and wait for the broker's ack: 413 "could not {what}" when it is
        over ``VOICE_MAX_RECORD_BYTES`` (never sent), 503 when the broker does not take it,
        or has not acknowledged it when the request's bound runs out (it may still land:
        a retry with the same idempotency key is answered from it)."""
        limit = self.settings.max_record_bytes
        try:
            return await asyncio.wait_for(self.publisher.send(spec, env, max_bytes=limit),
                                          remaining(self.settings.gateway_bound_s))
        except TimeoutError:
            raise HTTPException(503, f"could not {what}: the broker did not acknowledge the "
                                     "record within the gateway bound "
                                     f"({self.settings.gateway_bound_s} s); try again") from None
        except RecordTooLarge as exc:
            raise HTTPException(413, f"could not {what}: the record would be {exc.size} bytes, "
                                     f"over the limit of {limit} (VOICE_MAX_RECORD_BYTES); "
                                     "send less") from None
        except (ProduceError, KafkaException, BufferError) as exc:
            log.warning("could not %s: %s: %s", what, type(exc).__name__, exc)
            if too_large(exc):  # within our limit, yet over the client's or the topic's
                raise HTTPException(413, f"could not {what}: the broker refuses a record this "
                                         "large; send less") from None
            raise HTTPException(503, f"could not {what}: the broker did not take the record; "
                                     "try again") from None

    async def submit(self, aggregate: str, record: Record, correlation: str | None = None
                     ) -> CommandAcknowledged:
        """Produce ``record`` on the commands topic and return its writer's acknowledgement.

        Waits at most what is left of the request's gateway bound (``api.frame.deadline``);
        past that the command is still on the log and will be applied, so the caller gets 503
        and may retry with the same idempotency key.
        """
        cmd_id = new_id()
        env = self.envelope(record, aggregate, correlation=correlation or cmd_id, id=cmd_id)
        fut = self.tail.expect_ack(cmd_id)  # before producing: the ack may come back at once
        try:
            await self.record(COMMANDS, env, "record the command")
        except BaseException:  # not on the log: nobody will answer it
            self.tail.forget_ack(cmd_id)
            raise
        try:
            return await self.tail.wait_ack(cmd_id, fut,
                                            remaining(self.settings.gateway_bound_s))
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
    """The HTTP error of a command its writer refused: 413 when the log refused its records
    as too large (sending it again cannot help), 503 when it could not record it otherwise
    (try again), 404 for an unknown aggregate (``not_found`` when given), else 409 with the
    reason."""
    reason = str(ack.detail.get("reason") or "refused")
    if ack.detail.get("too_large"):
        return HTTPException(413, f"{what}: {reason}")
    if ack.detail.get("retryable"):
        return HTTPException(503, f"{what}: {reason}")
    if reason.startswith("no such"):
        return not_found or HTTPException(404, f"{what}: {reason}")
    return HTTPException(409, f"{what}: {reason}")


def conversation_refused(ack: CommandAcknowledged, conversation: str) -> HTTPException:
    """``refused`` for a command to a conversation (either product's)."""
    return refused(ack, f"conversation {conversation!r}", not_found("conversation", conversation))


async def get_commands(request: Request, principal: PrincipalDep) -> Commands:
    """The caller's ``Commands``. The app's settings, producer and tail are read here, not
    taken as dependencies: FastAPI solves each dependency node of every request (~7 µs each
    on an idle core), and this one is on every route that records (docs/benchmarks.md,
    thirty-fifth pass)."""
    state = request.app.state
    producer = state.producer
    return Commands(state.settings, Publisher(state.settings, lambda: producer), state.tail,
                    principal)


CommandsDep = Annotated[Commands, Depends(get_commands)]
