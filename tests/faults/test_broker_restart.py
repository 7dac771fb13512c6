"""Fault 2 of issue 12: the broker stopped and started again under a steady 20 POSTs/s.

Every POST is answered within the gateway bound — ``202`` or ``503`` with ``Retry-After``,
nothing else; every message answered ``202`` is on the log exactly once at the seq it was
answered with; every message refused during the outage, sent again with its key, is recorded
once too; every turn ends once and is replied once; no process died.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from deploy.kafka_local import LocalKafka, free_port
from streams.tokens import mint_token
from streams.topics import create_topics
from tests.faults.traffic import SteadyPosts, audit, timeline, turns_terminal
from tests.support import (
    spawn_voice,
    stop,
    unique_settings,
    wait_group_stable,
    wait_http_ready,
    worker_group,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]

BOUND_S = 6.0
CONVERSATIONS = 4


def test_a_broker_restart_under_load_loses_nothing_and_answers_within_the_bound(
        own_broker: LocalKafka, tmp_path: Path, simulator_url: str) -> None:
    settings = unique_settings(own_broker.bootstrap, tmp_path, gateway_bound_s=BOUND_S)
    create_topics(settings)
    port = free_port()
    worker = spawn_voice(settings, "worker", log=tmp_path / "worker.log",
                         ANTHROPIC_API_KEY="simulator", ANTHROPIC_BASE_URL=simulator_url,
                         VOICE_QUOTA_TENANT_TOKENS_PER_DAY="0")
    edge = spawn_voice(settings, "edge", "--port", str(port), log=tmp_path / "edge.log",
                       VOICE_QUOTA_MESSAGES_PER_MINUTE="0")
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    client = httpx.Client(base_url=url, headers=auth, timeout=BOUND_S * 3,
                          limits=httpx.Limits(max_connections=200))
    outage: dict[str, float] = {}

    def stop_broker() -> None:
        outage["stopping"] = time.monotonic()
        own_broker.stop()
        outage["stopped"] = time.monotonic()

    def start_broker() -> None:
        own_broker.start(timeout=120)
        outage["started"] = time.monotonic()

    try:
        wait_http_ready(f"{url}/readyz", proc=edge, timeout=90)
        wait_group_stable(settings, worker_group(settings))
        cnvs = [client.post("/me/conversations").json()["conversation"]
                for _ in range(CONVERSATIONS)]
        load = SteadyPosts(client, cnvs, rate=20, seconds=30)
        t0 = time.monotonic()
        answers = load.run(during=[(3.0, stop_broker), (8.0, start_broker)])
        print(timeline(answers), {k: round(v - t0, 1) for k, v in outage.items()})

        statuses = Counter(a.status for a in answers)
        assert set(statuses) <= {202, 503}, statuses
        assert statuses[503] >= 20, f"the outage was not seen: {statuses}"
        late = [a for a in answers if a.took >= BOUND_S]
        assert not late, f"{len(late)} answers over the {BOUND_S}s bound: {late[:3]}"
        assert all(int(a.retry_after or 0) > 0 for a in answers if a.status == 503)
        # Every message refused, sent again with its key (as a client following Retry-After
        # does) until the stack, recovered, takes it.
        load.resend_refused(deadline_s=180)
        turns = {a.turn for a in load.answers if a.turn}
        logs = turns_terminal(settings, turns, timeout=300)
        ends = audit({c: logs[c] for c in cnvs}, load.answers)
        assert ends == Counter({"Replied": len(turns)}), ends
        assert worker.poll() is None and edge.poll() is None
    finally:
        client.close()
        stop(edge)
        stop(worker)
