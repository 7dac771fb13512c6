"""The workflow runtime's table writes are held back (``consumers.frame.write_behind``) and sent
before a commit covers the record that made them. The guarantee: no offset is committed before
the table writes of the records it covers are in the changelog — so a worker SIGKILLed right
after a commit leaves its successor every state it committed, however long writes are held
otherwise.

The linger is 60 s here, so only a commit (every 0.5 s) can send what is held: without the
send before the commit, a turn's workflow is committed ended in ``voice.workflows`` and absent
from its changelog."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from schemas.conversation import MessageRecorded, ReplyRecorded, TurnStateChanged
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import CONVERSATIONS, WORKFLOWS, topic_name
from tests.support import (
    accepted,
    caught_up,
    log_of,
    no_duplicate_seqs,
    read_all,
    send_message,
    wait_for,
    worker_group,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]

HELD = {"VOICE_WORKER_CHANGELOG_LINGER_S": "60"}


def workflows_committed(settings: VoiceSettings) -> bool:
    """Whether the worker group has committed every record of ``voice.workflows``."""
    topic = topic_name(settings, WORKFLOWS)
    return caught_up(settings, worker_group(settings),
                     [(topic, p) for p in range(settings.topic_partitions)])


def changelog_states(settings: VoiceSettings, workflow: str) -> list[dict[str, Any] | None]:
    """Every value of ``workflow`` in the workflows table's changelog, in order."""
    topic = f"{worker_group(settings)}-workflows-changelog"
    return [json.loads(m.value()) if m.value() else None for m in read_all(settings, topic)
            if (m.key() or b"").strip(b'"') == workflow.encode()]


def test_a_commit_sends_the_held_writes_it_covers_and_a_killed_worker_s_successor_has_them(
        settings: VoiceSettings, start_worker: Callable[..., Any],
        start_edge: Callable[..., str]) -> None:
    url = start_edge()
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    with httpx.Client(base_url=url, headers=auth, timeout=30) as client:
        first = start_worker(**HELD)
        cnv = accepted(lambda: client.post("/me/conversations",
                                           headers={"Idempotency-Key": "open"})).json()[
            "conversation"]

        def replied(n: int) -> list[Any] | None:
            log = log_of(settings, CONVERSATIONS, cnv)
            ends = [e for e in log if isinstance(e.record, TurnStateChanged)
                    and e.record.state == "Replied"]
            return log if len(ends) >= n else None

        send_message(client, cnv, "m1", "Message 1: the light on Elm Road is out.")
        log = wait_for(lambda: replied(1), timeout=60, what="the first turn's reply")
        [turn] = {e.record.turn for e in log if isinstance(e.record, TurnStateChanged)}
        wait_for(lambda: workflows_committed(settings), timeout=30,
                 what="the worker's commit of every workflow record")
        # Committed: its end is in the changelog, sent by the commit (the linger is 60 s), and
        # its "running" never was (replaced while held).
        states = changelog_states(settings, turn)
        assert [s["status"] for s in states if s] == ["completed"], states

        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        start_worker(**HELD)
        send_message(client, cnv, "m2", "Message 2: and on Oak Street.")
        log = no_duplicate_seqs(wait_for(lambda: replied(2), timeout=90,
                                         what="the second turn's reply"))
        records = [e.record for e in log]
        assert sum(isinstance(r, MessageRecorded) for r in records) == 2
        assert sum(isinstance(r, ReplyRecorded) for r in records) == 2
        # The successor found the first turn's workflow ended: it ran once.
        first_turn = [e for e in log_of(settings, WORKFLOWS, turn) if e.seq is not None]
        assert len(no_duplicate_seqs(first_turn)) == len(first_turn), first_turn

