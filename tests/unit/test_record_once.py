"""The record-once log (``consumers.frame.record_once``), the one aggregate behind the inbox and
the review queue: each item recorded once by its own id, answered or silent, bounded memory."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from consumers.frame.record_once import RecordOnceLog, RecordOnceState
from consumers.frame.writer import outputs
from consumers.staff.inbox import InboxWriter
from consumers.staff.queue import ReviewQueueWriter
from schemas.staff import DeliverNotification, NotificationRecorded, OpenIssue
from schemas.system import CommandAcknowledged
from streams.envelope import Envelope
from streams.topics import ACKS, INBOX

T0 = datetime(2026, 3, 5, 10, 0, tzinfo=UTC)


class TinyInbox(InboxWriter):
    """An inbox that remembers two ids, so forgetting is cheap to show."""

    limit = 2


def deliver(nid: str, command_id: str | None = None) -> Envelope:
    rec = DeliverNotification(notification=nid, recipient="ann", issue="iss-1",
                              development=nid.split(":")[0], title="t", body="b")
    return Envelope(record=rec, key="ann", source="/test", id=command_id or nid, time=T0,
                    tenant="t1")


def run(writer: RecordOnceLog, cmds: list[Envelope]) -> tuple[list[Envelope], list[Envelope]]:
    state: RecordOnceState | None = None
    log: list[Envelope] = []
    acks: list[Envelope] = []
    for c in cmds:
        state, out = outputs(writer, state, c)
        log += [e for spec, e in out if spec is INBOX]
        acks += [e for spec, e in out if spec is ACKS]
    return log, acks


def test_an_item_is_deduped_by_its_own_id_whichever_command_carries_it() -> None:
    log, acks = run(InboxWriter(), [deliver("d1:ann", "c1"), deliver("d1:ann", "c2")])
    assert [(e.id, e.seq) for e in log] == [("d1:ann", 1)]
    assert isinstance(log[0].record, NotificationRecorded)
    assert log[0].record.at == T0.isoformat() and log[0].record.title == "t"
    answers = [a.record for a in acks]
    assert all(isinstance(a, CommandAcknowledged) for a in answers)
    assert [(a.outcome, a.seq) for a in answers] == [("accepted", 1), ("duplicate", 1)]


def test_an_id_older_than_the_limit_is_forgotten_and_recorded_again() -> None:
    ids = ["d1:ann", "d2:ann", "d3:ann", "d3:ann", "d1:ann"]
    log, _ = run(TinyInbox(), [deliver(n, f"c{i}") for i, n in enumerate(ids)])
    # d3 is still remembered (answered again); d1 fell out of the two remembered: readers dedupe.
    assert [(e.id, e.seq) for e in log] == [("d1:ann", 1), ("d2:ann", 2), ("d3:ann", 3),
                                            ("d1:ann", 4)]


def test_a_silent_log_answers_nothing_and_a_misrouted_command_is_recorded_nowhere() -> None:
    assert not ReviewQueueWriter().acknowledges(deliver("d1:ann"))
    wrong = Envelope(record=OpenIssue(issue="iss-0123456789abcdef", title="x", by="sam"), key="ann",
                     source="/test", id="c1", time=T0)
    refused = InboxWriter().decide(None, wrong)
    assert refused.records == () and refused.ack is not None
    assert refused.ack.outcome == "rejected" and "inbox" in refused.ack.detail["reason"]
    silent = ReviewQueueWriter().decide(None, wrong)
    assert silent.records == () and silent.ack is None and silent.state is None


def test_a_log_whose_records_lack_the_item_id_field_is_refused_where_it_is_defined() -> None:
    with pytest.raises(TypeError, match="OpenIssue has no item id field 'notification'"):
        class Broken(RecordOnceLog):
            commands = (OpenIssue,)
            recorded = NotificationRecorded
            item_id = "notification"
