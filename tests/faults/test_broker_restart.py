"""Fault 2 of issue 12: the broker stopped and started again under a steady 20 POSTs/s.

Every POST is answered within the gateway bound — ``202`` or ``503`` with ``Retry-After``,
nothing else; every message answered ``202`` is on the log exactly once at the seq it was
answered with; every message refused during the outage, sent again with its key, is recorded
once too; every turn ends once and is replied once; no process died.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.conftest import OwnStack
from tests.faults.traffic import SteadyPosts, assert_within_bound, resend_and_audit, timeline

pytestmark = [pytest.mark.integration, pytest.mark.faults]

BOUND_S = 6.0
CONVERSATIONS = 4


def test_a_broker_restart_under_load_loses_nothing_and_answers_within_the_bound(
        own_stack: Callable[[float], OwnStack], tmp_path: Path) -> None:
    stack = own_stack(BOUND_S)  # its processes log into tmp_path
    client, own_broker = stack.client, stack.broker
    outage: dict[str, float] = {}

    def stop_broker() -> None:
        outage["stopping"] = time.monotonic()
        own_broker.stop()
        outage["stopped"] = time.monotonic()

    def start_broker() -> None:
        own_broker.start(timeout=120)
        outage["started"] = time.monotonic()

    cnvs = [client.post("/me/conversations").json()["conversation"]
            for _ in range(CONVERSATIONS)]
    load = SteadyPosts(client, cnvs, rate=20, seconds=30)
    t0 = time.monotonic()
    answers = load.run(during=[(3.0, stop_broker), (8.0, start_broker)])
    print(timeline(answers), {k: round(v - t0, 1) for k, v in outage.items()})

    statuses = assert_within_bound(answers, BOUND_S)
    assert statuses[503] >= 20, f"the outage was not seen: {statuses}"
    # Every message refused, sent again with its key (as a client following Retry-After
    # does) until the stack, recovered, takes it; then the log's audit.
    resend_and_audit(stack.settings, load, cnvs, logs_dir=tmp_path, workers=[stack.worker])
    assert stack.alive()
