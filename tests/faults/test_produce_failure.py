"""Fault 6 of issue 12: the broker refuses one record a writer produces.

(And its sequel: the broker refuses for good what a writer's records start — a turn's
``WorkflowStarted`` — after the command is answered; the last test.)

The conversations topic's ``max.message.bytes`` is lowered below one message (which the edge,
whose bound is the cluster's default, still takes): the writer's produce of that message's
records fails. That command is dead-lettered with the reason, its client gets no ``202`` but a
``413`` saying why, no record of it is on the log, and the next message is recorded at the
next seq past the refused ones (never reusing them, which readers would dedupe away) and its
turn is replied.
"""

from __future__ import annotations

import httpx
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from schemas.conversation import MessageRecorded, SendMessage, TurnStateChanged
from streams.envelope import decode
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import COMMANDS, CONVERSATIONS, WORKFLOWS, dlq_name, topic_name
from tests.faults.traffic import conversation_logs
from tests.support import read_all, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]

TOPIC_LIMIT = 12_000
"""The conversations topic's lowered ``max.message.bytes``: one sealed 10 KB message is over
it (sealed text is ciphertext, so compression does not bring it under)."""


def lower_max_message_bytes(settings: VoiceSettings, topic: str, limit: int) -> None:
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    entry = ConfigEntry("max.message.bytes", str(limit),
                        incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(timeout=30)


def turn_ended(client: httpx.Client, cnv: str, turn: str) -> dict | None:
    r = client.get(f"/me/conversations/{cnv}/turns/{turn}")
    return r.json() if r.status_code == 200 and r.json()["state"] != "Thinking" else None


def test_a_record_the_broker_refuses_dead_letters_its_command_and_the_next_seq_goes_on(
        settings: VoiceSettings, start_worker, start_edge) -> None:  # noqa: ANN001
    worker = start_worker()
    url = start_edge()
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    log_topic = topic_name(settings, CONVERSATIONS)
    with httpx.Client(base_url=url, headers=auth, timeout=settings.gateway_bound_s * 2) as c:
        cnv = c.post("/me/conversations").json()["conversation"]
        first = c.post(f"/me/conversations/{cnv}/messages",
                       json={"text": "The streetlight on Elm Road is broken."})
        assert first.status_code == 202, first.text
        wait_for(lambda: turn_ended(c, cnv, first.json()["turn"]), timeout=90,
                 what="the first turn's end")
        before = max(e.seq or 0 for e in conversation_logs(settings)[cnv])

        lower_max_message_bytes(settings, log_topic, TOPIC_LIMIT)
        big = "The bins on Elm Road were not collected. " * 250  # ~10 KB, under the edge's
        refused = c.post(f"/me/conversations/{cnv}/messages", json={"text": big})
        assert refused.status_code == 413, (refused.status_code, refused.text)
        detail = refused.json()["detail"]
        assert "too large" in detail and "max.message.bytes" in detail, detail

        nxt = c.post(f"/me/conversations/{cnv}/messages",
                     json={"text": "The crossing by the school is unsafe."})
        assert nxt.status_code == 202, nxt.text
        seq = nxt.json()["message"]["seq"]
        assert seq > before
        assert wait_for(lambda: turn_ended(c, cnv, nxt.json()["turn"]), timeout=90,
                        what="the next turn's end")["state"] == "Replied"
        said = [m["text"] for m in c.get(f"/me/conversations/{cnv}").json()["messages"]
                if m["role"] == "participant"]
        assert said == ["The streetlight on Elm Road is broken.",
                        "The crossing by the school is unsafe."]

    # The refused command is on the commands topic's dead-letter twin, with the reason.
    def dead_letters() -> list:
        return [m for m in read_all(settings, dlq_name(topic_name(settings, COMMANDS)))
                if isinstance(decode(m.key(), m.value(), m.headers()).record, SendMessage)]

    [dead] = wait_for(dead_letters, timeout=30, what="the command's dead letter")
    reason = dict(dead.headers())["voice_dlq_reason"].decode()
    assert "too large" in reason.lower() or "MSG_SIZE_TOO_LARGE" in reason, reason

    # On the log: nothing of the refused message; its seqs given to nothing else; the next
    # message right after them; every other seq dense; every turn ended once.
    log = sorted(conversation_logs(settings)[cnv], key=lambda e: e.seq or 0)
    seqs = [e.seq for e in log]
    assert len(seqs) == len(set(seqs))
    skipped = sorted(set(range(1, max(seqs) + 1)) - set(seqs))
    assert skipped == [before + 1, before + 2, before + 3], (before, seqs)
    assert seq == before + 4
    assert sum(isinstance(e.record, MessageRecorded) for e in log) == 2
    ends = [e.record.turn for e in log if isinstance(e.record, TurnStateChanged)
            and e.record.state != "Thinking"]
    assert sorted(ends) == sorted([first.json()["turn"], nxt.json()["turn"]])
    assert worker.poll() is None


DEADLINE_S = 4
"""The turn deadline of the last test: the janitor ends the turn whose start was refused."""


def test_a_turn_start_refused_for_good_is_dead_lettered_its_turn_ends_and_the_next_goes_on(
        settings: VoiceSettings, start_worker, start_edge) -> None:  # noqa: ANN001
    """The writer sends what a message's records start (its turn's workflow) after answering
    it. Refused as too large for its topic — which no try changes — the start goes to
    ``<workflows>.dlq`` with the reason and the writer goes on: tried for ever, it would hold
    every later command of the conversation, the janitor's too, and its partition's offsets."""
    worker = start_worker(VOICE_TURN_DEADLINE_S=str(DEADLINE_S), VOICE_JANITOR_INTERVAL_S="1")
    url = start_edge()
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    workflows = topic_name(settings, WORKFLOWS)
    with httpx.Client(base_url=url, headers=auth, timeout=settings.gateway_bound_s * 2) as c:
        cnv = c.post("/me/conversations").json()["conversation"]
        lower_max_message_bytes(settings, workflows, 100)  # below any workflow record
        first = c.post(f"/me/conversations/{cnv}/messages",
                       json={"text": "The streetlight on Elm Road is broken."})
        assert first.status_code == 202, first.text
        turn = first.json()["turn"]
        [dead] = wait_for(lambda: read_all(settings, dlq_name(workflows)), timeout=30,
                          what="the turn start's dead letter")
        headers = dict(dead.headers())
        assert headers["ce_id"] == f"{turn}:1".encode()
        reason = headers["voice_dlq_reason"].decode()
        assert "refused for good" in reason and "too large" in reason.lower(), reason
        lower_max_message_bytes(settings, workflows, 1_048_588)  # the broker's default again

        # Never started, the turn is ended by its deadline: the writer took the janitor's
        # command, so it held nothing back.
        ended = wait_for(lambda: turn_ended(c, cnv, turn), timeout=DEADLINE_S + 30,
                         what="the unstarted turn's end")
        assert ended["state"] != "Replied", ended
        nxt = c.post(f"/me/conversations/{cnv}/messages",
                     json={"text": "The crossing by the school is unsafe."})
        assert nxt.status_code == 202, nxt.text
        assert wait_for(lambda: turn_ended(c, cnv, nxt.json()["turn"]), timeout=90,
                        what="the next turn's end")["state"] == "Replied"
    assert worker.poll() is None
