"""Erasing an assistant chat, an uploaded dataset and a contribution, without a broker: the
sequencer's decisions, the edge's views, the routes (key destroyed before the log hears of it;
anyone else's answers 404) and the worker's caches, which must obey an erasure at once."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api import assistant, staff
from api.assistant import AssistantViews
from api.staff import StaffViews
from consumers.assistant.datasets import DatasetUnavailable, KafkaDatasets, LoadedDataset
from consumers.assistant.images import KafkaImages, LoadedImage
from consumers.assistant.sequencer import AssistantSequencer
from consumers.frame.writer import outputs
from schemas.assistant import (
    AppendDisplay,
    AssistantChat,
    AssistantConversationErased,
    AssistantConversationStarted,
    AssistantDisplayRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    DatasetErased,
    DatasetRecorded,
    DatasetRef,
    DisplayPayload,
    EraseAssistantConversation,
)
from schemas.base import Sealed
from schemas.staff import ContributionErased, ContributionRecorded, IssueOpened
from schemas.system import CommandAcknowledged
from streams.assistant_settings import assistant_settings
from streams.envelope import Envelope, decode
from streams.ids import review_queue_key
from streams.sealing import KeyErased, KeyNotFound, MemoryKeyStore, Sealer
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import ACKS, ASSISTANT

CONV = str(uuid.UUID(int=7))
SEALED = Sealed(key_version=1, nonce="AAAA", ciphertext="AAAA")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


# --- the assistant sequencer ------------------------------------------------------------------


def cmd(record: Any, cid: str) -> Envelope:
    return Envelope(record=record, key=CONV, source="/test", id=cid, time=T0)


def chat(cid: str, create: bool = False) -> Envelope:
    return cmd(AssistantChat(conversation=CONV, owner="alice", create=create,
                             message_id=f"m-{cid}", request=SEALED), cid)


def test_erasing_a_chat_ends_it_and_nothing_is_appended_or_accepted_after() -> None:
    seq = AssistantSequencer()
    state, _ = outputs(seq, None, chat("c1", create=True))
    turn = state.running
    state, out = outputs(seq, state, cmd(EraseAssistantConversation(conversation=CONV), "e1"))
    logged = [env.record for spec, env in out if spec is ASSISTANT]
    acks = [env.record for spec, env in out if spec is ACKS]
    assert logged == [AssistantConversationErased(conversation=CONV)]
    assert [(a.outcome, a.seq) for a in acks] == [("accepted", 3)]
    assert state.erased and state.running is None and state.deadline is None
    assert seq.overdue(CONV, state.to_dict(), T0) == []  # the janitor has nothing to expire

    # The running turn's late output, and any new chat (even one asking to create it again).
    payload = DisplayPayload(event_id="d1", type="text_delta", channel="response", ts=1.0,
                             data=SEALED, message_id=turn)
    late = [cmd(AppendDisplay(conversation=CONV, turn=turn, event=payload), "d1"),
            cmd(AssistantReplyRecorded(conversation=CONV, turn=turn, reply_id="r", chain=SEALED,
                                       cards=SEALED), "r1"),
            cmd(AssistantTurnEnded(conversation=CONV, turn=turn, state="Replied"), "t1")]
    for c in late:
        after, out = outputs(seq, state, c)
        assert out == [] and after.seq == 3
    for c in (chat("c2"), chat("c3", create=True),
              cmd(EraseAssistantConversation(conversation=CONV), "e2")):
        _, out = outputs(seq, state, c)
        assert [env.record.detail for spec, env in out if spec is ACKS] == [
            {"reason": "no such conversation"}]
        assert not [env for spec, env in out if spec is ASSISTANT]


def test_erasing_an_unknown_chat_is_no_such_conversation() -> None:
    _, out = outputs(AssistantSequencer(), None,
                     cmd(EraseAssistantConversation(conversation=CONV), "e1"))
    assert [(env.record.outcome, env.record.detail) for spec, env in out if spec is ACKS] == [
        ("rejected", {"reason": "no such conversation"})]


# --- the edge's views -------------------------------------------------------------------------


def settings_for(tmp_path: Path) -> VoiceSettings:
    return VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path)


def started(tenant: str = "t1", owner: str = "alice") -> Envelope:
    return Envelope(record=AssistantConversationStarted(conversation=CONV, owner=owner),
                    key=CONV, source="/test", seq=1, tenant=tenant)


def test_an_erased_chat_is_forgotten_and_nobodys(tmp_path: Path) -> None:
    views = AssistantViews(assistant_settings(settings_for(tmp_path))).conversations
    views.apply(started())
    assert views[CONV].owned_by("alice")
    views.apply(Envelope(record=AssistantConversationErased(conversation=CONV), key=CONV,
                         source="/test", seq=2, tenant="t1"))
    view = views[CONV]
    assert view.erased and not view.owned_by("alice") and not view.turns and not view.events


def dataset_record(sealer: Sealer, dataset_id: str, owner: str = "alice") -> DatasetRecorded:
    sealer.create(dataset_id)
    return DatasetRecorded(dataset_id=dataset_id, owner=owner, rows=1, columns=1, size_bytes=4,
                           meta=sealer.seal_json(dataset_id, "meta", {"name": "d.csv",
                                                                      "columns": ["a"]}),
                           csv=sealer.seal(dataset_id, "csv", "a\n1\n"), at="t")


def test_an_erased_dataset_is_nobodys_and_an_erasure_alone_makes_nothing(tmp_path: Path) -> None:
    sealer = Sealer(MemoryKeyStore())
    datasets = AssistantViews(assistant_settings(settings_for(tmp_path))).datasets
    ds = uuid.uuid4().hex
    datasets.apply(Envelope(record=dataset_record(sealer, ds), key=ds, source="/t",
                            tenant="t1"), 0, 5)
    assert datasets[ds].owned_by("alice")
    datasets.apply(Envelope(record=DatasetErased(dataset_id=ds), key=ds, source="/t",
                            tenant="t1"), 0, 6)
    assert datasets[ds].erased and not datasets[ds].owned_by("alice")
    # Compaction kept only the erasure (a second edge, later): nothing to know of it.
    other = uuid.uuid4().hex
    datasets.apply(Envelope(record=DatasetErased(dataset_id=other), key=other, source="/t",
                            tenant="t1"), 0, 7)
    assert other not in datasets


def contribution(c: str = "ctb-1", author: str = "alice", state: str = "in_review"
                 ) -> ContributionRecorded:
    return ContributionRecorded(contribution=c, issue="iss-1", author=author, text=SEALED,
                                state=state, submitted_at="t", updated_at="t")  # type: ignore[arg-type]


def test_an_erased_contribution_stays_forgotten_whatever_lands_after_it() -> None:
    views = StaffViews().contributions
    views.apply(Envelope(record=contribution(), key="ctb-1", source="/t", tenant="t1"))
    views.apply(Envelope(record=ContributionErased(contribution="ctb-1", issue="iss-1"),
                         key="ctb-1", source="/t", tenant="t1"))
    assert "ctb-1" not in views
    # A review step that raced the erasure: its record does not bring the contribution back.
    views.apply(Envelope(record=contribution(state="published"), key="ctb-1", source="/t",
                         tenant="t1"))
    assert "ctb-1" not in views


# --- the routes -------------------------------------------------------------------------------


class KeyWatchingProducer:
    """Takes every record at once and notes, for each, whether its key's data key was already
    destroyed when it was produced (the order every erasure must keep)."""

    def __init__(self, sealer: Sealer) -> None:
        self.sealer = sealer
        self.sent: list[tuple[Envelope, bool]] = []

    def produce_raw(self, topic: str, key: Any, value: Any, headers: Any = None) -> Any:
        env = decode(key, value, headers)
        try:
            self.sealer.check_live(env.key)
            gone = False
        except KeyErased:
            gone = True
        except KeyNotFound:  # a key that seals nothing (a review queue's note)
            gone = False
        self.sent.append((env, gone))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


class ErasingTail:
    """Accepts every command as its writer would and applies the chat's erasure to the view."""

    def __init__(self, producer: KeyWatchingProducer, views: AssistantViews) -> None:
        self.producer, self.views = producer, views

    def expect_ack(self, command_id: str) -> Any:
        return None

    def forget_ack(self, command_id: str) -> None:
        pass

    async def wait_ack(self, command_id: str, fut: Any, timeout: float) -> CommandAcknowledged:
        env, _ = self.producer.sent[-1]
        assert isinstance(env.record, EraseAssistantConversation)
        self.views.conversations.apply(Envelope(
            record=AssistantConversationErased(conversation=env.key), key=env.key,
            source="/test", seq=2, tenant=env.tenant))
        return CommandAcknowledged(command_id=command_id, aggregate=env.key, outcome="accepted",
                                   seq=2)


def app_for(tmp_path: Path) -> tuple[FastAPI, VoiceSettings]:
    settings = settings_for(tmp_path)
    app = FastAPI()
    app.include_router(assistant.router)
    app.include_router(staff.router)
    app.state.settings = settings
    app.state.assistant = AssistantViews(assistant_settings(settings))
    app.state.staff = StaffViews()
    app.state.sealer = Sealer(MemoryKeyStore())
    app.state.producer = KeyWatchingProducer(app.state.sealer)
    app.state.tail = ErasingTail(app.state.producer, app.state.assistant)
    return app, settings


def as_(settings: VoiceSettings, sub: str = "alice", tenant: str = "t1",
        role: str = "participant") -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, sub, role, tenant)}"}


def test_deleting_a_chat_destroys_its_key_before_the_log_hears_and_then_it_is_gone(
        tmp_path: Path) -> None:
    app, settings = app_for(tmp_path)
    sealer: Sealer = app.state.sealer
    sealer.create(CONV)
    blob = sealer.seal(CONV, "m-1", "a question")
    app.state.assistant.conversations.apply(started())
    path = f"/api/v1/assistant/conversations/{CONV}"
    with TestClient(app) as c:
        assert c.delete(path, headers=as_(settings, sub="mallory")).status_code == 404
        assert c.delete(path, headers=as_(settings, tenant="t2")).status_code == 404
        assert app.state.producer.sent == []  # nothing erased by them
        assert sealer.open_text(CONV, "m-1", blob) == "a question"
        assert c.delete(path, headers=as_(settings)).status_code == 204
        [(env, key_gone)] = app.state.producer.sent
        assert isinstance(env.record, EraseAssistantConversation) and key_gone
        with pytest.raises(KeyErased):
            sealer.open_text(CONV, "m-1", blob)
        assert c.delete(path, headers=as_(settings)).status_code == 404
        assert c.get(f"{path}/stream", headers=as_(settings)).status_code == 404
        assert c.get(f"{path}/turns/{CONV}:turn-2", headers=as_(settings)).status_code == 404


def test_deleting_a_dataset_destroys_its_key_then_records_the_erasure(tmp_path: Path) -> None:
    app, settings = app_for(tmp_path)
    sealer: Sealer = app.state.sealer
    ds = uuid.uuid4().hex
    rec = dataset_record(sealer, ds)
    app.state.assistant.datasets.apply(Envelope(record=rec, key=ds, source="/t", tenant="t1"),
                                       0, 3)
    path = f"/api/v1/assistant/files/{ds}"
    with TestClient(app) as c:
        assert c.delete(path, headers=as_(settings, sub="mallory")).status_code == 404
        assert c.delete(path, headers=as_(settings, tenant="t2")).status_code == 404
        assert c.delete("/api/v1/assistant/files/not-an-id",
                        headers=as_(settings)).status_code == 404
        assert app.state.producer.sent == []
        assert c.delete(path, headers=as_(settings)).status_code == 204
        [(env, key_gone)] = app.state.producer.sent
        assert env.record == DatasetErased(dataset_id=ds) and env.tenant == "t1" and key_gone
        with pytest.raises(KeyErased):
            sealer.open_text(ds, "csv", rec.csv)
        assert c.delete(path, headers=as_(settings)).status_code == 404


def test_deleting_a_contribution_is_its_authors_alone(tmp_path: Path) -> None:
    app, settings = app_for(tmp_path)
    sealer: Sealer = app.state.sealer
    text = sealer.seal("ctb-1", "text", "my words")
    app.state.staff.contributions.apply(Envelope(
        record=contribution().model_copy(update={"text": text}), key="ctb-1", source="/t",
        tenant="t1"))
    path = "/me/issues/iss-1/contributions/ctb-1"
    with TestClient(app) as c:
        assert c.delete(path, headers=as_(settings, sub="mallory")).status_code == 404
        assert c.delete(path, headers=as_(settings, tenant="t2")).status_code == 404
        assert c.delete("/me/issues/iss-2/contributions/ctb-1",
                        headers=as_(settings)).status_code == 404
        # Staff reject in review; erasing is not theirs (their role cannot contribute).
        assert c.delete(path, headers=as_(settings, sub="staff-t1",
                                          role="staff")).status_code == 403
        assert app.state.producer.sent == []
        assert c.delete(path, headers=as_(settings)).status_code == 204
        [(env, key_gone), (queued, _)] = app.state.producer.sent
        assert env.record == ContributionErased(contribution="ctb-1", issue="iss-1") and key_gone
        # It leaves the tenant's live review queue: a note to the queue's writer.
        assert queued.key == review_queue_key("t1") and queued.id == "ctb-1:erased"
        assert queued.record.event == "erased" and queued.record.waiting_for is None
        with pytest.raises(KeyErased):
            sealer.open_text("ctb-1", "text", text)
        assert "ctb-1" not in app.state.staff.contributions


# --- the worker's caches ----------------------------------------------------------------------


def test_a_cached_dataset_or_image_is_not_read_once_erased(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    sealer = Sealer(MemoryKeyStore())
    ds, img = uuid.uuid4().hex, uuid.uuid4().hex
    sealer.create(ds)
    sealer.create(img)
    datasets = KafkaDatasets(settings, sealer, 1 << 20)
    images = KafkaImages(settings, sealer, 1 << 20)
    datasets.opened.put(ds, LoadedDataset(ds, "alice", "d.csv", ("a",), 1, "a\n1\n", None))
    images.opened.put(img, LoadedImage(img, "alice", "image/png", b"\x89PNG", None))
    ref = DatasetRef(dataset_id=ds, partition=0, offset=0)
    assert datasets.load(ref).csv_text == "a\n1\n"
    assert images.load({"image_id": img, "partition": 0, "offset": 0}).data == b"\x89PNG"
    sealer.erase(ds)
    sealer.erase(img)
    with pytest.raises(DatasetUnavailable, match="KeyErased"):
        datasets.load(ref)
    with pytest.raises(DatasetUnavailable, match="KeyErased"):
        images.load({"image_id": img, "partition": 0, "offset": 0})
    assert ds not in datasets.opened and img not in images.opened


# --- erased through another edge, before this edge's view hears of it -------------------------


def test_a_published_list_skips_a_contribution_erased_elsewhere(tmp_path: Path) -> None:
    # Before: opening its published text raised KeyErased, and the whole list answered 404.
    app, settings = app_for(tmp_path)
    sealer: Sealer = app.state.sealer
    app.state.staff.issues.apply(Envelope(
        record=IssueOpened(issue="iss-1", title="Lights", summary="Out", by="staff-t1", at="t"),
        key="iss-1", source="/t", seq=1, tenant="t1"), 0, 0)
    for c in ("ctb-1", "ctb-2"):
        published = sealer.seal(c, "published", f"words of {c}")
        app.state.staff.contributions.apply(Envelope(
            record=contribution(c, state="published").model_copy(
                update={"published_text": published}), key=c, source="/t", tenant="t1"))
    sealer.erase("ctb-1")  # by another edge: this one has not read ContributionErased yet
    with TestClient(app) as c:
        r = c.get("/issues/iss-1/contributions", headers=as_(settings))
    assert r.status_code == 200, r.text
    assert [p["contribution"] for p in r.json()] == ["ctb-2"]
    assert "ctb-1" not in app.state.staff.contributions


def test_a_chat_stream_ends_when_the_chat_was_erased_elsewhere(tmp_path: Path) -> None:
    app, settings = app_for(tmp_path)
    sealer: Sealer = app.state.sealer
    views = app.state.assistant.conversations
    views.apply(started())
    payload = DisplayPayload(event_id="e1", type="text", channel="response", ts=1.0,
                             data=sealer.seal_json(CONV, "e1/data", {"text": "hi"}))
    views.apply(Envelope(record=AssistantDisplayRecorded(
        conversation=CONV, turn=f"{CONV}:turn-2", display_seq=1, event=payload), key=CONV,
        source="/t", seq=2, tenant="t1"))
    sealer.erase(CONV)  # by another edge
    with TestClient(app) as c:
        r = c.get(f"/api/v1/assistant/conversations/{CONV}/stream", headers=as_(settings))
    assert r.status_code == 200 and "event: display" not in r.text
    assert ": end; no such conversation" in r.text
    assert views[CONV].erased
