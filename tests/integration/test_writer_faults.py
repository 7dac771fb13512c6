"""The one writer on a real broker when the broker refuses what a command decided: the command
goes to ``voice.commands.dlq`` with the reason, is answered rejected (retryable), its seqs are
never given again, and the worker goes on serving the conversation."""

from __future__ import annotations

import base64
import os

import httpx
import pytest

from schemas.base import Sealed
from schemas.conversation import SendMessage
from streams.envelope import Envelope
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import COMMANDS, topic_name
from tests.support import acknowledgement_of, forge_command, read_all, wait_for

pytestmark = pytest.mark.integration


def test_a_command_whose_records_the_broker_refuses_is_dead_lettered_and_seqs_move_on(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    worker = start_worker()
    url = start_edge()
    headers = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    cnv = httpx.post(f"{url}/me/conversations", headers=headers, timeout=10).json()["conversation"]

    # A command the broker takes (just under its 1 MiB record limit) whose MessageRecorded the
    # worker's producer must refuse (over its 1,000,000-byte message limit): the shape of the
    # "one participant stops the service" report, forged past the edge's 16 KiB check.
    blob = base64.b64encode(os.urandom(765_000)).decode()  # 1,020,000 characters
    cmd = Envelope(record=SendMessage(conversation=cnv, message_id="m-huge",
                                      text=Sealed(key_version=1, nonce="bm9uY2U=",
                                                  ciphertext=blob)),
                   key=cnv, source="/test", subject=cnv, id="cmd-huge", correlation="cmd-huge",
                   tenant="default")

    forge_command(settings, cmd, max_bytes=2_000_000)
    dlq = topic_name(settings, COMMANDS) + ".dlq"
    [dead] = wait_for(lambda: read_all(settings, dlq), timeout=30, what="the dead letter")
    dead_headers = dict(dead.headers())
    reason = dead_headers["voice_dlq_reason"].decode()
    assert "could not record" in reason and "voice.conversation.send_message.v1" in reason
    # Too large for the dead-letter topic too: kept cut, with its full length and its id.
    assert int(dead_headers["voice_dlq_truncated"]) > 1_000_000
    assert dead_headers["ce_id"] == b"cmd-huge" and dead.key() == cnv.encode()

    ack = acknowledgement_of(settings, "cmd-huge", timeout=15, what="the command's answer")
    # Too large for the log: no retry can help, so the answer says so (the edge answers 413),
    # never "try again" (fault 6 of issue 12 changed this; the assertion had not followed).
    assert ack.outcome == "rejected" and ack.detail.get("too_large"), ack.detail
    assert "retryable" not in ack.detail and "max.message.bytes" in ack.detail["reason"]

    # The worker lives and the conversation goes on, under seqs the refused records never had
    # (2..4 were attempted and may be partly on the log; readers dedupe by seq).
    assert worker.poll() is None
    r = httpx.post(f"{url}/me/conversations/{cnv}/messages", headers=headers, timeout=10,
                   json={"text": "The crossing by the school is unsafe."})
    assert r.status_code == 202, r.text
    assert r.json()["message"]["seq"] == 5 and r.json()["turn"] == f"{cnv}:turn-5"
