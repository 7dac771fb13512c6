"""Fault 4 of issue 12: a rebalance storm — workers 1 → 3 → 1 under a steady load.

Partitions of the commands, logs and workflows move between workers while messages arrive and
turns run: every POST is answered within the bound (``202``, or ``503`` with ``Retry-After``
while a partition has no owner yet); every message is recorded once (those refused are sent
again with their key); no conversation's seq has a gap or a duplicate; every turn is
requested once, ends once and is replied once; the first worker stays up throughout.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from deploy.processes import stop, worker_group
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from tests.faults.traffic import (
    SteadyPosts,
    assert_within_bound,
    resend_and_audit,
    timeline,
    wait_members,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults,
              # Its own bounded waits (the load, the group settling four times, resends up to
              # 180 s, every turn terminal up to 300 s) add up past the suite's default.
              pytest.mark.timeout(900)]

CONVERSATIONS = 6


def test_workers_one_three_one_under_load_leave_no_gap_duplicate_or_unreplied_turn(
        settings: VoiceSettings, start_worker, start_edge, tmp_path: Path) -> None:  # noqa: ANN001
    first = start_worker(VOICE_QUOTA_TENANT_TOKENS_PER_DAY="0")
    url = start_edge(VOICE_QUOTA_MESSAGES_PER_MINUTE="0")
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    bound = settings.gateway_bound_s
    client = httpx.Client(base_url=url, headers=auth, timeout=bound * 3,
                          limits=httpx.Limits(max_connections=200))
    extra: list = []

    group = worker_group(settings)

    changes: list[tuple[str, float]] = []  # each change, and seconds until the group settled

    def join() -> None:
        began = time.monotonic()
        extra.append(start_worker(wait=False, VOICE_QUOTA_TENANT_TOKENS_PER_DAY="0"))
        wait_members(settings, group, 1 + len(extra))
        changes.append((f"join->{1 + len(extra)}", round(time.monotonic() - began, 1)))

    def leave() -> None:
        began = time.monotonic()
        stop(extra.pop(0))
        wait_members(settings, group, 1 + len(extra))
        changes.append((f"leave->{1 + len(extra)}", round(time.monotonic() - began, 1)))

    def pause() -> None:
        time.sleep(3)

    try:
        cnvs = [client.post("/me/conversations").json()["conversation"]
                for _ in range(CONVERSATIONS)]
        # Each change waits for the group to settle (a worker starts slowly on a busy
        # machine), then the next comes 3 s later; the load goes on until the last is done.
        load = SteadyPosts(client, cnvs, rate=10, seconds=10)
        answers = load.run(during=[(3.0, join), (0, pause), (0, join), (0, pause),
                                   (0, leave), (0, pause), (0, leave), (0, pause)])
        print(f"changes {changes}; {timeline(answers)}")
        assert_within_bound(answers, bound)
        resend_and_audit(settings, load, cnvs, logs_dir=tmp_path, workers=[first, *extra])
        assert first.poll() is None, "the first worker stayed up"
        assert not extra
    finally:
        client.close()
