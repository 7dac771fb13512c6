"""A worker forgets the workflows that ended longer than ``VOICE_WORKFLOW_RETAIN_S`` ago
(``WorkflowsForgotten``, then a tombstone in its table's changelog), so a worker reading the
table back reads what ran lately, not all that ever ran.

On the real broker, with workers SIGKILLed: the successor of a killed worker forgets the
ended turn; the next successor reads the table back without it (it never names it again);
the conversation goes on, and no forgotten turn runs twice."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from schemas.conversation import ReplyRecorded, TurnStateChanged
from schemas.workflow import WorkflowsForgotten, WorkflowStarted
from streams.envelope import Envelope, decode
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import COMMANDS, CONVERSATIONS, WORKFLOWS, topic_name
from tests.faults.test_held_table_writes import changelog_states
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

RETAIN = {"VOICE_WORKFLOW_RETAIN_S": "2"}


def forgotten_records(settings: VoiceSettings) -> dict[tuple[int, int], WorkflowsForgotten]:
    """Every ``WorkflowsForgotten`` on the log, by (partition, offset): a list read partition
    by partition is not in the order they were produced."""
    out = {}
    for m in read_all(settings, topic_name(settings, WORKFLOWS)):
        env = decode(m.key(), m.value(), m.headers())
        if isinstance(env.record, WorkflowsForgotten):
            out[(m.partition(), m.offset())] = env.record
    return out


def all_committed(settings: VoiceSettings) -> bool:
    """Whether the worker group has committed every record of the topics it consumes (not
    ``voice.conversations``: its writer tells the worker what it put there, decision 0016)."""
    return caught_up(settings, worker_group(settings), [
        (topic_name(settings, spec), p) for spec in (WORKFLOWS, COMMANDS)
        for p in range(settings.topic_partitions)])


def test_a_killed_worker_s_successor_forgets_ended_turns_and_the_next_never_reads_them_back(
        settings: VoiceSettings, start_worker: Callable[..., Any],
        start_edge: Callable[..., str]) -> None:
    url = start_edge()
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    with httpx.Client(base_url=url, headers=auth, timeout=30) as client:
        first = start_worker(**RETAIN)
        cnv = accepted(lambda: client.post("/me/conversations",
                                           headers={"Idempotency-Key": "open"})).json()[
            "conversation"]

        def replied(n: int) -> list[Envelope] | None:
            log = log_of(settings, CONVERSATIONS, cnv)
            ends = [e for e in log if isinstance(e.record, TurnStateChanged)
                    and e.record.state == "Replied"]
            return log if len(ends) >= n else None

        def turns(log: list[Envelope]) -> list[str]:
            return list(dict.fromkeys(e.record.turn for e in log
                                      if isinstance(e.record, TurnStateChanged)))

        send_message(client, cnv, "m1", "Message 1: the light on Elm Road is out.")
        [turn1] = turns(wait_for(lambda: replied(1), timeout=60, what="the first reply"))
        wait_for(lambda: all_committed(settings), timeout=30, what="the worker's commits")

        # Killed; its successor starts past the retention, and its first look at every
        # workflow (once the table is back) finds the turn ended long enough.
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        second = start_worker(**RETAIN)
        records = wait_for(lambda: [r for r in forgotten_records(settings).values()
                                    if turn1 in r.workflows] or None,
                           timeout=60, what="a WorkflowsForgotten naming the first turn")
        assert records[0].ended_before > 0
        wait_for(lambda: (changelog_states(settings, turn1) or [{}])[-1] is None, timeout=60,
                 what="the first turn's tombstone in the workflows changelog")

        send_message(client, cnv, "m2", "Message 2: and on Oak Street.")
        log = wait_for(lambda: replied(2), timeout=90, what="the second reply")
        turn2 = turns(log)[1]
        wait_for(lambda: all_committed(settings), timeout=30, what="the worker's commits")
        before = forgotten_records(settings)
        # (The second worker's own look, every 60 s, may have forgotten the second turn too.)
        awaited = turn2 if all(turn2 not in r.workflows for r in before.values()) else None

        # Killed again: the next worker reads the table back from the changelog. Its first
        # look names the second turn (ended past its retention, if still there), never the
        # first: it is not there.
        os.kill(second.pid, signal.SIGKILL)
        second.wait(timeout=30)
        start_worker(**RETAIN)

        def new_names() -> set[str]:
            return {w for at, r in forgotten_records(settings).items() if at not in before
                    for w in r.workflows}

        if awaited is not None:
            wait_for(lambda: awaited in new_names(), timeout=60,
                     what="the third worker's WorkflowsForgotten naming the second turn")
        assert turn1 not in new_names()

        send_message(client, cnv, "m3", "Message 3: and the one by the school.")
        log = no_duplicate_seqs(wait_for(lambda: replied(3), timeout=90,
                                         what="the third reply"))
        # No forgotten turn ran again: one start, one reply each.
        assert sum(isinstance(e.record, ReplyRecorded) for e in log) == 3
        for turn in (turn1, turn2):
            starts = [e for e in log_of(settings, WORKFLOWS, turn)
                      if isinstance(e.record, WorkflowStarted)]
            assert len({e.id for e in starts}) == 1, starts
