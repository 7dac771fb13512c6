"""The participant's conversation routes on a real broker, with the real worker and edges.

One test runs the real turn worker against the model simulator, end to end. The others hold
the worker's model calls (``held_model``: a socket that accepts and never answers), so turns
stay ``Thinking`` until the test records their outcome itself, by producing the commands the
turn worker produces (same command ids, so a late real outcome would be a duplicate).
Seqs of a conversation here: 1 started; a message at n, its TurnRequested n+1, Thinking n+2.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from schemas.conversation import (
    MessageRecorded,
    ProposalRecorded,
    ReplyRecorded,
    TurnOpened,
    TurnState,
    TurnStateChanged,
)
from streams.envelope import Envelope, decode
from streams.producer import RecordProducer
from streams.sealing import KeyErased, sealer_for
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import COMMANDS, CONVERSATIONS, topic_name
from tests.support import SseFrame as Frame
from tests.support import SseRead, read_all, read_sse, wait_for

pytestmark = pytest.mark.integration

MESSAGE_TYPES = (MessageRecorded.ce_type.encode(), TurnOpened.ce_type.encode())
"""A participant's message on the log: alone (older logs) or opening its turn."""


def auth(settings: VoiceSettings, sub: str = "alice") -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, sub, 'participant')}"}


def create(url: str, settings: VoiceSettings, sub: str = "alice") -> str:
    r = httpx.post(f"{url}/me/conversations", headers=auth(settings, sub), timeout=10)
    assert r.status_code == 201, r.text
    return r.json()["conversation"]


def send(url: str, settings: VoiceSettings, cnv: str, text: str, sub: str = "alice",
         key: str | None = None) -> httpx.Response:
    headers = auth(settings, sub) | ({"Idempotency-Key": key} if key else {})
    return httpx.post(f"{url}/me/conversations/{cnv}/messages", json={"text": text},
                      headers=headers, timeout=10)


def get(url: str, settings: VoiceSettings, path: str, sub: str = "alice") -> httpx.Response:
    return httpx.get(f"{url}/me/conversations{path}", headers=auth(settings, sub), timeout=10)


def record_turn(settings: VoiceSettings, cnv: str, turn: str, reply: str | None,
                proposal: dict[str, object] | None, state: TurnState = "Replied",
                reason: str | None = None) -> None:
    """Produce what the turn worker produces at the end of a turn, as commands."""
    sealer = sealer_for(settings)
    envs = []
    if reply is not None:
        rid = f"{turn}:reply"
        envs.append(Envelope(record=ReplyRecorded(conversation=cnv, turn=turn, reply_id=rid,
                                                  text=sealer.seal(cnv, rid, reply)),
                             key=cnv, source="/voice/turn-worker", id=f"{turn}:reply",
                             tenant="default"))
    if proposal is not None:
        pid = f"{turn}:proposal"
        envs.append(Envelope(record=ProposalRecorded(conversation=cnv, turn=turn, proposal_id=pid,
                                                     proposal=sealer.seal_json(cnv, pid, proposal)),
                             key=cnv, source="/voice/turn-worker", id=f"{turn}:proposal",
                             tenant="default"))
    # As the turn worker writes a reason: a plain code, the words sealed (issue 12 §5).
    sealed = None if reason is None else sealer.seal(cnv, f"{turn}:reason", reason)
    envs.append(Envelope(record=TurnStateChanged(conversation=cnv, turn=turn, state=state,
                                                 reason_code=reason and "could_not_interpret",
                                                 sealed_reason=sealed),
                         key=cnv, source="/voice/turn-worker", id=f"{turn}:state",
                         tenant="default"))
    sealer.close()  # its key reader and clients: this helper runs many times per module

    async def produce() -> None:
        p = RecordProducer(settings)
        try:
            for env in envs:
                await p.send(topic_name(settings, COMMANDS), env)
        finally:
            p.close()

    asyncio.run(produce())


def turn_state(url: str, settings: VoiceSettings, turn: str, want: str) -> dict | None:
    cnv = turn.split(":")[0]
    r = get(url, settings, f"/{cnv}/turns/{turn}")
    return r.json() if r.status_code == 200 and r.json()["state"] == want else None


# --- SSE ------------------------------------------------------------------------------------


def read_stream(url: str, settings: VoiceSettings, cnv: str, *, sub: str = "alice",
                after: int | None = None, last_event_id: str | None = None,
                stop: Callable[[list[Frame]], bool] | None = None,
                during: Callable[[], None] | None = None) -> SseRead:
    """Read ``…/stream`` until the server ends it or ``stop(events so far)`` holds.

    ``during`` runs once, after the first frame arrived, while the connection stays open.
    """
    headers = auth(settings, sub) | ({"Last-Event-ID": last_event_id} if last_event_id else {})
    params = {"after": after} if after is not None else {}
    s = read_sse("GET", f"{url}/me/conversations/{cnv}/stream", params=params, headers=headers,
                 until=stop, during=during)
    if s.status == 200:
        assert s.headers["content-type"].startswith("text/event-stream")
    return s


def resume_to_end(url: str, settings: VoiceSettings, cnv: str, last: int, *,
                  header: bool, want_last_id: int) -> list[Frame]:
    """Reconnect (after=N or Last-Event-ID: N) until the event with ``want_last_id`` arrived."""
    out: list[Frame] = []
    for _ in range(5):
        kw = {"last_event_id": str(last)} if header else {"after": last}
        s = read_stream(url, settings, cnv, stop=lambda ev: bool(ev) and
                        int(ev[-1].id) >= want_last_id, **kw)
        assert s.status == 200, s.body
        out += s.events
        if out and int(out[-1].id) >= want_last_id:
            return out
        last = int(out[-1].id) if out else last
    raise AssertionError(f"event {want_last_id} never arrived; got {[f.id for f in out]}")


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def worker(start_worker, held_model: str) -> Iterator[None]:  # noqa: ANN001
    """The real worker (sequencer and turn worker) whose model calls never return.

    Killed at the end: a graceful stop would wait for its held model calls.
    """
    proc = start_worker(ANTHROPIC_BASE_URL=held_model)
    yield
    proc.kill()
    proc.wait()


# --- tests ----------------------------------------------------------------------------------


def test_end_to_end_with_the_real_turn_worker_and_no_plaintext_on_any_topic(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()  # its turns call the model simulator
    url = start_edge()
    cnv = create(url, settings)
    secret = f"mould{uuid.uuid4().hex[:12]}"
    text = f"I am worried about the {secret} in our flats, it is a problem for the children"
    r = send(url, settings, cnv, text)
    assert r.status_code == 202, r.text
    turn = r.json()["turn"]
    done = wait_for(lambda: turn_state(url, settings, turn, "Replied"), timeout=60,
                    what="the real turn replied")
    assert done["reply"]["seq"] == 5 and done["reply"]["text"]
    assert done["proposal"]["concerns"] and done["reason"] is None
    s = read_stream(url, settings, cnv, stop=lambda ev: ev[-1].event == "turn"
                    and ev[-1].data["state"] == "Replied")
    assert [f.event for f in s.events] == ["message", "turn", "message", "proposal", "turn"]
    assert s.events[2].data["text"] == done["reply"]["text"]
    assert s.events[3].data["proposal"] == done["proposal"]

    # No plaintext anywhere: every topic of this test, its DLQs and the worker's changelogs.
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    mine = [t for t in admin.list_topics(timeout=10).topics
            if t.startswith(settings.topic_prefix) or t.startswith(settings.group_prefix)]
    assert topic_name(settings, CONVERSATIONS) in mine and len(mine) >= 12
    needles = [secret, "children", done["reply"]["text"][:40]]
    seen = 0
    for topic in mine:
        for m in read_all(settings, topic):
            seen += 1
            blobs = [m.key() or b"", m.value() or b""] + [v or b"" for _, v in m.headers() or []]
            for needle in needles:
                assert not any(needle.encode() in b for b in blobs), (topic, needle)
    assert seen >= 10


def test_every_route_and_turn_state(settings: VoiceSettings, worker, start_edge  # noqa: ANN001
                                    ) -> None:
    url = start_edge()
    cnv = create(url, settings)
    assert [c["conversation"] for c in get(url, settings, "").json()] == [cnv]
    secret, reply_secret = f"mould-{uuid.uuid4().hex}", f"reply-{uuid.uuid4().hex}"
    text = f"My landlord ignores the {secret} in my flat — ça pue"

    r = send(url, settings, cnv, text)
    assert r.status_code == 202, r.text
    body = r.json()
    turn = f"{cnv}:turn-2"
    assert body["turn"] == turn and body["message"]["seq"] == 2
    assert body["message"]["text"] == text and body["message"]["at"].startswith("20")

    t = get(url, settings, f"/{cnv}/turns/{turn}")
    assert t.status_code == 200, t.text
    assert t.json() == {"turn": turn, "state": "Thinking", "reply": None, "proposal": None,
                        "reason": None, "reason_code": None}

    proposal = {"concerns": [{"statement": "damp housing", "quote": secret}],
                "relates_to_issue": None, "new_issue": {"title": "Damp", "summary": ""}}
    record_turn(settings, cnv, turn, f"I hear you: {reply_secret}", proposal)
    done = wait_for(lambda: turn_state(url, settings, turn, "Replied"), what="turn Replied")
    assert done == {"turn": turn, "state": "Replied", "reason": None, "reason_code": None,
                    "reply": {"seq": 5, "text": f"I hear you: {reply_secret}"},
                    "proposal": proposal}

    second = send(url, settings, cnv, "and the heating is broken")
    assert second.status_code == 202 and second.json()["turn"] == f"{cnv}:turn-8"
    record_turn(settings, cnv, f"{cnv}:turn-8", None, None, state="CouldNotInterpret",
                reason="no concern found")
    failed = wait_for(lambda: turn_state(url, settings, f"{cnv}:turn-8", "CouldNotInterpret"))
    assert failed["reason"] == "no concern found" and failed["reply"] is None  # opened
    assert failed["reason_code"] == "could_not_interpret"

    whole = get(url, settings, f"/{cnv}").json()
    assert whole["conversation"] == cnv
    assert whole["messages"] == [
        {"seq": 2, "role": "participant", "text": text, "at": body["message"]["at"],
         "turn": None},
        {"seq": 5, "role": "agent", "text": f"I hear you: {reply_secret}", "at": None,
         "turn": turn},
        {"seq": 8, "role": "participant", "text": "and the heating is broken",
         "at": second.json()["message"]["at"], "turn": None},
    ]
    assert whole["proposals"] == [{"seq": 6, "turn": turn, "proposal": proposal}]
    assert whole["turns"] == [
        {"turn": turn, "state": "Replied", "reason": None, "reason_code": None},
        {"turn": f"{cnv}:turn-8", "state": "CouldNotInterpret", "reason": "no concern found",
         "reason_code": "could_not_interpret"}]
    assert (whole["last_seq"], whole["older"]) == (11, None)
    assert get(url, settings, "").json() == [{"conversation": cnv, "last_seq": 11}]
    # A page at a time, newest first: each turn on the page of its message.
    newest = get(url, settings, f"/{cnv}?limit=2").json()
    assert ([m["seq"] for m in newest["messages"]], newest["proposals"], newest["older"]) == (
        [8], whole["proposals"], 6)
    assert newest["turns"] == whole["turns"][1:] and newest["last_seq"] == 11
    oldest = get(url, settings, f"/{cnv}?limit=2&before=6").json()
    assert (oldest["messages"], oldest["proposals"], oldest["turns"], oldest["older"]) == (
        whole["messages"][:2], [], whole["turns"][:1], None)
    bad = get(url, settings, f"/{cnv}?limit=501")
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "limit"]


def test_message_text_is_validated_and_the_error_names_text(
    settings: VoiceSettings, worker, start_edge  # noqa: ANN001
) -> None:
    url = start_edge()
    cnv = create(url, settings)
    limit = settings.max_message_bytes
    cases = {
        "empty": {"text": ""},
        "whitespace": {"text": " \n\t  "},
        "oversize": {"text": "é" * (limit // 2 + 1)},  # fewer characters than bytes
        "missing": {},
        "not a string": {"text": ["x"]},
    }
    for name, payload in cases.items():
        r = httpx.post(f"{url}/me/conversations/{cnv}/messages", json=payload,
                       headers=auth(settings), timeout=10)
        assert r.status_code == 422, (name, r.text)
        (err,) = r.json()["detail"]
        assert err["loc"] == ["body", "text"], (name, err)
        if name == "oversize":
            assert str(limit) in err["msg"] and "text" in err["msg"]
        if name in ("empty", "whitespace"):
            assert "text must not be empty" in err["msg"]
    assert send(url, settings, cnv, "x" * limit).status_code == 202  # exactly the limit
    log = [m for m in read_all(settings, topic_name(settings, CONVERSATIONS))
           if m.key() == cnv.encode() and dict(m.headers())["ce_type"] in MESSAGE_TYPES]
    assert len(log) == 1


def test_the_same_idempotency_key_gets_the_same_answer_and_one_message(
    settings: VoiceSettings, worker, start_edge  # noqa: ANN001
) -> None:
    url = start_edge()
    cnv = create(url, settings)
    first = send(url, settings, cnv, "the bins are not collected", key="k-1")
    again = send(url, settings, cnv, "the bins are not collected", key="k-1")
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    # A retry whose body changed still answers with what was recorded the first time.
    changed = send(url, settings, cnv, "something else entirely", key="k-1")
    assert changed.status_code == 202 and changed.json() == first.json()
    other = send(url, settings, cnv, "the bins are not collected", key="k-2")
    assert other.json()["message"]["seq"] == 5 and other.json()["turn"] == f"{cnv}:turn-5"

    log = [m for m in read_all(settings, topic_name(settings, CONVERSATIONS))
           if m.key() == cnv.encode() and dict(m.headers())["ce_type"] in MESSAGE_TYPES]
    assert [int(dict(m.headers())["voice_seq"]) for m in log] == [2, 5]
    whole = get(url, settings, f"/{cnv}").json()
    assert [m["text"] for m in whole["messages"]] == ["the bins are not collected"] * 2
    bad_key = send(url, settings, cnv, "x", key="k" * 201)
    assert bad_key.status_code == 422 and bad_key.json()["detail"][0]["loc"] == [
        "header", "Idempotency-Key"]


def test_another_participants_conversation_is_404_on_every_route(
    settings: VoiceSettings, worker, start_edge  # noqa: ANN001
) -> None:
    url = start_edge()
    cnv = create(url, settings, "alice")
    assert send(url, settings, cnv, "mine").status_code == 202
    turn = f"{cnv}:turn-2"
    bob = auth(settings, "bob")
    base = f"{url}/me/conversations"
    for target in (cnv, "cnv-0123456789abcdef", "not-a-conversation"):
        calls = {
            "get": httpx.get(f"{base}/{target}", headers=bob),
            "send": httpx.post(f"{base}/{target}/messages", json={"text": "hi"}, headers=bob),
            "turn": httpx.get(f"{base}/{target}/turns/{turn}", headers=bob),
            "stream": httpx.get(f"{base}/{target}/stream", headers=bob),
            "delete": httpx.delete(f"{base}/{target}", headers=bob),
        }
        for name, r in calls.items():
            assert r.status_code == 404, (target, name, r.text)
            assert "detail" in r.json()
    assert httpx.get(base, headers=bob).json() == []
    # Nothing bob did reached alice's conversation.
    assert [m["seq"] for m in get(url, settings, f"/{cnv}").json()["messages"]] == [2]
    # Alice's own: an unknown turn (after waiting for the view) and a malformed turn id.
    for bad in (f"{cnv}:turn-99", f"{cnv}:turn-3x", "cnv-0123456789abcdef:turn-2"):
        assert get(url, settings, f"/{cnv}/turns/{bad}").status_code == 404, bad
    assert httpx.post(base).status_code == 401


def test_stream_events_in_order_resume_at_random_cuts_and_the_turn_end_while_away(
    settings: VoiceSettings, worker, start_edge  # noqa: ANN001
) -> None:
    url = start_edge()
    cnv = create(url, settings)
    t2, t8 = f"{cnv}:turn-2", f"{cnv}:turn-8"
    assert send(url, settings, cnv, "first").status_code == 202
    proposal = {"concerns": [{"statement": "s", "quote": "q"}], "relates_to_issue": "iss-1",
                "new_issue": None}

    # Live: the turn finishes while the client is connected.
    live = read_stream(url, settings, cnv, during=lambda: record_turn(
        settings, cnv, t2, "a reply", proposal), stop=lambda ev: ev[-1].id == "7")
    assert [(f.event, f.id) for f in live.events] == [
        ("message", "2"), ("turn", "4"), ("message", "5"), ("proposal", "6"), ("turn", "7")]
    d = [f.data for f in live.events]
    assert d[0]["role"] == "participant" and d[0]["text"] == "first" and d[0]["message_id"]
    assert d[0]["seq"] == 2 and d[0]["at"]
    assert d[1] == {"seq": 4, "turn": t2, "state": "Thinking", "reason": None,
                    "reason_code": None}
    assert d[2] == {"seq": 5, "role": "agent", "turn": t2, "text": "a reply"}
    assert d[3] == {"seq": 6, "turn": t2, "proposal": proposal}
    assert d[4] == {"seq": 7, "turn": t2, "state": "Replied", "reason": None,
                    "reason_code": None}

    # Away: the client read up to Thinking of the next turn, then left; the turn ended.
    assert send(url, settings, cnv, "second").status_code == 202
    first = read_stream(url, settings, cnv, after=7, stop=lambda ev: ev[-1].id == "10")
    assert [(f.event, f.id) for f in first.events] == [("message", "8"), ("turn", "10")]
    record_turn(settings, cnv, t8, "second reply", None)
    wait_for(lambda: turn_state(url, settings, t8, "Replied"), what="turn 8 Replied")
    back = read_stream(url, settings, cnv, last_event_id="10", stop=lambda ev: ev[-1].id == "12")
    assert [(f.event, f.id, f.data["seq"]) for f in back.events] == [
        ("message", "11", 11), ("turn", "12", 12)]
    assert back.events[-1].data["state"] == "Replied"

    full = read_stream(url, settings, cnv, stop=lambda ev: ev[-1].id == "12").events
    ids = [int(f.id) for f in full]
    assert ids == [2, 4, 5, 6, 7, 8, 10, 11, 12]  # 1, 3 and 9 are not client events

    # The query wins over the header.
    both = read_stream(url, settings, cnv, after=8, last_event_id="2",
                       stop=lambda ev: ev[-1].id == "12")
    assert [f.id for f in both.events] == ["10", "11", "12"]

    # Random cut points: no gap and no duplicate across reconnects, by header or by query.
    rng = random.Random(int(time.time()))
    for cut in rng.sample(range(1, len(full)), 4):
        head = read_stream(url, settings, cnv, stop=lambda ev, c=cut: len(ev) >= c).events
        assert head == full[:cut]
        rest = resume_to_end(url, settings, cnv, int(head[-1].id), header=cut % 2 == 0,
                             want_last_id=12)
        assert [(f.event, f.id, f.data) for f in head + rest] == [
            (f.event, f.id, f.data) for f in full], f"cut at {cut}"


def test_bounded_stream_keepalives_and_a_cursor_older_than_kept(
    settings: VoiceSettings, worker, start_edge  # noqa: ANN001
) -> None:
    url = start_edge(VOICE_GATEWAY_BOUND_S="3", VOICE_EDGE_EVENTS_KEPT="10")
    cnv = create(url, settings)
    assert send(url, settings, cnv, "one").status_code == 202  # seqs 2..4

    # A quiet stream: events, keep-alives without ids, then the final comment before 3 s.
    s = read_stream(url, settings, cnv)
    assert s.ended and s.elapsed < 3.0, s.elapsed
    assert [f.id for f in s.events] == ["2", "4"]
    quiet = [f for f in s.frames if f.event is None]
    assert quiet and all(f.id is None and f.data is None for f in quiet)
    assert any(f.comments == ["keep-alive"] for f in quiet)
    assert s.frames[-1].comments == ["end; reconnect with after=4"]
    assert s.frames[-1].event is None and s.frames[-1].id is None
    assert all(f.event is not None for f in s.frames if f.id is not None)

    # Enough events that the first ones fall out of what the edge keeps (10).
    for n in range(3):
        assert send(url, settings, cnv, f"more {n}").status_code == 202  # up to seq 13
    wait_for(lambda: get(url, settings, "").json()[0]["last_seq"] == 13)
    # Cursors older than the edge keeps: the events before its oldest (3) are read from the
    # log, then the kept ones follow — each once, in order, as from an edge that kept them.
    everything = ["2", "4", "5", "7", "8", "10", "11", "13"]
    for kw, ids in (({"after": 0}, everything), ({"after": 2}, everything[1:]),
                    ({"last_event_id": "1"}, everything)):
        old = read_stream(url, settings, cnv, stop=lambda ev: bool(ev) and ev[-1].id == "13", **kw)
        assert old.status == 200, kw
        assert [f.id for f in old.events] == ids, kw
    ok = read_stream(url, settings, cnv, after=3)
    assert ok.status == 200
    assert [f.id for f in ok.events] == ["4", "5", "7", "8", "10", "11", "13"]
    bad = read_stream(url, settings, cnv, last_event_id="abc")
    assert bad.status == 422 and bad.body["detail"][0]["loc"] == ["header", "Last-Event-ID"]
    # The transcript is not bounded by the event list: the edge holds the kept window, and
    # the pages before it are read from the log — every message once, in order.
    newest = get(url, settings, f"/{cnv}").json()
    assert newest["older"] is not None and len(newest["messages"]) < 4
    older = get(url, settings, f"/{cnv}?before={newest['older']}").json()
    assert older["older"] is None
    assert [m["seq"] for m in older["messages"] + newest["messages"]] == [2, 5, 8, 11]
    assert [t["turn"] for t in older["turns"] + newest["turns"]] == [
        f"{cnv}:turn-{n}" for n in (2, 5, 8, 11)]


def test_a_turn_older_than_the_edge_keeps_is_answered_from_the_log(
    settings: VoiceSettings, worker, start_edge  # noqa: ANN001
) -> None:
    url = start_edge(VOICE_EDGE_EVENTS_KEPT="10")
    cnv = create(url, settings)
    turn = f"{cnv}:turn-2"
    assert send(url, settings, cnv, "the bins").status_code == 202  # seqs 2..4
    proposal = {"concerns": [], "relates_to_issue": None, "new_issue": None}
    record_turn(settings, cnv, turn, "noted: the bins", proposal)  # seqs 5..7
    answer = wait_for(lambda: turn_state(url, settings, turn, "Replied"), what="turn Replied")
    for n in range(4):  # 12 seqs more: the turn's records fall out of the 10 kept
        assert send(url, settings, cnv, f"more {n}").status_code == 202
    wait_for(lambda: get(url, settings, "").json()[0]["last_seq"] == 19)
    later = get(url, settings, f"/{cnv}/turns/{turn}")
    assert later.status_code == 200 and later.json() == answer
    assert answer["reply"] == {"seq": 5, "text": "noted: the bins"}
    assert answer["proposal"] == proposal
    oldest = get(url, settings, f"/{cnv}?before=8").json()
    assert [(m["seq"], m["text"]) for m in oldest["messages"]] == [
        (2, "the bins"), (5, "noted: the bins")]
    assert oldest["proposals"] == [{"seq": 6, "turn": turn, "proposal": proposal}]


def test_two_edges_serve_the_same_conversation(
    settings: VoiceSettings, worker, start_edge  # noqa: ANN001
) -> None:
    a, b = start_edge(), start_edge()
    cnv = create(a, settings)
    # Right away on the other edge: it waits for its view to reach the conversation.
    r = send(b, settings, cnv, "posted on b")
    assert r.status_code == 202, r.text
    turn = r.json()["turn"]
    assert get(a, settings, f"/{cnv}/turns/{turn}").json()["state"] == "Thinking"
    r2 = send(a, settings, cnv, "posted on a")
    assert get(b, settings, f"/{cnv}/turns/{r2.json()['turn']}").json()["state"] == "Thinking"
    record_turn(settings, cnv, turn, "one reply", None)
    wait_for(lambda: turn_state(b, settings, turn, "Replied"))
    s = read_stream(b, settings, cnv, stop=lambda ev: ev[-1].id == "9")
    assert [(f.event, f.data.get("text")) for f in s.events] == [
        ("message", "posted on b"), ("turn", None), ("message", "posted on a"), ("turn", None),
        ("message", "one reply"), ("turn", None)]
    for url in (a, b):
        msgs = get(url, settings, f"/{cnv}").json()["messages"]
        assert [m["text"] for m in msgs] == ["posted on b", "posted on a", "one reply"]
        assert [c["conversation"] for c in get(url, settings, "").json()] == [cnv]


def test_erasure_forgets_the_conversation_on_every_edge_and_shreds_the_log(
    settings: VoiceSettings, worker, start_edge  # noqa: ANN001
) -> None:
    a, b = start_edge(), start_edge()
    cnv = create(a, settings)
    keep = create(a, settings)
    turn = send(a, settings, cnv, "erase me").json()["turn"]
    assert send(a, settings, keep, "keep me").status_code == 202
    record_turn(settings, cnv, turn, "a reply to erase", {"concerns": []})
    wait_for(lambda: turn_state(b, settings, turn, "Replied"))  # b has opened it (key cached)
    assert len(get(b, settings, f"/{cnv}").json()["messages"]) == 2

    assert httpx.delete(f"{a}/me/conversations/{cnv}", headers=auth(settings)).status_code == 204
    for url in (a, b):
        wait_for(lambda u=url: get(u, settings, f"/{cnv}").status_code == 404,
                 what="erased on every edge")
        assert get(url, settings, f"/{cnv}/turns/{turn}").status_code == 404
        assert read_stream(url, settings, cnv).status == 404
        assert read_stream(url, settings, cnv, after=3).status == 404
        assert send(url, settings, cnv, "again?").status_code == 404
        assert httpx.delete(f"{url}/me/conversations/{cnv}",
                            headers=auth(settings)).status_code == 404
        assert [c["conversation"] for c in get(url, settings, "").json()] == [keep]
        assert get(url, settings, f"/{keep}").json()["messages"][0]["text"] == "keep me"

    # The log still holds the sealed records, and nobody can open them any more.
    records = [decode(m.key(), m.value(), m.headers())
               for m in read_all(settings, topic_name(settings, CONVERSATIONS))
               if m.key() == cnv.encode()]
    assert records[-1].type == "voice.conversation.erased.v1"
    sealed = [(r.record.message_id, r.record.text) if hasattr(r.record, "message_id")
              else (r.record.reply_id, r.record.text) for r in records
              if isinstance(r.record, (MessageRecorded, ReplyRecorded))]
    assert len(sealed) == 2
    fresh = sealer_for(settings)
    for content_id, blob in sealed:
        with pytest.raises(KeyErased):
            fresh.open_text(cnv, content_id, blob)
    fresh.close()


def _two_asks(url: str, idle_s: float) -> tuple[bytes, bytes]:
    """Two ``GET /healthz`` on one connection to the edge at ``url``, ``idle_s`` apart: the
    answers' first bytes (b"" for the second when the edge closed the connection
    meanwhile)."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    ask = b"GET /healthz HTTP/1.1\r\nhost: edge\r\n\r\n"

    def answer(s: socket.socket) -> bytes:  # one whole answer (it has a content-length)
        got = b""
        while b"\r\n\r\n" not in got or len(got) < got.index(b"\r\n\r\n") + 4 + int(
                got.lower().split(b"content-length: ")[1].split(b"\r\n")[0]):
            if not (chunk := s.recv(4096)):
                break
            got += chunk
        return got

    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(ask)
        first = answer(s)
        time.sleep(idle_s)
        try:
            s.sendall(ask)
            second = answer(s)
        except ConnectionError:
            second = b""
    return first, second


def test_an_idle_connection_outlives_a_clients_pool_and_its_bound_is_a_setting(
        start_edge) -> None:  # noqa: ANN001
    """Regression: the edge closed idle connections after uvicorn's 5 s, as httpx's pool
    (5 s) reused them, and a request sent just then met a reset (the bench's ``ReadError``;
    behind a gateway, a 502). It keeps them ``VOICE_EDGE_KEEP_ALIVE_S`` (75 s by default)."""
    first, second = _two_asks(start_edge(), 6.0)
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")
    first, second = _two_asks(start_edge(VOICE_EDGE_KEEP_ALIVE_S="1"), 2.5)
    assert first.startswith(b"HTTP/1.1 200") and second == b""
