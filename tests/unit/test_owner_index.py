"""The index by owner as a windowed edge reads it (decision 0015): an owner's entries are read
on demand, once, with what the tail brings meanwhile applied after; an owner with none is an
empty list that a later entry of theirs reopens; a record under another owner's key is not
theirs; unused owners are let go of. And a started conversation's entry (its writer produces it:
``tests/unit/test_writer.py``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

from api import conversations
from api.conversations.owners import OwnerIndex
from api.conversations.views import ConversationViews
from api.frame.cold import ColdReadFailed
from consumers.conversations.owners import index_record
from schemas.base import Sealed
from schemas.conversation import (
    ConversationIndexed,
    ConversationStarted,
    MessageRecorded,
    TurnRequested,
)
from streams.envelope import Envelope
from streams.ids import new_conversation_id, owner_key
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from tests.unit.test_edge_cold import Reader  # a cold reader over fixed records


@dataclass(frozen=True)
class Who:
    sub: str
    tenant: str


ALICE = Who("alice", "t1")
KEY = owner_key("t1", "alice")


def entry(conversation: str, owner: str = "alice", tenant: str = "t1",
          key: str | None = None) -> Envelope:
    return Envelope(record=ConversationIndexed(conversation=conversation, owner=owner),
                    key=key or owner_key(tenant, owner), source="/voice/owners", tenant=tenant)


def test_an_owner_is_read_once_and_listed_in_the_order_started() -> None:
    reader = Reader([entry("cnv-1"), entry("cnv-other", owner="bob"), entry("cnv-2"),
                     entry("cnv-1")])  # a redelivered entry changes nothing
    owners = OwnerIndex(cold=reader)

    async def main() -> None:
        assert await owners.ensure(KEY) and await owners.ensure(KEY)

    asyncio.run(main())
    assert reader.calls == 1
    assert list(owners.conversations_of(ALICE)) == ["cnv-1", "cnv-2"]
    assert list(owners.conversations_of(Who("alice", "t2"))) == []  # another tenant's alice


def test_entries_the_tail_brings_during_the_read_apply_after_it() -> None:
    reader = Reader([entry("cnv-1")])
    reader.gate.clear()
    owners = OwnerIndex(cold=reader)
    owners.on_tail(entry("cnv-0"))  # not asked for: dropped (the read brings it)
    assert KEY not in owners

    async def main() -> None:
        asker = asyncio.create_task(owners.ensure(KEY))
        await asyncio.sleep(0.05)
        owners.on_tail(entry("cnv-1"))  # also in the read: once
        owners.on_tail(entry("cnv-2"))
        assert KEY not in owners and len(owners.pending[KEY]) == 2
        reader.gate.set()
        assert await asyncio.wait_for(asker, 5)

    asyncio.run(main())
    assert list(owners.conversations_of(ALICE)) == ["cnv-1", "cnv-2"] and not owners.pending
    owners.on_tail(entry("cnv-3"))  # held now: applied at once
    assert list(owners.conversations_of(ALICE)) == ["cnv-1", "cnv-2", "cnv-3"]


def test_an_owners_first_entry_arriving_during_the_read_of_none_is_kept() -> None:
    reader = Reader([])
    reader.gate.clear()
    owners = OwnerIndex(cold=reader)

    async def main() -> None:
        asker = asyncio.create_task(owners.ensure(KEY))
        await asyncio.sleep(0.05)
        owners.on_tail(entry("cnv-1"))
        reader.gate.set()
        await asyncio.wait_for(asker, 5)

    asyncio.run(main())
    assert list(owners.conversations_of(ALICE)) == ["cnv-1"]


def test_an_owner_with_none_is_empty_until_an_entry_of_theirs_comes_by_the_tail() -> None:
    reader = Reader([])
    owners = OwnerIndex(cold=reader)

    async def main() -> None:
        assert await owners.ensure(KEY)
        assert await owners.ensure(KEY)  # remembered: no second read
        assert reader.calls == 1 and list(owners.conversations_of(ALICE)) == []
        # Alice starts a conversation: the tail's entry is not applied (no view), but her
        # next list reads her entries again and finds it.
        reader.records.append(entry("cnv-new"))
        owners.on_tail(entry("cnv-new"))
        assert await owners.ensure(KEY)

    asyncio.run(main())
    assert reader.calls == 2 and list(owners.conversations_of(ALICE)) == ["cnv-new"]


def test_a_record_under_another_owners_key_is_not_theirs() -> None:
    forged = entry("cnv-x", owner="mallory", key=KEY)
    owners = OwnerIndex(cold=Reader([forged, entry("cnv-1")]))
    asyncio.run(owners.ensure(KEY))
    assert list(owners.conversations_of(ALICE)) == ["cnv-1"]


def test_an_unused_owner_is_let_go_of_and_read_again() -> None:
    reader = Reader([entry("cnv-1")])
    owners = OwnerIndex(cold=reader)
    asyncio.run(owners.ensure(KEY))
    assert owners.evict_idle(60.0) == 0  # just used
    view = owners[KEY]
    assert owners.evict_idle(60.0, now=view.used_at + 61) == 1 and KEY not in owners
    asyncio.run(owners.ensure(KEY))
    assert reader.calls == 2 and list(owners.conversations_of(ALICE)) == ["cnv-1"]


def test_the_worker_indexes_a_started_conversation_under_its_owner_and_nothing_else() -> None:
    started = Envelope(record=ConversationStarted(conversation="cnv-1", owner="alice"),
                       key="cnv-1", source="/voice/sequencer", seq=1, tenant="t1",
                       correlation="c1")
    indexed = index_record(started)
    assert indexed is not None
    assert indexed.key == KEY and indexed.tenant == "t1" and indexed.causation == started.id
    assert indexed.record == ConversationIndexed(conversation="cnv-1", owner="alice")
    assert indexed.id == index_record(started).id  # the same entry again: the same id
    message = Envelope(record=MessageRecorded(
        conversation="cnv-1", message_id="m", at="2026-01-01T00:00:00+00:00",
        text=Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy")),
        key="cnv-1", source="/voice/sequencer", seq=2, tenant="t1")
    assert index_record(message) is None


def listing_app(tmp_path: Path, owners: OwnerIndex) -> tuple[TestClient, ConversationViews,
                                                               Sealer]:
    """The conversation routes on a windowed edge's state: views, the index, a key store."""
    settings = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path)
    app = FastAPI()
    app.include_router(conversations.router)
    app.state.settings = settings
    app.state.views = views = ConversationViews(cold=lambda _key: [])
    app.state.owners = owners
    app.state.sealer = sealer = Sealer(MemoryKeyStore())
    c = TestClient(app)
    c.headers["Authorization"] = f"Bearer {mint_token(settings, 'alice', 'participant')}"
    return c, views, sealer


def test_the_list_merges_held_and_indexed_leaves_out_erased_and_orders_by_start(
        tmp_path: Path) -> None:
    ids = [new_conversation_id(now=1_800_000_000 + i) for i in range(5)]
    old, opened, erased, keyless, fresh = ids
    # The index (written from the log) lists four, not in start order (partitions interleave);
    # the newest is held by the edge and not indexed yet.
    owners = OwnerIndex(cold=Reader([entry(c, tenant="default")
                                     for c in (opened, old, erased, keyless)]))
    c, views, sealer = listing_app(tmp_path, owners)
    for cnv in (old, opened, erased, fresh):
        sealer.create(cnv, "default")
    sealer.erase(erased)  # its key gone: erased through another edge
    # ``keyless``: no key on the key topic (its tombstone compacted away): not listed.
    for cnv, seq in ((opened, 7), (fresh, 3)):
        for n in range(1, seq + 1):
            views.apply(Envelope(record=ConversationStarted(conversation=cnv, owner="alice")
                                 if n == 1 else TurnRequested(conversation=cnv,
                                                              turn=f"{cnv}:turn-{n}",
                                                              message_seq=n),
                                 key=cnv, source="/test", seq=n, tenant="default"))
    r = c.get("/me/conversations")
    assert r.status_code == 200, r.text
    assert r.json() == [{"conversation": old, "last_seq": None},
                        {"conversation": opened, "last_seq": 7},
                        {"conversation": fresh, "last_seq": 3}]


def test_the_list_comes_a_page_at_a_time_newest_first_each_in_start_order(
        tmp_path: Path) -> None:
    # Eight indexed (two erased), two held only: pages of three, newest page first.
    ids = [new_conversation_id(now=1_800_000_000 + i) for i in range(10)]
    owners = OwnerIndex(cold=Reader([entry(c, tenant="default") for c in ids[:8]]))
    c, views, sealer = listing_app(tmp_path, owners)
    for cnv in ids:
        sealer.create(cnv, "default")
    for cnv in (ids[2], ids[7]):
        sealer.erase(cnv)
    for cnv in ids[8:]:
        views.apply(Envelope(record=ConversationStarted(conversation=cnv, owner="alice"),
                             key=cnv, source="/test", seq=1, tenant="default"))
    seen, url, pages = [], "/me/conversations?limit=3", 0
    while url:
        r = c.get(url)
        assert r.status_code == 200, r.text
        page = [s["conversation"] for s in r.json()]
        assert page == sorted(page) and len(page) <= 3  # start order within a page
        seen = page + seen
        link = r.headers.get("Link")
        url = link[1:link.index(">")] if link else ""
        assert not link or link.endswith('; rel="next"')
        pages += 1
    assert pages == 3  # 8 listed: 3, 3, 2 — and no empty page after the last
    assert seen == [i for i in ids if i not in (ids[2], ids[7])]
    # The default page holds them all, and says there is no more.
    r = c.get("/me/conversations")
    assert [s["conversation"] for s in r.json()] == seen and "Link" not in r.headers
    # A page before the oldest is empty; a cursor is any well-formed id, started or not.
    assert c.get(f"/me/conversations?before={ids[0]}").json() == []
    between = new_conversation_id(now=1_800_000_004.5)
    assert [s["conversation"] for s in c.get(f"/me/conversations?before={between}").json()] \
        == [ids[0], ids[1], ids[3], ids[4]]


def test_a_bad_page_is_refused_naming_its_parameter(tmp_path: Path) -> None:
    c, _views, _sealer = listing_app(tmp_path, OwnerIndex(cold=Reader([])))
    for query, name in (("limit=0", "limit"), ("limit=1001", "limit"),
                        ("before=not-a-conversation", "before"),
                        ("before=cnv-" + "a" * 40, "before")):
        r = c.get(f"/me/conversations?{query}")
        assert r.status_code == 422, (query, r.text)
        assert r.json()["detail"][0]["loc"] == ["query", name], r.text


def test_an_edge_that_reads_everything_pages_its_list_the_same_way(tmp_path: Path) -> None:
    ids = [new_conversation_id(now=1_800_000_000 + i) for i in range(4)]
    c, views, _sealer = listing_app(tmp_path, OwnerIndex(cold=Reader([])))
    c.app.state.owners = None  # type: ignore[attr-defined]
    for cnv in reversed(ids):  # held in another order than they started
        views.apply(Envelope(record=ConversationStarted(conversation=cnv, owner="alice"),
                             key=cnv, source="/test", seq=1, tenant="default"))
    r = c.get("/me/conversations?limit=3")
    assert [s["conversation"] for s in r.json()] == ids[1:]
    assert r.headers["Link"] == f'</me/conversations?before={ids[1]}&limit=3>; rel="next"'
    assert [s["conversation"] for s in c.get(f"/me/conversations?before={ids[1]}&limit=3")
            .json()] == ids[:1]


def test_a_failed_read_of_the_index_answers_503_and_the_next_list_tries_again(
        tmp_path: Path) -> None:
    calls = []

    def flaky(key: str) -> list[Envelope]:
        calls.append(key)
        if len(calls) == 1:
            raise ColdReadFailed("the broker is down")
        return [entry("cnv-00000000000000aa", tenant="default")]

    c, _views, sealer = listing_app(tmp_path, OwnerIndex(cold=flaky))
    sealer.create("cnv-00000000000000aa", "default")
    r = c.get("/me/conversations")
    assert r.status_code == 503 and "the conversations of" in r.json()["detail"]
    assert c.get("/me/conversations").json() == [
        {"conversation": "cnv-00000000000000aa", "last_seq": None}]
