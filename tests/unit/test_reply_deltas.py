"""A participant turn's streamed reply: what the worker shows while the model writes
(``consumers.conversations.deltas``) and how an edge's view holds it until the log completes
the turn (``api.conversations.views``)."""

from __future__ import annotations

from api.conversations.views import ConversationViews
from consumers.conversations.deltas import ReplyStream, ShownText
from consumers.engine import RecordingSink
from consumers.engine.display import DisplayFactory
from schemas.base import Sealed
from schemas.conversation import (
    ConversationStarted,
    ReplyDelta,
    ReplyRecorded,
    TurnStateChanged,
)
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer


def shown(*pieces: str) -> list[str]:
    t = ShownText()
    return [t.add(p) for p in pieces]


def test_text_before_the_proposal_fence_is_shown_once_and_the_fence_never():
    assert shown("Thank you. ", "The lights `are` out", "`", "``json\n{\"concerns\"", "]}") == [
        "Thank you. ", "The lights `are` out", "", "", ""]
    t = ShownText()
    t.add("Noted.\n\n```json {}```")
    assert t.shown() == "Noted."


def test_a_refusal_is_never_shown_not_even_while_it_may_still_become_one():
    assert shown("COULD", "_NOT_INTER", "PRET: it was about") == ["", "", ""]
    assert shown("COU", "LD you help") == ["", "COULD you help"]  # it did not become one
    assert shown("  COULD_NOT_INTERPRET: x") == [""]


class Publisher:
    def __init__(self) -> None:
        self.sent: list[tuple[object, Envelope]] = []

    async def send(self, spec: object, env: Envelope) -> None:
        self.sent.append((spec, env))


async def test_the_stream_seals_each_shown_piece_with_its_offset_and_restarts_on_fallback():
    sealer = Sealer(MemoryKeyStore())
    pub, inner = Publisher(), RecordingSink()
    stream = ReplyStream(inner, pub, sealer, "cnv-1", "cnv-1:turn-2", "t1")  # type: ignore[arg-type]
    d = DisplayFactory(stream, "p", "cnv-1:turn-2", "cnv-1", coalesce_s=0)
    await d.text("Hello ")
    await d.text("there")
    await d.warning("model a is overloaded; trying b", discard_partial=True)
    await d.text("Hi")
    await stream.drain()
    deltas = [env.record for _, env in pub.sent]
    assert all(isinstance(r, ReplyDelta) for r in deltas)
    assert [(r.attempt, r.offset) for r in deltas] == [(1, 0), (1, 6), (2, 0)]
    texts = [sealer.open_text("cnv-1", ReplyDelta.content_id(r.turn, r.attempt, r.offset), r.text)
             for r in deltas]
    assert texts == ["Hello ", "there", "Hi"]
    assert all(env.key == "cnv-1" and env.tenant == "t1" and env.seq is None
               for _, env in pub.sent)
    assert len(inner.display("text_delta")) == 3  # every effect still goes on


SEALED = Sealed(key_version=1, nonce="AAAAAAAAAAAAAAAA", ciphertext="AAAA")


def env(rec: object, seq: int | None = None, tenant: str = "t1") -> Envelope:
    return Envelope(record=rec, key="cnv-1", source="/t", seq=seq, tenant=tenant)


def delta(turn: str = "cnv-1:turn-2", offset: int = 0, tenant: str = "t1") -> Envelope:
    return env(ReplyDelta(conversation="cnv-1", turn=turn, attempt=1, offset=offset,
                          text=SEALED), tenant=tenant)


def test_a_view_holds_deltas_until_the_turn_is_complete_and_drops_late_or_foreign_ones():
    views = ConversationViews()
    views.apply_delta(delta())  # unknown conversation: dropped
    views.apply(env(ConversationStarted(conversation="cnv-1", owner="alice"), seq=1))
    view = views.by_key["cnv-1"]
    views.apply_delta(delta())
    views.apply_delta(delta(offset=5))
    views.apply_delta(delta(tenant="t2"))  # another tenant's: dropped
    views.apply_delta(delta(turn="cnv-1:turn-9"))
    assert [d.record.offset for _, d in view.live_after(0)] == [0, 5, 0]
    assert [n for n, _ in view.live_after(2)] == [3]
    views.apply(env(ReplyRecorded(conversation="cnv-1", turn="cnv-1:turn-2", reply_id="r",
                                  text=SEALED), seq=2))
    assert [d.record.turn for _, d in view.live_after(0)] == ["cnv-1:turn-9"]
    views.apply_delta(delta())  # late: its turn has its reply
    views.apply(env(TurnStateChanged(conversation="cnv-1", turn="cnv-1:turn-9",
                                     state="CouldNotInterpret"), seq=3))
    assert view.live_after(0) == []
    views.apply_delta(delta(turn="cnv-1:turn-9"))
    assert view.live_after(0) == []
