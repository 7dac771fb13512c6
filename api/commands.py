"""Send a command to its writer and wait for the acknowledgement: the edge's one Kafka verb."""

from __future__ import annotations

from fastapi import HTTPException

from api.auth import Principal
from api.tail import AckTimeout, EdgeTail
from schemas.base import Record
from schemas.system import CommandAcknowledged
from streams.envelope import Envelope, new_id
from streams.producer import ProduceError, RecordProducer
from streams.settings import VoiceSettings
from streams.topics import COMMANDS, topic_name

EDGE_SOURCE = "/voice/edge"


async def submit(
    settings: VoiceSettings,
    producer: RecordProducer,
    tail: EdgeTail,
    principal: Principal,
    aggregate: str,
    record: Record,
    correlation: str | None = None,
) -> CommandAcknowledged:
    """Produce ``record`` on the commands topic and return its writer's acknowledgement.

    Waits at most a third of the gateway bound; past that the command is still on the log and
    will be applied, so the caller gets 503 and may retry with the same idempotency key.
    """
    cmd_id = new_id()
    env = Envelope(record=record, key=aggregate, source=EDGE_SOURCE, subject=aggregate,
                   tenant=principal.tenant, correlation=correlation or cmd_id, id=cmd_id)
    fut = tail.expect_ack(cmd_id)
    try:
        await producer.send(topic_name(settings, COMMANDS), env)
    except ProduceError as exc:
        raise HTTPException(503, f"could not record the command: {exc}") from None
    try:
        return await tail.wait_ack(cmd_id, fut, settings.gateway_bound_s / 3)
    except AckTimeout as exc:
        raise HTTPException(503, f"{exc}; retry with the same Idempotency-Key") from None
