"""The staff domain's single writers (issue, inbox) and the developments handler, pure."""

from __future__ import annotations

from datetime import UTC, datetime

from consumers.frame.record_once import RecordOnceState
from consumers.frame.writer import outputs
from consumers.staff.developments import DeliveryQueue, apply_development
from consumers.staff.inbox import InboxWriter
from consumers.staff.issues import IssueState, IssueWriter
from schemas.base import Record
from schemas.staff import (
    AddEvidence,
    DeliverNotification,
    EndDelivery,
    FollowIssue,
    OpenInvestigation,
    OpenIssue,
    RecordDevelopment,
    SuggestInvestigation,
    UnfollowIssue,
)
from schemas.system import CommandAcknowledged
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope
from streams.topics import ACKS, INBOX, ISSUES

ISS = "iss-0123456789abcdef"
T0 = datetime(2026, 3, 5, 10, 0, tzinfo=UTC)


_ids = iter(range(1, 1_000_000))


def apply_issue(state: IssueState | None, c: Envelope) -> tuple[IssueState | None, list]:
    """The writer's pure half (dedupe, decide, envelopes) for the issue aggregate."""
    return outputs(IssueWriter(), state, c)


def apply_inbox(state: RecordOnceState | None, c: Envelope) -> tuple[RecordOnceState | None, list]:
    return outputs(InboxWriter(), state, c)


def cmd(record: Record, key: str = ISS, id_: str | None = None) -> Envelope:
    return Envelope(record=record, key=key, source="/test", id=id_ or f"c{next(_ids)}", time=T0)


class Issue:
    """Applies commands in turn, like the writer's table would."""

    def __init__(self) -> None:
        self.state: IssueState | None = None
        self.log: list[Envelope] = []

    def __call__(self, record: Record, id_: str | None = None) -> CommandAcknowledged:
        self.state, outputs = apply_issue(self.state, cmd(record, id_=id_))
        self.log += [e for spec, e in outputs if spec is ISSUES]
        acks = [e.record for spec, e in outputs if spec is ACKS]
        assert len(acks) == 1
        return acks[0]  # type: ignore[return-value]


def test_an_issue_log_has_dense_seqs_and_ids_from_its_commands() -> None:
    issue = Issue()
    assert issue(OpenIssue(issue=ISS, title="Lights", summary="Broken", by="sam")).outcome == \
        "accepted"
    assert issue(AddEvidence(issue=ISS, evidence="evd-1", title="Letter", body="x",
                             added_by="sam")).detail == {"evidence": "evd-1"}
    assert [e.seq for e in issue.log] == [1, 2]
    assert [type(e.record).__name__ for e in issue.log] == ["IssueOpened", "EvidenceAdded"]
    assert issue.log[1].record.at == T0.isoformat()  # type: ignore[attr-defined]
    again = issue(OpenIssue(issue=ISS, title="Again", by="sam"))
    assert again.outcome == "rejected" and again.detail["reason"] == "issue exists"


def test_commands_on_an_unknown_issue_or_under_another_key_are_rejected() -> None:
    state, outputs = apply_issue(None, cmd(FollowIssue(issue=ISS, participant="ann")))
    assert state is None and outputs[0][1].record.detail == {"reason": "no such issue"}  # type: ignore[attr-defined]
    opened, _ = apply_issue(None, cmd(OpenIssue(issue=ISS, title="t", by="sam")))
    _, outputs = apply_issue(opened, cmd(FollowIssue(issue="iss-ffffffffffffffff",
                                                     participant="ann")))
    [(_, env)] = outputs
    assert env.record.outcome == "rejected"  # type: ignore[attr-defined]


def test_a_redelivered_command_is_acknowledged_again_and_not_reapplied() -> None:
    issue = Issue()
    issue(OpenIssue(issue=ISS, title="Lights", by="sam"))
    first = issue(RecordDevelopment(issue=ISS, title="t", body="b", by="sam"), id_="dev-cmd")
    again = issue(RecordDevelopment(issue=ISS, title="t", body="b", by="sam"), id_="dev-cmd")
    assert first.detail["development"] == f"{ISS}:dev-1"
    assert again.outcome == "duplicate" and again.detail["development"] == f"{ISS}:dev-1"
    assert sum(type(e.record).__name__ == "DevelopmentRecorded" for e in issue.log) == 1
    second = issue(RecordDevelopment(issue=ISS, title="t2", body="b", by="sam"))
    assert second.detail["development"] == f"{ISS}:dev-2"


def test_follow_and_unfollow_are_idempotent() -> None:
    issue = Issue()
    issue(OpenIssue(issue=ISS, title="Lights", by="sam"))
    issue(FollowIssue(issue=ISS, participant="ann"))
    issue(FollowIssue(issue=ISS, participant="ann"))
    issue(UnfollowIssue(issue=ISS, participant="ann"))
    issue(UnfollowIssue(issue=ISS, participant="ann"))
    assert [type(e.record).__name__ for e in issue.log[1:]] == ["FollowerAdded",
                                                                "FollowerRemoved"]


def test_the_issue_writer_keeps_no_list_of_every_follower(monkeypatch) -> None:  # noqa: ANN001
    import consumers.staff.issues as issues

    monkeypatch.setattr(issues, "MAX_FOLLOWS", 50)  # 1,024 in earnest; the same rule
    issue = Issue()
    issue(OpenIssue(issue=ISS, title="Lights", by="sam"))
    for n in range(200):
        issue(FollowIssue(issue=ISS, participant=f"p{n}"))
    assert issue.state is not None and list(issue.state.follows) == [f"p{n}"
                                                                     for n in range(150, 200)]
    assert sum(type(e.record).__name__ == "FollowerAdded" for e in issue.log) == 200
    issue(FollowIssue(issue=ISS, participant="p199"))  # remembered: nothing recorded
    assert sum(type(e.record).__name__ == "FollowerAdded" for e in issue.log) == 200
    # One it no longer remembers follows again: recorded again, which readers fold into the
    # same set of followers.
    issue(FollowIssue(issue=ISS, participant="p0"))
    assert sum(type(e.record).__name__ == "FollowerAdded" for e in issue.log) == 201


def test_investigations_are_suggested_once_then_opened_once() -> None:
    issue = Issue()
    issue(OpenIssue(issue=ISS, title="Lights", by="sam"))
    inv = "run-1:inv-1"
    suggest = SuggestInvestigation(issue=ISS, investigation=inv, run="run-1", title="t",
                                   reason="r", read=["evd-1"])
    assert issue(suggest).detail["state"] == "suggested"
    assert issue(suggest).detail["state"] == "suggested"  # a research re-run: no new record
    assert issue(OpenInvestigation(issue=ISS, investigation="nope", by="rep")).outcome == \
        "rejected"
    assert issue(OpenInvestigation(issue=ISS, investigation=inv, by="rep")).detail["state"] == \
        "open"
    assert issue(suggest).detail["state"] == "open"  # a late re-run never reverts it
    issue(OpenInvestigation(issue=ISS, investigation=inv, by="rep2"))
    names = [type(e.record).__name__ for e in issue.log[1:]]
    assert names == ["InvestigationSuggested", "InvestigationOpened"]


def test_a_delivery_ends_once() -> None:
    issue = Issue()
    issue(OpenIssue(issue=ISS, title="Lights", by="sam"))
    end = EndDelivery(issue=ISS, development=f"{ISS}:dev-1", status="completed")
    issue(end)
    issue(end)  # the watcher saw the end twice (another command id): recorded once
    assert [type(e.record).__name__ for e in issue.log[1:]] == ["DeliveryEnded"]


def test_the_writer_is_deterministic() -> None:
    a, b = Issue(), Issue()
    for w in (a, b):
        w(OpenIssue(issue=ISS, title="Lights", by="sam"), id_="c1")
        w(FollowIssue(issue=ISS, participant="ann"), id_="c2")
    assert [(e.id, e.seq, e.record) for e in a.log] == [(e.id, e.seq, e.record) for e in b.log]


def test_the_inbox_records_each_notification_once_with_a_dense_seq() -> None:
    state: RecordOnceState | None = None
    log = []
    for nid in ["d1:ann", "d2:ann", "d1:ann", "d3:ann"]:
        note = DeliverNotification(notification=nid, recipient="ann", issue=ISS,
                                   development=nid.split(":")[0], title="t", body="b")
        state, outputs = apply_inbox(state, cmd(note, key="ann", id_=nid))
        log += [e for spec, e in outputs if spec is INBOX]
        ack = outputs[-1][1].record
        assert isinstance(ack, CommandAcknowledged)
    assert [(e.id, e.seq) for e in log] == [("d1:ann", 1), ("d2:ann", 2), ("d3:ann", 3)]
    assert ack.outcome == "accepted"


def rec_env(record: Record, seq: int) -> Envelope:
    return Envelope(record=record, key=ISS, source="/test", seq=seq, id=f"r{seq}", time=T0)


def test_developments_are_delivered_one_at_a_time_per_issue_in_order() -> None:
    from schemas.staff import (
        DeliveryEnded,
        DevelopmentRecorded,
        FollowerAdded,
        FollowerRemoved,
        IssueOpened,
    )

    records = [
        IssueOpened(issue=ISS, title="Lights", summary="", by="sam", at="t"),
        FollowerAdded(issue=ISS, participant="ann"),
        FollowerAdded(issue=ISS, participant="bob"),
        DevelopmentRecorded(issue=ISS, development=f"{ISS}:dev-1", title="one", body="b",
                            by="sam", at="t"),
        DevelopmentRecorded(issue=ISS, development=f"{ISS}:dev-2", title="two", body="b",
                            by="sam", at="t"),
        FollowerRemoved(issue=ISS, participant="bob"),
        DeliveryEnded(issue=ISS, development=f"{ISS}:dev-2", status="completed"),  # not active
        DeliveryEnded(issue=ISS, development=f"{ISS}:dev-1", status="failed"),
    ]
    q: DeliveryQueue | None = None
    starts: list[Envelope] = []
    for seq, r in enumerate(records, start=1):
        offset = 100 + 10 * seq  # the issue's records, among others' on partition 3
        q, start = apply_development(q, rec_env(r, seq), 3, offset)
        starts += [start] if start else []
        if seq == 4:
            again, dup = apply_development(q, rec_env(r, seq), 3, offset)  # redelivered
            assert dup is None and again == q
    assert [s.key for s in starts] == [f"{ISS}:dev-1", f"{ISS}:dev-2"]
    one, two = (s.record for s in starts)
    assert isinstance(one, WorkflowStarted) and one.kind == "update-delivery"
    # References, not copies: the development's record, and the log up to the start (the
    # followers as of then are read back by the step).
    assert one.input == {"issue": ISS, "development": f"{ISS}:dev-1", "issue_title": "Lights",
                         "partition": 3, "opened": 110, "record": [4, 140], "through": 4,
                         "tenant": None}
    assert (two.input["record"], two.input["through"]) == ([5, 150], 8)  # type: ignore[attr-defined]
    assert all(s.seq == 1 and s.id == f"{s.key}:1" for s in starts)
    assert q is not None and q.active == f"{ISS}:dev-2" and q.waiting == []


def test_a_delivery_queue_kept_before_references_still_loads() -> None:
    old = {"last_seq": 3, "issue_title": "Lights", "followers": ["ann", "bob"], "waiting": [],
           "active": None}
    assert DeliveryQueue.from_dict(old).to_dict() == {
        "last_seq": 3, "issue_title": "Lights", "partition": None, "opened": None,
        "waiting": [], "active": None}
    assert IssueState.from_dict({"seq": 3, "followers": ["ann"]}).follows == {"ann": True}
