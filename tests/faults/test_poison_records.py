"""Fault 10: a poison record on every topic → dead-lettered with its reason; every consumer goes
on (decision 0008).

Against the real broker and real processes (a worker, an edge, the telemetry sink): on every
topic, bytes that are no record; on every topic a worker reads, a well-formed record its
consumer can never process (a command type no writer takes, a workflow kind nobody runs); on
every topic only the sink reads (each aggregate's log among them, decision 0016), a
well-formed record whose rows ClickHouse refuses (a seq past Int64). Each lands in
``<topic>.dlq`` exactly once, with its reason; the worker, the sink and the edge stay up, the
edge ready; a conversation turn afterwards still replies. And when not even the dead letter
goes, the worker stops without committing the record, and its successor dead-letters it.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from schemas.agent import ModelCallRecorded
from schemas.base import Record, Sealed
from schemas.conversation import ConversationStarted
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope, encode
from streams.producer import RecordProducer
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import (
    COMMANDS,
    CONVERSATIONS,
    TOPICS,
    WORKFLOWS,
    TopicSpec,
    topic_name,
)
from tests.support import (
    committed,
    edge_state,
    read_all,
    spawn_voice,
    stop,
    wait_for,
    worker_group,
)

pytestmark = [pytest.mark.faults, pytest.mark.integration]

SEALED = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy")
UNDECODABLE = "ce_specversion is None, expected '1.0'"


@dataclass(frozen=True)
class Poison:
    """One record no consumer of ``topic`` can process, and the reason its dead letter must
    give."""

    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    reason: str


def undecodable(settings: VoiceSettings, spec: TopicSpec) -> Poison:
    key = f"poison-{uuid.uuid4().hex[:8]}".encode()
    return Poison(topic_name(settings, spec), key, b"\xff\x00 not a record", [], UNDECODABLE)


def impossible(settings: VoiceSettings, spec: TopicSpec, record: Record, reason: str,
               seq: int | None = None) -> Poison:
    key = f"poison-{uuid.uuid4().hex[:8]}"
    k, v, h = encode(Envelope(record=record, key=key, source="/test", seq=seq,
                              id=f"{key}-rec"))
    return Poison(topic_name(settings, spec), k, v, h, reason)


def poisons(settings: VoiceSettings) -> list[Poison]:
    out = [undecodable(settings, spec) for spec in TOPICS]
    cnv = "cnv-00112233aabbccdd"
    out += [
        impossible(settings, COMMANDS, ConversationStarted(conversation=cnv, owner="mallory"),
                   "no writer takes 'voice.conversation.started.v1'"),
        impossible(settings, WORKFLOWS, WorkflowStarted(workflow="wf-poison", kind="no-such"),
                   "no workflow kind 'no-such'", seq=1),
    ]
    # Only the sink reads these: a record whose rows the store refuses.
    refused = ModelCallRecorded(workflow="wf-poison", call_id="c-poison", agent_name="a",
                                iteration=1, request_model="m")
    out += [impossible(settings, spec, refused, "telemetry: the store refused its rows",
                       seq=2**70)
            for spec in TOPICS if not spec.read_by_workers]
    return out


def produce(settings: VoiceSettings, items: list[Poison]) -> list[tuple[str, int, int]]:
    """Produce each poison; returns (topic, partition, offset) of each, in order."""

    async def go() -> list[tuple[str, int, int]]:
        p = RecordProducer(settings)
        try:
            msgs = await asyncio.gather(*(p.produce_raw(i.topic, i.key, i.value, i.headers)
                                          for i in items))
            return [(m.topic(), m.partition(), m.offset()) for m in msgs]
        finally:
            p.close()

    return asyncio.run(go())


def dead_letters(settings: VoiceSettings, poison: Poison) -> list[dict[str, bytes]]:
    """The headers of each dead letter of ``poison`` (matched by key) on ``<topic>.dlq``."""
    return [dict(m.headers() or []) for m in read_all(settings, f"{poison.topic}.dlq")
            if m.key() == poison.key]


def auth(settings: VoiceSettings) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}


def a_turn_replies(url: str, settings: VoiceSettings) -> None:
    """A normal conversation turn, start to reply, through the edge."""
    cnv = httpx.post(f"{url}/me/conversations", headers=auth(settings), timeout=10)
    assert cnv.status_code == 201, cnv.text
    c = cnv.json()["conversation"]
    r = httpx.post(f"{url}/me/conversations/{c}/messages", headers=auth(settings), timeout=20,
                   json={"text": "The streetlights on our road have been out for weeks."})
    assert r.status_code == 202, r.text
    turn = r.json()["turn"]

    def replied() -> bool:
        t = httpx.get(f"{url}/me/conversations/{c}/turns/{turn}", headers=auth(settings),
                      timeout=10)
        return t.status_code == 200 and t.json()["state"] == "Replied"

    wait_for(replied, timeout=90, what="a turn after the poison replied")


def ready(url: str) -> dict:
    r = httpx.get(f"{url}/readyz", timeout=10)
    assert r.status_code == 200 and r.json()["ready"], r.text
    return r.json()


def test_a_poison_record_on_every_topic_is_dead_lettered_and_every_consumer_goes_on(
    settings: VoiceSettings, start_worker: Callable[..., subprocess.Popen[bytes]],
    start_edge: Callable[..., str], tmp_path: Path,
) -> None:
    worker = start_worker()
    sink = spawn_voice(settings, "telemetry", log=tmp_path / "telemetry.log",
                       VOICE_TELEMETRY_QUERY_PORT="0", VOICE_TELEMETRY_FLUSH_MS="200")
    try:
        url = start_edge()
        items = poisons(settings)
        assert {i.topic for i in items} == {topic_name(settings, s) for s in TOPICS}
        where = produce(settings, items)

        # Every poison is dead-lettered with its reason, by the one consumer that owns it.
        for poison in items:
            found = wait_for(lambda p=poison: dead_letters(settings, p), timeout=60,
                             what=f"the dead letter of {poison.topic}'s poison")
            reason = found[0]["voice_dlq_reason"].decode()
            assert poison.reason in reason, (poison.topic, reason)
            assert found[0]["voice_dlq_topic"] == poison.topic.encode()

        # The sink has stored (and committed) past every poison: had it dead-lettered a
        # record a worker also dead-letters, it would be there by now.
        def sink_past() -> bool:
            ends = committed(settings, f"{settings.group_prefix}-telemetry",
                             [(t, p) for t, p, _o in where])
            return all(ends.get((t, p), -1) > o for t, p, o in where)

        wait_for(sink_past, timeout=60, what="the sink committing past every poison")
        for poison in items:
            assert len(dead_letters(settings, poison)) == 1, poison.topic

        # Every consumer went on: a turn replies, nothing died, the edge is ready and says
        # what it skipped.
        a_turn_replies(url, settings)
        assert worker.poll() is None and sink.poll() is None
        assert ready(url)["ready"]
        skipped = edge_state(url, settings)["skipped"]
        assert skipped[topic_name(settings, CONVERSATIONS)]["undecodable"] >= 1
    finally:
        stop(sink)


def test_a_record_that_cannot_even_be_dead_lettered_is_never_committed_past(
    settings: VoiceSettings, start_worker: Callable[..., subprocess.Popen[bytes]],
    start_edge: Callable[..., str],
) -> None:
    """The dead-letter topic refuses everything (its ``max.message.bytes`` lowered): the
    worker stops rather than commit past the record; its successor, once the dead-letter
    topic takes records again, reads the record again and dead-letters it."""
    dlq = topic_name(settings, COMMANDS) + ".dlq"
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})

    def dlq_max_bytes(value: str) -> None:
        res = ConfigResource(ConfigResource.Type.TOPIC, dlq,
                             set_config={"max.message.bytes": value})
        for fut in admin.alter_configs([res]).values():
            fut.result(timeout=10)

    first = start_worker()
    dlq_max_bytes("64")
    poison = undecodable(settings, COMMANDS)
    [(topic, partition, offset)] = produce(settings, [poison])
    assert first.wait(timeout=60) != 0  # it stopped itself, with a failure
    ends = committed(settings, worker_group(settings), [(topic, partition)])
    assert ends[(topic, partition)] <= offset  # never past the record (negative: none yet)
    assert dead_letters(settings, poison) == []

    dlq_max_bytes("1048588")  # the broker's default
    start_worker()
    [headers] = wait_for(lambda: dead_letters(settings, poison), timeout=60,
                         what="the successor's dead letter")
    assert headers["voice_dlq_reason"].decode() == UNDECODABLE
    url = start_edge()
    a_turn_replies(url, settings)
