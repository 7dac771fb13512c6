"""Cancelling a running turn through the edge: the engine honours it before its next model
call, and the turn ends CouldNotInterpret saying it was cancelled."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from deploy.kafka_local import free_port
from schemas.workflow import WorkflowCommandReceived, WorkflowCompleted
from streams.envelope import decode
from streams.settings import VoiceSettings
from streams.topics import AGENT, WORKFLOWS, topic_name
from tests.integration.test_spine import auth
from tests.integration.test_turn_worker import log_of
from tests.support import read_all, step_running, stop, wait_for, wait_http_ready

pytestmark = pytest.mark.integration


def test_a_running_turn_is_cancelled(settings: VoiceSettings, start_worker, start_edge,
                                     tmp_path) -> None:  # noqa: ANN001
    port = free_port()
    slow = subprocess.Popen([sys.executable, "-m", "deploy.cli", "simulator", "--port", str(port)],
                            env={**os.environ, "VOICE_SIMULATOR_LATENCY_MS": "3000"},
                            stdout=open(tmp_path / "sim.log", "ab"), stderr=subprocess.STDOUT)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}/health", proc=slow)
        start_worker(ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}")
        url = start_edge()
        h = auth(settings)
        cnv = httpx.post(f"{url}/me/conversations", headers=h, timeout=10).json()["conversation"]
        posted = httpx.post(f"{url}/me/conversations/{cnv}/messages", headers=h, timeout=10,
                            json={"text": "The bus stop has no shelter. Please build one."})
        turn = posted.json()["turn"]
        wait_for(lambda: step_running(settings, turn), what="the step")
        cancelled = httpx.post(f"{url}/me/conversations/{cnv}/turns/{turn}/cancel", headers=h,
                               timeout=10)
        assert cancelled.status_code == 202, cancelled.text
        assert cancelled.json() == {"turn": turn, "state": "Thinking", "cancel": "requested"}
        t0 = time.monotonic()

        def ended() -> dict | None:
            body = httpx.get(f"{url}/me/conversations/{cnv}/turns/{turn}", headers=h).json()
            return body if body["state"] != "Thinking" else None

        body = wait_for(ended, timeout=30, what="the cancelled turn to end")
    finally:
        stop(slow)
    assert body["state"] == "CouldNotInterpret" and "cancelled by alice" in body["reason"]
    assert body["reply"] is None
    assert time.monotonic() - t0 < 15
    wf = [e.record for e in log_of(settings, WORKFLOWS, turn)]
    assert isinstance(wf[-1], WorkflowCompleted)
    commands = [m for m in read_all(settings, topic_name(settings, WORKFLOWS))
                if m.key() == turn.encode()]
    kinds = [decode(m.key(), m.value(), m.headers()).record for m in commands]
    assert any(isinstance(r, WorkflowCommandReceived) and r.command == "cancel" for r in kinds)
    # At most the call in flight when the cancel came (none if it came while the step read
    # its transcript back from the log), never a second: honoured before it.
    calls = [m for m in read_all(settings, topic_name(settings, AGENT))
             if m.key() == turn.encode() and dict(m.headers())["ce_type"]
             in (b"voice.agent.model_call.v1", b"voice.agent.model_call.v2")]
    assert len(calls) <= 1
    # A turn that already ended is left as it is: no second command is recorded.
    again = httpx.post(f"{url}/me/conversations/{cnv}/turns/{turn}/cancel", headers=h,
                       timeout=10)
    assert again.status_code == 202 and again.json()["state"] == "CouldNotInterpret"
    after = [decode(m.key(), m.value(), m.headers()).record
             for m in read_all(settings, topic_name(settings, WORKFLOWS))
             if m.key() == turn.encode()]
    assert sum(isinstance(r, WorkflowCommandReceived) for r in after) == 1


def test_a_running_assistant_turn_is_cancelled(settings: VoiceSettings, start_worker,
                                               start_edge, tmp_path) -> None:  # noqa: ANN001
    from tests.integration.test_assistant_chat import BASE, MAP_ASK, chat, turn_done, upload

    port = free_port()
    slow = subprocess.Popen([sys.executable, "-m", "deploy.cli", "simulator", "--port", str(port)],
                            env={**os.environ, "VOICE_SIMULATOR_LATENCY_MS": "2500"},
                            stdout=open(tmp_path / "sim.log", "ab"), stderr=subprocess.STDOUT)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}/health", proc=slow)
        start_worker(ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}")
        url = start_edge()
        dataset = upload(url, settings).json()["dataset_id"]
        r = chat(url, settings, {"message": MAP_ASK, "data_refs": [dataset]})
        assert r.status_code == 202, r.text
        conversation, turn = r.json()["conversation_id"], r.json()["turn"]
        wait_for(lambda: step_running(settings, turn), what="the step")
        cancelled = httpx.post(f"{url}{BASE}/conversations/{conversation}/turns/{turn}/cancel",
                               headers=auth(settings), timeout=10)
        assert cancelled.status_code == 202, cancelled.text
        done = wait_for(lambda: turn_done(url, settings, conversation, turn), timeout=40,
                        what="the cancelled turn to end")
    finally:
        stop(slow)
    assert done["state"] == "Cancelled" and done["end_reason"] == "cancelled"
    calls = [m for m in read_all(settings, topic_name(settings, AGENT))
             if m.key() == turn.encode() and dict(m.headers())["ce_type"]
             in (b"voice.agent.model_call.v1", b"voice.agent.model_call.v2")]
    assert len(calls) < 4  # the map flow needs 4 model calls; it stopped before them
