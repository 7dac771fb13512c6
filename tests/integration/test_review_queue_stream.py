"""The review queue live, on a real broker, worker and two edges: a reviewer's stream gets a
flagged contribution entered → reviewed (awaiting a second) → reviewed → published, with the
queue's dense seq as ``id:``; it resumes after a cursor on another edge; another tenant's
reviewers see nothing of it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from schemas.staff import QueueEventRecorded
from streams.ids import review_queue_key
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import REVIEW_QUEUE
from tests.integration.test_staff_helpers import Api, envelopes
from tests.support import read_sse

pytestmark = pytest.mark.integration

FLAGGED = "I met Jane Porter at jane@example.org; the lights on Elm Road are broken."


def queue_events(api: Api, sub: str = "rev1", deadline: float = 30.0,
                 until: Any = None, during: Any = None, tenant: str = "default",
                 **headers: str) -> list[tuple[int, dict[str, Any]]]:
    """(id, data) of the ``queue`` events of one stream read (to its end, or ``until``)."""
    token = mint_token(api.settings, sub, "reviewer", tenant)
    s = read_sse("GET", f"{api.url}/staff/reviews/stream", deadline=deadline,
                 headers={"Authorization": f"Bearer {token}", **headers}, until=until,
                 during=during)
    assert s.status == 200, s.body
    assert all(f.event == "queue" for f in s.frames if f.id is not None)
    return [(int(f.id), f.data) for f in s.frames if f.id is not None]


def published_seen(frames: list[Any]) -> bool:
    return any(f.id is not None and f.data["event"] == "published" for f in frames)


def test_a_reviewers_stream_follows_a_contribution_through_the_queue_and_resumes_elsewhere(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    # One edge whose streams stay open long enough to watch the whole review live, and one
    # with a short gateway bound (every read ends within a few seconds).
    live = Api(start_edge(VOICE_GATEWAY_BOUND_S="120"), settings)
    other = Api(start_edge(VOICE_GATEWAY_BOUND_S="4"), settings)
    issue = live.open_issue("Streetlights on Elm Road are broken")
    assert live.ok(live.get("/staff/reviews/queue", "rev1", "reviewer")) == {
        "last_seq": 0, "waiting": []}
    state: dict[str, str] = {}

    def review_it() -> None:
        """While the stream is open: contribute, then two reviewers approve in turn."""
        state["c"] = c = live.ok(live.post(f"/me/issues/{issue}/contributions", "ann",
                                           "participant", {"text": FLAGGED}), 202
                                 )["contribution"]
        for reviewer, waiting_for in (("rev1", "review"), ("rev2", "second_review")):
            live.until("/staff/reviews/queue", "rev1", "reviewer", lambda q, w=waiting_for: any(
                i["contribution"] == c and i["waiting_for"] == w for i in q["waiting"]),
                timeout=90, what=f"{c} waiting for {waiting_for}")
            live.ok(live.post(f"/staff/contributions/{c}/review", reviewer, "reviewer",
                              {"decision": "approve"}), 202)

    events = queue_events(live, deadline=180, until=published_seen, during=review_it)
    c = state["c"]
    assert [(seq, e["event"], e["waiting_for"]) for seq, e in events] == [
        (1, "entered", "review"), (2, "reviewed", "second_review"), (3, "reviewed", None),
        (4, "published", None)]
    assert all(e["contribution"] == c and e["issue"] == issue for _s, e in events)
    assert events[0][1]["flag_count"] == 2
    assert events[0][1]["flag_kinds"] == ["email", "person_name"]
    assert [r["by"] for r in events[3][1]["reviews"]] == ["rev1", "rev2"]
    assert "Jane" not in str(events)  # the queue carries counts and kinds, never the text

    # The log itself: one writer, dense seqs, each event once, keyed by the tenant's queue.
    log = envelopes(settings, REVIEW_QUEUE)
    assert [(e.seq, e.id) for e in log] == [
        (1, f"{c}:entered"), (2, f"{c}:reviewed:1"), (3, f"{c}:reviewed:2"),
        (4, f"{c}:published")]
    assert all(isinstance(e.record, QueueEventRecorded) and e.tenant == "default"
               and e.key == review_queue_key("default") for e in log)

    # Another edge, with the same ids: resume after a cursor (Last-Event-ID, or after=).
    other.until("/staff/reviews/queue", "rev1", "reviewer", lambda q: q["last_seq"] == 4,
                timeout=60, what="the second edge's view of the queue")
    assert other.ok(other.get("/staff/reviews/queue", "rev1", "reviewer"))["waiting"] == []
    assert queue_events(other, **{"Last-Event-ID": "2"}) == events[2:]
    assert [s for s, _e in queue_events(other)] == [1, 2, 3, 4]

    # Another tenant's reviewer: an empty queue and a silent stream.
    outsider = mint_token(settings, "rev9", "reviewer", "t2")
    r = httpx.get(f"{other.url}/staff/reviews/queue",
                  headers={"Authorization": f"Bearer {outsider}"}, timeout=15)
    assert r.status_code == 200 and r.json() == {"last_seq": 0, "waiting": []}
    assert queue_events(other, sub="rev9", tenant="t2") == []
