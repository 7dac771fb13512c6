"""Fault 5 of issue 12: a model call longer than the worker consumer's ``max.poll.interval.ms``
→ no duplicate step, the reply recorded once, and the worker keeps consuming meanwhile.

A consumer that does not poll within ``max.poll.interval.ms`` is taken out of its group and
its partitions go to another member — which would run the step again. A step runs as a task
beside the agent's loop (decision 0004), so its model call never holds the poll: here every
model call takes ``MODEL_CALL_S``, three times ``POLL_S``, and each turn runs its step once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.kafka_local import free_port
from schemas.conversation import ReplyRecorded, TurnStateChanged
from schemas.workflow import LastStepSucceeded, StepFailed, StepStarted
from streams.envelope import Envelope
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import CONVERSATIONS, WORKFLOWS
from tests.support import accepted, log_of, no_duplicate_seqs, stop, wait_for, wait_http_ready

pytestmark = [pytest.mark.integration, pytest.mark.faults]

POLL_S = 3
MODEL_CALL_S = 9


@pytest.fixture
def slow_model(tmp_path: Path) -> Iterator[str]:
    """The model simulator, answering each call after ``MODEL_CALL_S``."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "simulator", "--port", str(port)],
        env={**os.environ, "VOICE_SIMULATOR_LATENCY_MS": str(MODEL_CALL_S * 1000)},
        stdout=open(tmp_path / "slow-simulator.log", "ab"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(f"{url}/health", proc=proc)
        yield url
    finally:
        stop(proc)


def test_a_model_call_longer_than_the_poll_interval_runs_its_step_once(
        settings: VoiceSettings, start_worker: Callable[..., Any],
        start_edge: Callable[..., str], slow_model: str) -> None:
    worker = start_worker(ANTHROPIC_BASE_URL=slow_model,
                          VOICE_WORKER_MAX_POLL_INTERVAL_S=str(POLL_S))
    url = start_edge()
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    client = httpx.Client(base_url=url, headers=auth, timeout=30)
    try:
        cnv = accepted(lambda: client.post("/me/conversations")).json()["conversation"]
        turns = []
        for n, text in enumerate(("The streetlight on Elm Road is broken.",
                                  "And the bins on Elm Road were not collected.")):
            r = accepted(lambda n=n, text=text: client.post(
                f"/me/conversations/{cnv}/messages", json={"text": text},
                headers={"Idempotency-Key": f"m{n}"}))
            turns.append(r.json()["turn"])  # the second is recorded during the first's call

        def ended() -> list[Envelope] | None:
            log = log_of(settings, CONVERSATIONS, cnv)
            done = {e.record.turn for e in log if isinstance(e.record, TurnStateChanged)
                    and e.record.state != "Thinking"}
            return log if done >= set(turns) else None

        log = no_duplicate_seqs(wait_for(ended, timeout=180, what="both turns to end"))
        for turn in turns:
            replies = [e for e in log if isinstance(e.record, ReplyRecorded)
                       and e.record.turn == turn]
            states = [e.record.state for e in log if isinstance(e.record, TurnStateChanged)
                      and e.record.turn == turn]
            assert len(replies) == 1 and states == ["Thinking", "Replied"], (turn, states)
            lifecycle = no_duplicate_seqs([e for e in log_of(settings, WORKFLOWS, turn)
                                           if e.seq is not None])
            records = [e.record for e in lifecycle]
            # One attempt: one start, no failure, its success the workflow's end.
            assert sum(isinstance(r, StepStarted) for r in records) == 1, records
            assert not any(isinstance(r, StepFailed) for r in records), records
            assert isinstance(records[-1], LastStepSucceeded), records[-1]
        assert worker.poll() is None, "the worker stayed up"
    finally:
        client.close()
