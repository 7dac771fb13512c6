"""The transcript route (``GET /me/conversations/{c}``) a page at a time: a long conversation
(a message a second at the quota is 3,600 an hour) is never rendered whole by one request —
the whole of such an hour took ~0.5 s of the edge's event loop, every stream waiting."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.conversations import ConversationViews, render
from api.conversations.routes import TRANSCRIPT_PAGE, TRANSCRIPT_PAGE_MAX
from api.conversations.views import CONTENT
from schemas.base import Record
from schemas.conversation import (
    ConversationStarted,
    TurnOpened,
    TurnReplied,
    TurnRepliedWithProposal,
    TurnStateChanged,
)
from streams.envelope import Envelope, unfolded
from streams.ids import turn_id
from streams.sealing import Sealer
from tests.unit.test_conversation_routes import client

CNV = "cnv-00112233aabbccdd"
AT = "2026-01-01T00:00:00+00:00"


def long_conversation(views: ConversationViews, sealer: Sealer, turns: int,
                      open_last: bool = False) -> list[Envelope]:
    """``turns`` turns as the sequencer appends them (every third with a proposal), applied
    to ``views``; with ``open_last`` the last one is still thinking (no reply yet). Returns
    the log."""
    records: list[Record] = [ConversationStarted(conversation=CNV, owner="alice")]
    seq = 2
    for n in range(turns):
        turn = turn_id(CNV, seq)
        records.append(TurnOpened(conversation=CNV, message_id=f"m{n}", at=AT, turn=turn,
                                  text=sealer.seal(CNV, f"m{n}", f"message {n}")))
        if not (open_last and n == turns - 1):
            rid = f"{turn}:reply"
            reply: dict[str, Any] = {"conversation": CNV, "turn": turn, "reply_id": rid,
                                     "text": sealer.seal(CNV, rid, f"reply {n}")}
            if n % 3 == 2:
                pid = f"{turn}:proposal"
                records.append(TurnRepliedWithProposal(
                    **reply, proposal_id=pid, proposal=sealer.seal_json(CNV, pid, {"n": n})))
            else:
                records.append(TurnReplied(**reply))
        seq = 2 + sum(r.seqs for r in records[1:])
    seq, log = 1, []
    for i, r in enumerate(records):
        log.append(Envelope(record=r, key=CNV, source="/voice/sequencer", seq=seq,
                            tenant="default", id=f"r{i}"))
        views.apply(log[-1])
        seq += r.seqs
    return log


def app_with(tmp_path: Path, turns: int, open_last: bool = False,
             views: ConversationViews | None = None) -> TestClient:
    c = client(tmp_path, "accepted")
    state: Any = c.app.state  # type: ignore[attr-defined]
    if views is not None:
        state.views = views
    long_conversation(state.views, state.sealer, turns, open_last)
    return c


def pages(c: TestClient, limit: int) -> list[dict[str, Any]]:
    """Every page, newest first, following ``older``."""
    out: list[dict[str, Any]] = []
    before: int | None = None
    while True:
        params = {"limit": limit} | ({} if before is None else {"before": before})
        resp = c.get(f"/me/conversations/{CNV}", params=params)
        assert resp.status_code == 200, resp.text
        out.append(resp.json())
        before = out[-1]["older"]
        if before is None:
            return out


@pytest.mark.parametrize("limit", [1, 7, 30, 61, TRANSCRIPT_PAGE_MAX])
def test_the_pages_hold_the_whole_transcript_once_in_order(tmp_path: Path, limit: int) -> None:
    c = app_with(tmp_path, 30, open_last=True)
    state: Any = c.app.state  # type: ignore[attr-defined]
    whole = render.conversation_out(state.sealer, state.views[CNV]).model_dump()
    assert len(whole["messages"]) == 59 and len(whole["turns"]) == 30  # the last: no reply yet
    got = pages(c, limit)
    assert len(got) == -(-(59 + 9) // limit)  # messages, replies and proposals per page
    for page in got:
        assert len(page["messages"]) + len(page["proposals"]) <= limit
        assert page["last_seq"] == state.views[CNV].last_seq
    oldest_first = got[::-1]
    assert [m for p in oldest_first for m in p["messages"]] == whole["messages"]
    assert [x for p in oldest_first for x in p["proposals"]] == whole["proposals"]
    assert [t for p in oldest_first for t in p["turns"]] == whole["turns"]
    # Each turn is on the page of its message.
    for page in got:
        participants = {m["seq"] for m in page["messages"] if m["role"] == "participant"}
        assert {int(t["turn"].rsplit("-", 1)[1]) for t in page["turns"]} == participants


def test_the_first_page_is_the_newest_and_says_where_the_older_begin(tmp_path: Path) -> None:
    c = app_with(tmp_path, 150)
    state: Any = c.app.state  # type: ignore[attr-defined]
    body = c.get(f"/me/conversations/{CNV}").json()
    seqs = [m["seq"] for m in body["messages"]] + [p["seq"] for p in body["proposals"]]
    assert len(seqs) == TRANSCRIPT_PAGE
    newest = sorted(state.views[CNV].content)[-TRANSCRIPT_PAGE:]
    assert sorted(seqs) == newest and body["older"] == newest[0]
    assert body["last_seq"] == state.views[CNV].last_seq
    # Past the end is the newest page; below the first record, an empty oldest one.
    assert c.get(f"/me/conversations/{CNV}", params={"before": 10**9}).json() == body
    first = c.get(f"/me/conversations/{CNV}", params={"before": 2}).json()
    assert (first["messages"], first["proposals"], first["turns"], first["older"]) == (
        [], [], [], None)


def test_a_page_opens_only_its_own_records(tmp_path: Path) -> None:
    c = app_with(tmp_path, 400)
    sealer: Any = c.app.state.sealer  # type: ignore[attr-defined]
    opened: list[str] = []
    for name in ("open_text", "open_json"):
        real = getattr(sealer, name)

        def counted(conversation: str, content_id: str, *a: Any, real: Any = real) -> Any:
            opened.append(content_id)
            return real(conversation, content_id, *a)

        setattr(sealer, name, counted)
    body = c.get(f"/me/conversations/{CNV}", params={"limit": 10, "before": 400}).json()
    assert len(body["messages"]) + len(body["proposals"]) == 10
    assert len(opened) == 10  # the page's records, not the conversation's 933


@pytest.mark.parametrize(("params", "field"), [
    ({"limit": TRANSCRIPT_PAGE_MAX + 1}, "limit"), ({"limit": 0}, "limit"),
    ({"limit": "many"}, "limit"), ({"before": 0}, "before"), ({"before": "x"}, "before"),
])
def test_a_bad_page_is_refused_naming_the_field(tmp_path: Path, params: dict[str, Any],
                                                field: str) -> None:
    resp = app_with(tmp_path, 2).get(f"/me/conversations/{CNV}", params=params)
    assert resp.status_code == 422
    assert [e["loc"] for e in resp.json()["detail"]] == [["query", field]]


# --- a long conversation: only the kept window in memory, the rest read from the log ----------


class LogReads:
    """The log, as ``api.frame.cold``'s gap reader reads it (records starting in
    ``(after, upto]``), counting the reads; with ``lost`` below it, retention has trimmed it."""

    def __init__(self) -> None:
        self.log: list[Envelope] = []
        self.reads: list[tuple[int, int]] = []
        self.since: list[int | None] = []
        self.lost = 0

    def __call__(self, key: str, after: int, upto: int, since_ms: int | None = None
                 ) -> list[Envelope]:
        self.reads.append((after, upto))
        self.since.append(since_ms)
        return [e for e in self.log if e.key == key and e.seq is not None
                and max(after, self.lost) < e.seq <= upto
                and (since_ms is None or e.time.timestamp() * 1000 >= since_ms)]


def trimmed(tmp_path: Path, turns: int) -> tuple[TestClient, TestClient, LogReads]:
    """The same conversation on an edge that keeps 40 events and reads older ones from the
    log, and on one that holds it all (no log reader)."""
    reads = LogReads()
    c = app_with(tmp_path / "kept", turns, views=ConversationViews(kept=40, gap=reads))
    whole = app_with(tmp_path / "whole", 0)
    state: Any = whole.app.state  # type: ignore[attr-defined]
    sealer: Any = c.app.state.sealer  # type: ignore[attr-defined]
    state.sealer = sealer  # one key store: the same sealed records open on both
    reads.log = long_conversation(state.views, sealer, turns)
    return c, whole, reads


def test_a_long_conversation_holds_only_its_kept_window(tmp_path: Path) -> None:
    c, whole, _ = trimmed(tmp_path, 300)
    view = c.app.state.views[CNV]  # type: ignore[attr-defined]
    assert view.held_from > 1300 and min(view.content) >= view.held_from
    assert len(view.content) <= 40
    # A turn's reply and proposal go with the window (the turn's state and where they are
    # stay); one still in the window stays held.
    for tv in view.turns.values():
        assert tv.state == "Replied" and tv.reply_seq is not None
        assert (tv.reply is None) == (tv.reply_seq < view.held_from)
        assert (tv.proposal is None) == (tv.proposal_seq is None
                                         or tv.proposal_seq < view.held_from)
        assert (tv.ended is None) == (tv.reply is None)  # a plain "Replied" says no more
    full = whole.app.state.views[CNV]  # type: ignore[attr-defined]
    assert len(full.content) == 700 and full.held_from == 0  # no log reader: nothing trimmed


@pytest.mark.parametrize("limit", [7, 30, TRANSCRIPT_PAGE_MAX])
def test_older_pages_come_from_the_log_and_hold_the_same_transcript(
        tmp_path: Path, limit: int) -> None:
    c, whole, reads = trimmed(tmp_path, 300)
    got, expected = pages(c, limit), pages(whole, TRANSCRIPT_PAGE_MAX)
    for key in ("messages", "proposals", "turns"):
        assert [x for p in got[::-1] for x in p[key]] == [
            x for p in expected[::-1] for x in p[key]], key
    assert all(len(p["messages"]) + len(p["proposals"]) <= limit for p in got)
    assert reads.reads and all(upto - after <= 6 * limit + 3 for after, upto in reads.reads)


def test_an_old_turn_is_answered_with_its_reply_and_proposal_from_the_log(
        tmp_path: Path) -> None:
    c, whole, reads = trimmed(tmp_path, 300)
    turn = turn_id(CNV, 2 + 5 * 2)  # the third turn: a reply and a proposal, long trimmed
    path = f"/me/conversations/{CNV}/turns/{turn}"
    got = c.get(path)
    assert got.status_code == 200, got.text
    assert got.json() == whole.get(path).json()
    assert got.json()["reply"]["text"] == "reply 2" and got.json()["proposal"] == {"n": 2}
    assert len(reads.reads) == 1  # the reply and the proposal, in one read


def test_an_old_page_the_log_no_longer_holds_answers_503(tmp_path: Path) -> None:
    c, _, reads = trimmed(tmp_path, 300)
    reads.lost = 10**6
    newest = c.get(f"/me/conversations/{CNV}").json()
    assert newest["older"] is not None  # the kept window, from memory
    resp = c.get(f"/me/conversations/{CNV}", params={"before": newest["older"]})
    assert resp.status_code == 503
    assert "the log no longer holds seq" in resp.json()["detail"]


def test_an_old_turn_that_failed_keeps_its_reason(tmp_path: Path) -> None:
    reads = LogReads()
    c = app_with(tmp_path, 1, open_last=True, views=ConversationViews(kept=40, gap=reads))
    state: Any = c.app.state  # type: ignore[attr-defined]
    turn = turn_id(CNV, 2)
    state.views.apply(Envelope(
        record=TurnStateChanged(conversation=CNV, turn=turn, state="CouldNotInterpret",
                                reason_code="could_not_interpret",
                                sealed_reason=state.sealer.seal(CNV, f"{turn}:reason", "why")),
        key=CNV, source="/voice/sequencer", seq=5, tenant="default", id="failed"))
    view = state.views[CNV]
    for n in range(60):  # 60 more seqs of other records push it out of the window
        view_seq = view.last_seq + 1
        state.views.apply(Envelope(
            record=TurnStateChanged(conversation=CNV, turn=turn_id(CNV, 1000 + n),
                                    state="Thinking"),
            key=CNV, source="/voice/sequencer", seq=view_seq, tenant="default", id=f"t{n}"))
    assert view.held_from > 5
    got = c.get(f"/me/conversations/{CNV}/turns/{turn}").json()
    assert (got["state"], got["reason"], got["reason_code"]) == (
        "CouldNotInterpret", "why", "could_not_interpret")


def test_an_old_page_is_read_from_the_time_of_the_window_it_left(tmp_path: Path) -> None:
    # The log's times: a minute between turns, so where a read starts shows in what it finds.
    reads = LogReads()
    c = client(tmp_path, "accepted")
    state: Any = c.app.state  # type: ignore[attr-defined]
    state.views = views = ConversationViews(kept=40, gap=reads)
    made = long_conversation(ConversationViews(), state.sealer, 300)
    log = [replace(env, time=made[0].time + timedelta(minutes=i)) for i, env in enumerate(made)]
    for env in log:
        views.apply(env)
    reads.log = log
    view = views[CNV]
    assert len(view.marks) > 100 and view.since_ms(0) is None
    got = pages(c, 30)
    assert sorted(x["seq"] for p in got for x in p["messages"] + p["proposals"]) == [
        seq for seq, _ in enumerate_content(log)]
    # Each page's read starts at the mark before it (less the clocks' slack), not at the
    # conversation's first record — except the oldest pages, which no mark precedes.
    assert reads.since[0] is not None and reads.since[-1] is None
    assert sorted((s for s in reads.since if s is not None), reverse=True) == [
        s for s in reads.since if s is not None]


def enumerate_content(log: list[Envelope]) -> list[tuple[int, Envelope]]:
    return [(part.seq, part) for env in log for part in unfolded(env)
            if part.seq is not None and isinstance(part.record, CONTENT)]
