"""An issue with 2,000 pieces of evidence and 5,000 followers, on a real broker, worker and
edge with the record bound at 128 KiB (issue 12 §2).

Before inputs were references, a research run copied the issue's latest 200 pieces of
evidence into its ``WorkflowStarted`` (here ≈ 190 KB: the edge answered 413) and a delivery
copied every follower into its own (≈ 170 KB: refused, so the update was never delivered),
and the issue writer and the developments consumer each kept every follower in one table
value. Now a run reads its evidence back from the issue's log and a delivery its followers:
the run ends, every follower gets the update once, and no record on any topic of the stack —
changelogs and dead letters included — is over the bound.
"""

from __future__ import annotations

from collections import Counter

import pytest

from schemas.staff import AddEvidence, FollowIssue, NotificationRecorded
from streams.envelope import Envelope
from streams.producer import record_size
from streams.settings import VoiceSettings
from streams.topics import COMMANDS, INBOX
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
    issue = api.open_issue("Streetlights on Elm Road are broken", "The corner is dark.")
    # Straight onto the commands topic (the edge would take as long as the test may).
    produce(settings, COMMANDS, *(Envelope(
        record=AddEvidence(issue=issue, evidence=f"evd-{n:016x}", title=f"Source {n}",
                           body=f"{n}. {BODY}", added_by="sam"),
        key=issue, source="/test", tenant="default") for n in range(EVIDENCE)))
    produce(settings, COMMANDS, *(Envelope(
        record=FollowIssue(issue=issue, participant=follower(n)), key=issue, source="/test",
        tenant="default") for n in range(FOLLOWERS)))
    api.until(f"/staff/issues/{issue}", "sam", "staff",
              lambda j: len(j["evidence"]) == EVIDENCE and j["followers"] == FOLLOWERS,
              timeout=240, what="the evidence and the followers")

    run = api.ok(api.post(f"/staff/issues/{issue}/research", "sam", "staff"), 202)["run"]
    development = api.ok(api.post(f"/staff/issues/{issue}/developments", "sam", "staff",
                                  {"title": "Repairs approved", "body": "Next week."}),
                         202)["development"]
    done = api.until(f"/staff/research/{run}", "sam", "staff",
                     lambda j: j["state"] != "Running", timeout=180, what="the run to end")
    assert done["state"] == "Done", done
    # It read the latest evidence of the issue as of the request.
    read = {i for s in done["suggestions"].values() for x in s for i in x["read"]}
    assert f"evd-{EVIDENCE - 1:016x}" in read and "evd-0000000000000000" not in read

    def delivered() -> Counter[str] | None:
        assert worker.poll() is None, "the worker exited"
        got = Counter(e.record.recipient for e in envelopes(settings, INBOX)
                      if isinstance(e.record, NotificationRecorded)
                      and e.record.development == development)
        return got if len(got) == FOLLOWERS else None

    got = wait_for(delivered, timeout=300, interval=3, what="every follower's notification")
    assert set(got.values()) == {1} and set(got) == {follower(n) for n in range(FOLLOWERS)}
    api.until(f"/staff/issues/{issue}", "sam", "staff",
              lambda j: j["developments"][0]["delivery"] == "delivered", timeout=60,
              what="the delivery to end")

    sizes: dict[str, int] = {}
    for topic in stack_topics(settings):
        msgs = read_all(settings, topic, timeout=30)
        sizes[topic] = max((record_size(m.key(), m.value(), m.headers()) for m in msgs),
                           default=0)
        if topic.endswith(".dlq"):
            assert not msgs, f"{topic} holds {len(msgs)} dead letters"
    over = {t: s for t, s in sizes.items() if s > BOUND}
    assert not over, f"records over {BOUND} bytes: {over}"
    workflows = {t: s for t, s in sizes.items() if "workflows" in t}
    assert all(s < 16 * 1024 for s in workflows.values()), workflows
