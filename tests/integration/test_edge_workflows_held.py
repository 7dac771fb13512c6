"""What an edge holds of ``voice.workflows`` (issue 14): each turn puts a workflow there, so an
edge keeps only the last ``VOICE_EDGE_TURN_WORKFLOWS_KEPT`` ended turns' workflows, and one with
a history window does not even read the turns' workflows older than it at start. Every other
workflow (a research run here) is read and kept whatever its age. A turn's workflow it does
not hold is read from the log when asked for, so an operator still gets it. The real broker,
real edges; the records are produced onto the log as the workflow runtime writes them."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from schemas.workflow import LastStepSucceeded, StepOutcome, StepStarted, WorkflowStarted
from streams.envelope import Envelope, encode
from streams.ids import new_conversation_id, turn_id
from streams.producer import PRODUCER_CONFIG
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import WORKFLOWS, topic_name
from tests.support import edge_state

pytestmark = pytest.mark.integration

OLD_TURNS = 20
KEPT = 5
WINDOW_S = 600.0


def lifecycle(workflow: str, kind: str) -> list[Envelope]:
    """A one-step workflow from start to end, as the runtime writes it."""
    out = [WorkflowStarted(workflow=workflow, kind=kind, input={"tenant": "default"}),
           StepStarted(workflow=workflow, step="reply", attempt=1),
           StepOutcome(workflow=workflow, step="reply", step_index=0, attempt=1,
                       status="succeeded", output={"state": "Replied"}),
           LastStepSucceeded(workflow=workflow, step="reply", attempt=1,
                             output={"state": "Replied"})]
    return [Envelope(record=r, key=workflow, source="/voice/worker", tenant="default",
                     seq=None if isinstance(r, StepOutcome) else n, id=f"{workflow}:{n}")
            for n, r in enumerate(out, start=1)]


def produce(settings: VoiceSettings, envs: list[Envelope], at_ms: int) -> None:
    p = Producer({**PRODUCER_CONFIG, "bootstrap.servers": settings.bootstrap})  # its partitioner
    for e in envs:
        key, value, headers = encode(e)
        p.produce(topic_name(settings, WORKFLOWS), value, key, headers=headers, timestamp=at_ms)
    assert p.flush(30) == 0


def staff_workflow(url: str, settings: VoiceSettings, workflow: str) -> int:
    token = mint_token(settings, "olga", "operator")
    return httpx.get(f"{url}/staff/workflows/{workflow}", timeout=30,
                     headers={"Authorization": f"Bearer {token}"}).status_code


def listed(url: str, settings: VoiceSettings) -> set[str]:
    token = mint_token(settings, "olga", "operator")
    r = httpx.get(f"{url}/staff/workflows", params={"limit": 500}, timeout=30,
                  headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return {w["workflow"] for w in r.json()}


def held(url: str, settings: VoiceSettings) -> dict[str, Any]:
    return edge_state(url, settings)["workflows"]


def test_an_edge_keeps_the_last_ended_turn_workflows_and_a_windowed_one_reads_no_old_ones(
    settings: VoiceSettings, start_edge  # noqa: ANN001
) -> None:
    hour_ago = int((time.time() - 3600) * 1000)
    old_turns = [turn_id(new_conversation_id(now=hour_ago / 1000 + i), 2)
                 for i in range(OLD_TURNS)]
    run = "run-old-research"
    produce(settings, lifecycle(run, "research"), hour_ago)
    for i, t in enumerate(old_turns):
        produce(settings, lifecycle(t, "conversation-turn"), hour_ago + i)
    extract = f"{old_turns[0]}:extract"  # a workflow made for a turn is a turn's too
    produce(settings, lifecycle(extract, "assistant-extraction"), hour_ago + OLD_TURNS)
    recent = turn_id(new_conversation_id(), 2)
    produce(settings, lifecycle(recent, "conversation-turn"), int(time.time() * 1000))

    # The whole log read: every turn's workflow taken up, the last KEPT ended kept (the last
    # as this edge read them: its partitions interleave).
    full = start_edge(VOICE_EDGE_TURN_WORKFLOWS_KEPT=str(KEPT))
    assert held(full, settings) == {"in_memory": 1 + KEPT, "turns_let_go": OLD_TURNS + 2 - KEPT,
                                    "left_before_window": 0}
    kept = listed(full, settings)
    assert run in kept and len(kept - {run}) == KEPT
    assert kept - {run} <= {*old_turns, extract, recent}
    gone = next(t for t in old_turns if t not in kept)
    # Asked for, one let go of is read from the log (and held as the last ended).
    assert staff_workflow(full, settings, gone) == 200
    assert gone in listed(full, settings)
    assert held(full, settings)["turns_let_go"] == OLD_TURNS + 3 - KEPT
    assert staff_workflow(full, settings, turn_id(new_conversation_id(), 2)) == 404

    # A window: the old turns' workflows are not read at all; the old research run is.
    windowed = start_edge(VOICE_EDGE_HISTORY_S=str(WINDOW_S))
    assert held(windowed, settings) == {"in_memory": 2, "turns_let_go": 0,
                                        "left_before_window": 4 * (OLD_TURNS + 1)}
    assert listed(windowed, settings) == {run, recent}
    assert staff_workflow(windowed, settings, run) == 200
    # One from before the window, asked for: read from the log.
    assert staff_workflow(windowed, settings, old_turns[-1]) == 200
    assert listed(windowed, settings) == {run, recent, old_turns[-1]}

    # A turn's workflow that started after the edge: taken up, and let go of past the bound.
    later = turn_id(new_conversation_id(), 2)
    produce(settings, lifecycle(later, "conversation-turn"), int(time.time() * 1000))
    for url in (full, windowed):
        deadline = time.monotonic() + 30
        while staff_workflow(url, settings, later) != 200:
            assert time.monotonic() < deadline, f"{later} not taken up by {url}"
            time.sleep(0.2)
    assert held(full, settings)["turns_let_go"] == OLD_TURNS + 4 - KEPT
    assert held(windowed, settings)["in_memory"] == 4
