"""Turn deadlines (issue 12 point 3): a turn whose step never ends is ended by the janitor of
the worker owning its conversation, with ``DEADLINE_EXCEEDED``, once; the assistant then takes
the next message instead of answering ``409 busy``.

The model never answers and the step's own deadline is far away, so nothing but the turn's
deadline can end these turns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from schemas.assistant import AssistantTurnEnded
from schemas.conversation import TurnStateChanged
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import ASSISTANT, CONVERSATIONS
from tests.support import accepted, log_of, no_duplicate_seqs, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]

DEADLINE_S = 6
ASSISTANT_BASE = "/api/v1/assistant"


def test_turns_past_their_deadline_end_once_and_the_assistant_takes_the_next_message(
        settings: VoiceSettings, start_worker: Callable[..., Any],
        start_edge: Callable[..., str], held_model: str) -> None:
    worker = start_worker(ANTHROPIC_BASE_URL=held_model, VOICE_TURN_DEADLINE_S=str(DEADLINE_S),
                          VOICE_ASSISTANT_TURN_DEADLINE_S=str(DEADLINE_S),
                          VOICE_JANITOR_INTERVAL_S="1")
    url = start_edge()
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    client = httpx.Client(base_url=url, headers=auth, timeout=30)
    try:
        cnv = accepted(lambda: client.post("/me/conversations")).json()["conversation"]
        accepted(lambda: client.post(f"/me/conversations/{cnv}/messages",
                                     headers={"Idempotency-Key": "m1"},
                                     json={"text": "The streetlight on Elm Road is broken."}))
        began = time.monotonic()
        chat = accepted(lambda: client.post(f"{ASSISTANT_BASE}/chat",
                                            headers={"Idempotency-Key": "c1"},
                                            json={"message": "Can you help me?",
                                                  "stream": False}))
        conversation = chat.json()["conversation_id"]
        busy = client.post(f"{ASSISTANT_BASE}/chat", json={
            "message": "Still there?", "stream": False, "conversation_id": conversation})
        assert busy.status_code == 409, busy.text

        def participant_ended() -> list[TurnStateChanged] | None:
            ends = [e.record for e in no_duplicate_seqs(log_of(settings, CONVERSATIONS, cnv))
                    if isinstance(e.record, TurnStateChanged) and e.record.state != "Thinking"]
            return ends or None

        def assistant_ended() -> list[AssistantTurnEnded] | None:
            log = no_duplicate_seqs(log_of(settings, ASSISTANT, conversation))
            return [e.record for e in log if isinstance(e.record, AssistantTurnEnded)] or None

        (ended,) = wait_for(participant_ended, timeout=90, what="the participant turn's end")
        assert ended.state == "CouldNotInterpret", ended
        assert ended.reason_code == "DEADLINE_EXCEEDED", ended
        (over,) = wait_for(assistant_ended, timeout=90, what="the assistant turn's end")
        assert over.state == "Failed" and over.reason_code == "DEADLINE_EXCEEDED", over
        assert time.monotonic() - began >= DEADLINE_S - 1, "not before its deadline"

        # Not busy any more: the next message is taken (and runs into the same deadline).
        again = client.post(f"{ASSISTANT_BASE}/chat", json={
            "message": "Still there?", "stream": False, "conversation_id": conversation})
        assert again.status_code == 202, again.text
        second = again.json()["turn"]
        ends = wait_for(lambda: (e := assistant_ended()) and len(e) == 2 and e, timeout=90,
                        what="the second assistant turn's end")
        assert [e.turn for e in ends][-1] == second
        # Ended once: each first turn's end is still its only one.
        assert len(participant_ended() or []) == 1
        assert [e.turn for e in ends].count(over.turn) == 1
    finally:
        client.close()
        worker.kill()  # its model calls never return; a graceful stop would wait for them
        worker.wait()
