"""An issue with 2,000 pieces of evidence and 5,000 followers, on a real broker, worker and
edge with the record bound at 128 KiB (issue 12 §2).

Before inputs were references, a research run copied the issue's latest 200 pieces of
evidence into its ``WorkflowStarted`` (here ≈ 190 KB: the edge answered 413) and a delivery
copied every follower into its own (≈ 170 KB: refused, so the update was never delivered),
and the issue writer and the developments consumer each kept every follower in one table
value. Now a run reads its evidence back from the issue's log and a delivery its followers:
the run ends, every follower gets the update once, and no record on any topic of the stack —
changelogs and dead letters included — is over the bound.

The issue's log is written by its writer, from 7,000 commands put on ``voice.commands`` at
once (as from past the edge, without 7,000 requests): since decision 0016 the writer tells the
developments handler each record it put there, so a log written around it would start no
delivery. The writer's own memory of followers is bounded by
``tests/unit/test_staff_writers.py``.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter

import pytest

from schemas.agent import ToolCallRecorded
from schemas.base import Record
from schemas.staff import (
    AddEvidence,
    FollowIssue,
    NotificationRecorded,
    OpenIssue,
    RecordDevelopment,
)
from schemas.workflow import WorkflowCompleted
from streams.envelope import Envelope
from streams.producer import record_size
from streams.settings import VoiceSettings
from streams.topics import AGENT, COMMANDS, INBOX, WORKFLOWS
from tests.faults.test_long_conversation import stack_topics
from tests.integration.test_staff_helpers import Api, envelopes, produce
from tests.support import read_all, wait_for

pytestmark = pytest.mark.integration

BOUND = 128 * 1024
EVIDENCE = 2000
FOLLOWERS = 5000
BODY = "The streetlight on Elm Road is broken and the corner is dark at night. " * 11  # ≈ 800 B


def follower(n: int) -> str:
    return f"participant-with-a-long-id-{n:05d}"


def test_research_and_delivery_over_thousands_of_evidence_and_followers_stay_under_the_bound(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    worker = start_worker(VOICE_MAX_RECORD_BYTES=str(BOUND))
    api = Api(start_edge(VOICE_MAX_RECORD_BYTES=str(BOUND)), settings)
    issue = f"iss-{secrets.token_hex(8)}"
    development = f"{issue}:dev-1"
    commands: list[Record] = [
        OpenIssue(issue=issue, title="Streetlights on Elm Road are broken",
                  summary="The corner is dark.", by="sam"),
        *(AddEvidence(issue=issue, evidence=f"evd-{n:016x}", title=f"Source {n}",
                      body=f"{n}. {BODY}", added_by="sam") for n in range(EVIDENCE)),
        *(FollowIssue(issue=issue, participant=follower(n)) for n in range(FOLLOWERS)),
        RecordDevelopment(issue=issue, title="Repairs approved", body="Next week.", by="sam")]
    produce(settings, COMMANDS, *(Envelope(record=r, key=issue, source="/test", subject=issue,
                                           id=f"{issue}-cmd-{n}", tenant="default")
                                  for n, r in enumerate(commands, start=1)))
    wait_for(lambda: api.get(f"/staff/issues/{issue}", "sam", "staff").json().get(
        "followers") == FOLLOWERS, timeout=120, interval=2, what="the edge to read the issue")

    run = api.ok(api.post(f"/staff/issues/{issue}/research", "sam", "staff"), 202)["run"]
    done = api.until(f"/staff/research/{run}", "sam", "staff",
                     lambda j: j["state"] != "Running", timeout=180, what="the run to end")
    # The step read the issue's latest 200 pieces back from the log and gave them to the
    # agent (its tool call's result, on voice.agent). The simulated assistant then lists all
    # 201 ids read in each of its three sections, which is over its 4,096-token answer: the
    # answer may be cut and the run fail on it — the model's side, not the reading's.
    calls = [e.record for e in envelopes(settings, AGENT, run)
             if isinstance(e.record, ToolCallRecorded) and e.record.tool_name == "get_issue"]
    assert calls, "the agent called get_issue"
    for call in calls:  # each attempt read the same span
        result = json.dumps(call.result)
        assert all(f"evd-{n:016x}" in result for n in range(EVIDENCE - 200, EVIDENCE))
        assert f"evd-{EVIDENCE - 201:016x}" not in result
    failures = {e.record.error_type for e in envelopes(settings, WORKFLOWS, run)
                if type(e.record).__name__ == "StepFailed"}
    # The answer's parse fails as StepError; a read of the log would fail as LogUnavailable.
    assert done["state"] == "Done" or failures == {"StepError"}, (done, failures)

    def delivered() -> Counter[str] | None:
        assert worker.poll() is None, "the worker exited"
        got = Counter(e.record.recipient for e in envelopes(settings, INBOX)
                      if isinstance(e.record, NotificationRecorded)
                      and e.record.development == development)
        return got if len(got) == FOLLOWERS else None

    got = wait_for(delivered, timeout=400, interval=5, what="every follower's notification")
    assert set(got.values()) == {1} and set(got) == {follower(n) for n in range(FOLLOWERS)}
    wait_for(lambda: any(isinstance(e.record, WorkflowCompleted)
                         for e in envelopes(settings, WORKFLOWS, development)),
             timeout=60, what="the delivery to complete")

    sizes: dict[str, int] = {}
    for topic in stack_topics(settings):
        msgs = read_all(settings, topic, timeout=30)
        sizes[topic] = max((record_size(m.key(), m.value(), m.headers()) for m in msgs),
                           default=0)
        if topic.endswith(".dlq"):
            assert not msgs, f"{topic} holds {len(msgs)} dead letters"
    over = {t: s for t, s in sizes.items() if s > BOUND}
    assert not over, f"records over {BOUND} bytes: {over}"
    # The workflows' records hold no evidence and no followers: the largest is the run's
    # suggestions, with the ids of the (at most 200) pieces it read.
    workflows = {t: s for t, s in sizes.items() if "workflows" in t}
    assert all(s < 32 * 1024 for s in workflows.values()), workflows
