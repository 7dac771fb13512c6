"""Update delivery end to end on a real broker, worker and edge: followers, one workflow per
development in order, the inbox (poll and SSE), and a notification never sent twice across a
worker killed mid-step."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest

from schemas.staff import NotificationRecorded
from schemas.workflow import WorkflowCompleted, WorkflowStarted
from streams.envelope import Envelope
from streams.ids import inbox_key
from streams.settings import VoiceSettings
from streams.topics import INBOX, WORKFLOWS, topic_name
from tests.integration.test_staff_helpers import Api, envelopes, kill, produce
from tests.support import read_all, read_sse, wait_for

pytestmark = pytest.mark.integration


def follow(api: Api, issue: str, *subs: str) -> None:
    for sub in subs:
        assert api.ok(api.post(f"/me/issues/{issue}/follow", sub, "participant")) == {
            "issue": issue, "following": True}


def develop(api: Api, issue: str, title: str, body: str = "The council approved repairs."
            ) -> str:
    return api.ok(api.post(f"/staff/issues/{issue}/developments", "sam", "staff",
                           {"title": title, "body": body}), 202)["development"]


def inbox(api: Api, sub: str, n: int, timeout: float = 60) -> dict:
    return api.until("/me/inbox", sub, "participant", lambda j: len(j["notifications"]) >= n,
                     timeout=timeout, what=f"{n} notification(s) for {sub}")


def sse(api: Api, sub: str, **headers: str) -> list[tuple[str | None, str | None, str]]:
    """(id, event, data) of each event and (None, None, comment) of each comment, to the end."""
    s = read_sse("GET", f"{api.url}/me/inbox/stream",
                 headers=api.headers(sub, "participant", **headers))
    assert s.status == 200, s.body
    out: list[tuple[str | None, str | None, str]] = []
    for f in s.frames:
        out += [(None, None, c) for c in f.comments]
        if (f.id, f.event, f.text) != (None, None, None):
            out.append((f.id, f.event, f.text or ""))
    return out


def test_followers_get_each_development_once_in_order_by_poll_and_stream(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(VOICE_GATEWAY_BOUND_S="4"), settings)
    issue = api.open_issue("Streetlights on Elm Road are broken")
    follow(api, issue, "ann", "bob", "cat")
    assert api.ok(api.delete(f"/me/issues/{issue}/follow", "cat", "participant"))[
        "following"] is False
    devs = [develop(api, issue, f"Step {n}") for n in (1, 2, 3)]
    assert devs == [f"{issue}:dev-{n}" for n in (1, 2, 3)]
    got = inbox(api, "ann", 3)
    assert [(n["seq"], n["development"]) for n in got["notifications"]] == [
        (1, devs[0]), (2, devs[1]), (3, devs[2])]
    first = got["notifications"][0]
    assert first["notification"] == f"{devs[0]}:ann"
    assert first["title"] == "Streetlights on Elm Road are broken: Step 1"
    assert "The council approved repairs." in first["body"]
    assert len(inbox(api, "bob", 3)["notifications"]) == 3
    assert api.ok(api.get("/me/inbox", "cat", "participant"))["notifications"] == []
    assert [n["seq"] for n in api.ok(api.get("/me/inbox", "ann", "participant", after=2))[
        "notifications"]] == [3]

    # One delivery at a time per issue: each starts after the previous one completed.
    log = envelopes(settings, WORKFLOWS)
    starts = {e.key: e.time for e in log if isinstance(e.record, WorkflowStarted)
              and e.key in devs}
    ends = {e.key: e.time for e in log if isinstance(e.record, WorkflowCompleted)
            and e.key in devs}
    assert ends[devs[0]] <= starts[devs[1]] and ends[devs[1]] <= starts[devs[2]]
    staff = api.ok(api.get(f"/staff/issues/{issue}", "sam", "staff"))
    assert [d["delivery"] for d in staff["developments"]] == ["delivered"] * 3
    assert staff["followers"] == 2

    # SSE: the same notifications, id = the inbox seq; resume after the last seen.
    events = sse(api, "ann")
    data = [(i, e, json.loads(d)) for i, e, d in events if i is not None]
    assert [(i, e, d["development"]) for i, e, d in data] == [
        ("1", "notification", devs[0]), ("2", "notification", devs[1]),
        ("3", "notification", devs[2])]
    assert events[-1][2].startswith("end; reconnect with after=3")
    resumed = [i for i, _e, _d in sse(api, "ann", **{"Last-Event-ID": "2"}) if i is not None]
    assert resumed == ["3"]
    r = httpx.get(f"{api.url}/me/inbox/stream?after=x",
                  headers=api.headers("ann", "participant"), timeout=10)
    assert r.status_code == 422


def test_a_stream_waits_for_live_notifications_and_answers_409_for_a_cursor_too_old(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    # The inbox writer's records, produced as it would (dense seqs): 12 > the 10 kept.
    envs = [Envelope(record=NotificationRecorded(recipient="dan", notification=f"d{n}:dan",
                                                 issue="iss-00000001", development=f"d{n}",
                                                 title=f"t{n}", body="b", at="2026-01-01"),
                     key=inbox_key("default", "dan"), source="/voice/inbox-writer", seq=n,
                     id=f"d{n}:dan", tenant="default")
            for n in range(1, 13)]
    produce(settings, INBOX, *envs, envs[4])  # and one replayed record: shown once
    api = Api(start_edge(VOICE_EDGE_EVENTS_KEPT="10", VOICE_GATEWAY_BOUND_S="4"), settings)
    got = inbox(api, "dan", 10)
    assert [n["seq"] for n in got["notifications"]] == list(range(3, 13))
    too_old = api.get("/me/inbox", "dan", "participant", after=1)
    assert too_old.status_code == 409 and too_old.json()["oldest_cursor"] == 2
    r = httpx.get(f"{api.url}/me/inbox/stream", headers=api.headers(
        "dan", "participant", **{"Last-Event-ID": "0"}), timeout=10)
    assert r.status_code == 409 and r.json()["oldest_cursor"] == 2
    events = sse(api, "dan", **{"Last-Event-ID": "12"})
    assert all(i is None for i, _e, _d in events)  # nothing new: keep-alives, then the end
    assert any(c == "keep-alive" for _i, _e, c in events)
    assert api.get("/me/inbox", "eve", "participant").json()["notifications"] == []


def test_a_worker_killed_mid_delivery_never_sends_a_notification_twice(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    env = {"VOICE_STAFF_STEP_DELAY_MS": "notify=3000"}
    first = start_worker(**env)
    api = Api(start_edge(), settings)
    issue = api.open_issue("Streetlights on Elm Road are broken")
    followers = ["ann", "bob", "cat", "dan"]
    follow(api, issue, *followers)
    dev = develop(api, issue, "Repairs approved")
    inbox_topic = topic_name(settings, INBOX)
    wait_for(lambda: len(read_all(settings, inbox_topic)) >= 1, timeout=30,
             what="the first notification")
    kill(first)
    start_worker(**env)
    for sub in followers:
        inbox(api, sub, 1, timeout=120)
    wait_for(lambda: any(isinstance(e.record, WorkflowCompleted)
                         for e in envelopes(settings, WORKFLOWS, dev)), timeout=60,
             what="the delivery to complete")
    raw = [m.headers() for m in read_all(settings, inbox_topic)]
    ids = Counter(dict(h)["ce_id"].decode() for h in raw)
    assert ids == Counter({f"{dev}:{s}": 1 for s in followers})
    lost = [e.record for e in envelopes(settings, WORKFLOWS, dev)
            if type(e.record).__name__ == "StepFailed"]
    # The next owner resumes the step one of two ways, depending on whether the killed
    # worker's "running" had reached the changelog (held back at most the linger, decision
    # 0014): a WorkerLost attempt, or the replay of its lease record. Either way, above, each
    # follower was notified once.
    assert [(r.step, r.error_type) for r in lost] in ([], [("notify", "WorkerLost")]), lost
    for sub in followers:
        assert [n["notification"] for n in inbox(api, sub, 1)["notifications"]] == [
            f"{dev}:{sub}"]
