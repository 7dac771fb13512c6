"""The review queue live, without a broker: its writer (dense seq per tenant, each event once),
the disclosure-review steps noting events, the edge's view (dedupe, the waiting fold, resume,
tenants) and its two routes (the queue as of a seq, the stream after a cursor)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api import staff
from api.frame.projection import CursorTooOld
from api.staff.queue_view import ReviewQueues
from consumers.frame.record_once import RecordOnceState
from consumers.frame.writer import outputs
from consumers.staff.queue import ReviewQueueWriter, note
from consumers.staff.review import Review
from consumers.staff.steps import StepDelays
from consumers.workflows.engine import StepContext
from schemas.staff import NoteQueueEvent, QueueEvent, QueueEventRecorded, ReviewSummary
from streams.assistant_settings import AssistantSettings
from streams.envelope import Envelope
from streams.ids import queue_event_id, review_queue_key
from streams.sealing import MemoryKeyStore, Sealer
from streams.tokens import mint_token
from streams.topics import ACKS, COMMANDS, REVIEW_QUEUE
from tests.unit.test_staff_workflows import FakeOut

T0 = datetime(2026, 3, 5, 10, 0, tzinfo=UTC)
ISS = "iss-00000000000000aa"


def item(contribution: str, event: QueueEvent = "entered", waiting_for: Any = "review",
         review: int | None = None, reviews: tuple[str, ...] = ()) -> NoteQueueEvent:
    return NoteQueueEvent(queue_event=queue_event_id(contribution, event, review), event=event,
                          contribution=contribution, issue=ISS, waiting_for=waiting_for,
                          flag_count=1, flag_kinds=["email"],
                          reviews=[ReviewSummary(by=b, decision="approve") for b in reviews],
                          submitted_at=f"2026-03-05T10:00:0{contribution[-1]}+00:00")


class Queue:
    """The writer's pure half applied in turn, like its table would keep the state."""

    def __init__(self) -> None:
        self.state: RecordOnceState | None = None
        self.log: list[Envelope] = []
        self.acks: list[Envelope] = []

    def __call__(self, rec: NoteQueueEvent, tenant: str = "t1", key: str | None = None) -> None:
        cmd = note(rec, tenant, "/test", rec.contribution)
        if key is not None:
            cmd = replace(cmd, key=key)
        cmd = replace(cmd, time=T0)
        self.state, out = outputs(ReviewQueueWriter(), self.state, cmd)
        self.log += [e for spec, e in out if spec is REVIEW_QUEUE]
        self.acks += [e for spec, e in out if spec is ACKS]


# --- the writer ------------------------------------------------------------------------------


def test_the_writer_records_each_event_once_with_a_dense_seq_per_tenant() -> None:
    q = Queue()
    for rec in [item("ctb-1"), item("ctb-2"), item("ctb-1"),  # a re-run step: noted again
                item("ctb-1", "reviewed", "second_review", 1, ("r1",)), item("ctb-2")]:
        q(rec)
    assert [(e.id, e.seq) for e in q.log] == [
        ("ctb-1:entered", 1), ("ctb-2:entered", 2), ("ctb-1:reviewed:1", 3)]
    assert all(e.key == review_queue_key("t1") and e.tenant == "t1" for e in q.log)
    assert isinstance(q.log[2].record, QueueEventRecorded)
    assert q.log[2].record.reviews[0].by == "r1" and q.log[2].record.at == T0.isoformat()
    assert q.acks == []  # nobody waits on a note: no acknowledgement is produced
    assert q.state is not None and q.state.tenant == "t1" and q.state.seq == 3


def test_the_writer_notes_nothing_under_another_tenants_key() -> None:
    q = Queue()
    q(item("ctb-1"), tenant="t2", key=review_queue_key("t1"))  # forged: t2 naming t1's queue
    assert q.log == [] and q.state is None
    q(item("ctb-1"))
    q(item("ctb-2"), tenant="t2", key=review_queue_key("t1"))  # refused by the frame too
    assert [e.seq for e in q.log] == [1]


# --- the disclosure-review steps note the events ---------------------------------------------


def ctx(step: str, input_: dict[str, Any], outputs_: dict[str, Any] | None = None,
        commands: dict[str, Any] | None = None, attempt: int = 1) -> StepContext:
    return StepContext(workflow="ctb-1", kind="disclosure-review", step=step, attempt=attempt,
                       input=input_, outputs=outputs_ or {}, commands=commands or {})


class NoAgents:
    """The flag step's agent is not run here (``flag_step`` is covered elsewhere)."""


async def test_each_review_step_notes_its_event_in_the_tenants_queue() -> None:
    out, sealer = FakeOut(), Sealer(MemoryKeyStore())
    review = Review(out, sealer, NoAgents(), StepDelays())  # type: ignore[arg-type]
    text = "Ask Jane Porter about it."
    inp = {"contribution": "ctb-1", "issue": ISS, "author": "ann", "submitted_at": "t",
           "tenant": "t1", "text": sealer.seal("ctb-1", "text", text).model_dump()}
    flags = sealer.seal_json("ctb-1", "flags", {"flags": [
        {"start": 4, "end": 15, "kind": "person_name", "source": "agent", "reason": "r"}]})
    flag = {"flag_count": 1, "flag_kinds": ["person_name"], "flags": flags.model_dump()}
    first = {"by": "rev1", "decision": "approve"}
    second = {"by": "rev2", "decision": "redact"}
    done = {"flag": flag}
    await review._note(ctx("flag", inp, done), "entered", [], "review")  # as flag_step ends
    done["review"] = await review.review_step(ctx("review", inp, done, {"review": first}))
    # A re-run of the review step (a crash before its output was recorded) notes the same id.
    await review.review_step(ctx("review", inp, {"flag": flag}, {"review": first}, attempt=2))
    done["second_review"] = await review.second_review_step(
        ctx("second_review", inp, done, {"second_review": second}))
    await review.publish_step(ctx("publish", inp, done))

    notes = [e for spec, e in out.sent if spec is COMMANDS]
    assert all(e.key == review_queue_key("t1") and e.tenant == "t1" for e in notes)
    assert [(e.id, e.record.event, e.record.waiting_for) for e in notes] == [
        ("ctb-1:entered", "entered", "review"),
        ("ctb-1:reviewed:1", "reviewed", "second_review"),
        ("ctb-1:reviewed:1", "reviewed", "second_review"),
        ("ctb-1:reviewed:2", "reviewed", None),
        ("ctb-1:published", "published", None)]
    final = notes[-1].record
    assert [r.by for r in final.reviews] == ["rev1", "rev2"] and final.redacted_spans == 1
    assert "Jane" not in str([e.record.model_dump() for e in notes])  # never the text
    q = Queue()
    for e in notes:
        q(e.record)
    assert [e.seq for e in q.log] == [1, 2, 3, 4]  # the re-run's note recorded once


async def test_a_rejection_by_the_first_reviewer_needs_no_second_review() -> None:
    out, sealer = FakeOut(), Sealer(MemoryKeyStore())
    review = Review(out, sealer, NoAgents(), StepDelays())  # type: ignore[arg-type]
    inp = {"contribution": "ctb-1", "issue": ISS, "author": "ann", "submitted_at": "t",
           "tenant": "t1", "text": sealer.seal("ctb-1", "text", "x").model_dump()}
    flag = {"flag_count": 1, "flag_kinds": ["email"], "flags": None}
    await review.review_step(ctx("review", inp, {"flag": flag},
                                 {"review": {"by": "rev1", "decision": "reject"}}))
    [noted] = [e.record for spec, e in out.sent if spec is COMMANDS]
    assert noted.event == "reviewed" and noted.waiting_for is None


# --- the edge's view -------------------------------------------------------------------------


def fed(tenant_events: dict[str, list[NoteQueueEvent]], kept: int = 100) -> ReviewQueues:
    queues = ReviewQueues(kept)
    for tenant, events in tenant_events.items():
        q = Queue()
        for rec in events:
            q(rec, tenant=tenant)
        for env in q.log:
            queues.apply(env)
            queues.apply(env)  # a redelivery: same seq, changes nothing
    return queues


def test_the_view_folds_what_waits_and_serves_events_after_a_cursor() -> None:
    queues = fed({"t1": [item("ctb-1"), item("ctb-2"),
                         item("ctb-1", "reviewed", "second_review", 1, ("r1",)),
                         item("ctb-2", "reviewed", None, 1, ("r1",)),
                         item("ctb-2", "rejected", None)],
                  "t2": [item("ctb-9")]})
    view = queues.queue("t1")
    assert view.last_seq == 5 and [e.seq for e in view.events] == [1, 2, 3, 4, 5]
    assert {c: e.record.waiting_for for c, e in view.waiting.items()} == {
        "ctb-1": "second_review"}
    assert view.waiting["ctb-1"].seq == 3
    assert [e.record.queue_event for e in view.events_after(3)] == [
        "ctb-2:reviewed:1", "ctb-2:rejected"]
    # Tenants never meet: t2's queue has its own seq, and an unknown tenant's is empty.
    assert [e.record.contribution for e in queues.queue("t2").events] == ["ctb-9"]
    assert queues.queue("t2").last_seq == 1
    assert queues.queue("t3").events_after(0) == [] and queues.queue("t3").last_seq == 0


def test_an_event_recorded_again_under_a_new_seq_is_shown_once() -> None:
    queues = ReviewQueues()
    q = Queue()
    q(item("ctb-1"))
    again = replace(q.log[0], seq=2)  # past the writer's memory: a new seq
    for env in (q.log[0], again):
        queues.apply(env)
    view = queues.queue("t1")
    assert [e.seq for e in view.events] == [1] and view.head() == 2
    assert view.events_after(1) == []


def test_a_cursor_older_than_the_view_keeps_is_refused_with_the_oldest() -> None:
    queues = fed({"t1": [item(f"ctb-{n}") for n in range(1, 6)]}, kept=2)
    view = queues.queue("t1")
    assert [e.seq for e in view.events_after(3)] == [4, 5]
    with pytest.raises(CursorTooOld) as err:
        view.events_after(1)
    assert err.value.oldest == 3 and "review queue of 't1'" in str(err.value)
    assert len(view.waiting) == 5  # the fold holds every entry, not only the kept events


def test_another_tenants_record_under_a_queue_key_is_not_that_queue() -> None:
    queues = ReviewQueues()
    q = Queue()
    q(item("ctb-1"), tenant="t2")
    forged = replace(q.log[0], key=review_queue_key("t1"))
    queues.apply(forged)
    assert list(queues.queue("t1").events) == [] and queues.queue("t1").last_seq == 0


def test_nothing_of_an_erased_contribution_is_shown_after_its_erasure() -> None:
    # A review step that was running as its author erased it notes after the erasure: every
    # edge applies the same rule to the same log, so no edge shows it waiting again.
    queues = fed({"t1": [item("ctb-1"), item("ctb-2"), item("ctb-1", "erased", None),
                         item("ctb-1", "reviewed", "second_review", 1, ("r1",))]})
    view = queues.queue("t1")
    assert list(view.waiting) == ["ctb-2"] and view.head() == 4
    assert [e.record.queue_event for e in view.events_after(2)] == ["ctb-1:erased"]


def test_the_queue_leaves_out_a_contribution_this_edge_just_erased(tmp_path: Path) -> None:
    client = edge(tmp_path, fed({"t1": [item("ctb-1"), item("ctb-2")]}))
    client.app.state.staff.contributions.mark_erased("ctb-1")  # type: ignore[attr-defined]
    body = client.get("/staff/reviews/queue", headers=auth(client, "rev1", "reviewer")).json()
    assert [w["contribution"] for w in body["waiting"]] == ["ctb-2"]


# --- the routes ------------------------------------------------------------------------------


def edge(tmp_path: Path, queues: ReviewQueues) -> TestClient:
    settings = AssistantSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path,
                                 gateway_bound_s=1.5)
    app = FastAPI()
    app.include_router(staff.router)
    app.state.settings = settings
    app.state.staff = staff.StaffViews()
    app.state.staff.queues = queues
    return TestClient(app, raise_server_exceptions=False)


def auth(client: TestClient, sub: str, role: str, tenant: str = "t1") -> dict[str, str]:
    token = mint_token(client.app.state.settings, sub, role, tenant)  # type: ignore[attr-defined]
    return {"Authorization": f"Bearer {token}"}


def sse_ids(body: str) -> list[int]:
    return [int(line[3:].strip()) for line in body.splitlines() if line.startswith("id:")]


def test_the_queue_and_its_stream_are_one_reading_of_the_log(tmp_path: Path) -> None:
    client = edge(tmp_path, fed({"t1": [item("ctb-2"), item("ctb-1"),
                                        item("ctb-2", "reviewed", "second_review", 1, ("r1",))],
                                 "t2": [item("ctb-9")]}))
    rev = auth(client, "rev1", "reviewer")
    r = client.get("/staff/reviews/queue", headers=rev)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["last_seq"] == 3
    assert [(w["contribution"], w["waiting_for"], w["seq"]) for w in body["waiting"]] == [
        ("ctb-1", "review", 2), ("ctb-2", "second_review", 3)]  # oldest submitted first
    assert body["waiting"][1]["reviews"] == [{"by": "r1", "decision": "approve",
                                              "redactions": 0}]

    with client.stream("GET", "/staff/reviews/stream", headers=rev) as s:
        full = s.read().decode()
    assert s.status_code == 200 and sse_ids(full) == [1, 2, 3]
    assert "event: queue" in full and "ctb-9" not in full
    with client.stream("GET", "/staff/reviews/stream",
                       headers={**rev, "Last-Event-ID": "2"}) as s:
        assert sse_ids(s.read().decode()) == [3]
    with client.stream("GET", "/staff/reviews/stream?after=3", headers=rev) as s:
        tail = s.read().decode()
    assert sse_ids(tail) == [] and "reconnect with after=3" in tail

    other = auth(client, "rev9", "reviewer", "t2")
    assert [w["contribution"] for w in
            client.get("/staff/reviews/queue", headers=other).json()["waiting"]] == ["ctb-9"]
    with client.stream("GET", "/staff/reviews/stream", headers=other) as s:
        assert sse_ids(s.read().decode()) == [1]


def test_only_those_who_read_reviews_read_the_queue(tmp_path: Path) -> None:
    client = edge(tmp_path, fed({"t1": [item("ctb-1")]}))
    for role in ("participant", "representative", "operator"):
        who = auth(client, "someone", role)
        assert client.get("/staff/reviews/queue", headers=who).status_code == 403, role
        assert client.get("/staff/reviews/stream", headers=who).status_code == 403, role
    assert client.get("/staff/reviews/stream").status_code == 401
    staff_ = auth(client, "sue", "staff")
    assert client.get("/staff/reviews/queue", headers=staff_).status_code == 200
    rev = auth(client, "rev1", "reviewer")
    r = client.get("/staff/reviews/stream?after=9", headers=rev)
    assert r.status_code == 200  # after the head: waits for news, then ends at the bound
    bad = client.get("/staff/reviews/stream", headers={**rev, "Last-Event-ID": "x"})
    assert bad.status_code == 422 and "Last-Event-ID" in bad.text
