"""Learning per tenant (issue 13, point 6; seed 000 §11): the pattern library keeps the
extracted patterns of each tenant's conversations, offers them to the tenant's other
conversations only, never shares a provisional pattern or one of an isolated turn, forgets an
erased conversation's, and ranks with the issue catalog's BM25, saying why each was chosen."""

from __future__ import annotations

from consumers.assistant.agent import state_text
from consumers.assistant.library import PatternLibrary
from consumers.assistant.patterns import Pattern, rank
from schemas.assistant import AssistantPatternRecorded, AssistantTurnRequested, ChatOptions
from schemas.base import Record, Sealed
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer

LESSON = ("Questions about RCRA facilities by state: filter the facilities dataset on the "
          "state column, then display_map with the latitude and longitude columns.")


def on_log(record: Record, conversation: str, seq: int, tenant: str) -> Envelope:
    return Envelope(record=record, key=conversation, source="/test", subject=conversation,
                    seq=seq, tenant=tenant, id=f"{conversation}-{seq}", correlation=conversation)


def learned(sealer: Sealer, conversation: str, turn_n: int, text: str, tenant: str = "T",
            stage: str = "extracted") -> Envelope:
    turn = f"{conversation}:turn-{turn_n}"
    pid = f"{turn}:pattern-{stage}"
    rec = AssistantPatternRecorded(conversation=conversation, turn=turn, pattern_id=pid,
                                   stage=stage,  # type: ignore[arg-type]
                                   text=sealer.seal_json(conversation, pid, {
                                       "text": text, "keywords": []}))
    return on_log(rec, conversation, turn_n + 10, tenant)


def requested(conversation: str, turn_n: int, isolated: bool, tenant: str = "T") -> Envelope:
    rec = AssistantTurnRequested(conversation=conversation, turn=f"{conversation}:turn-{turn_n}",
                                 message_id="m", request=Sealed(key_version=1, nonce="bg==",
                                                                ciphertext="Yw=="),
                                 options=ChatOptions(data_isolation=isolated), after=0, at="now")
    return on_log(rec, conversation, turn_n, tenant)


def test_a_pattern_learned_in_one_conversation_is_offered_to_the_tenants_others() -> None:
    sealer = Sealer(MemoryKeyStore())
    library = PatternLibrary(sealer, kept=10)
    library.apply(requested("cnv-a", 2, isolated=False))
    library.apply(learned(sealer, "cnv-a", 2, LESSON))
    library.apply(learned(sealer, "cnv-a", 2, "Asked: RCRA sites", stage="provisional"))
    library.apply(learned(sealer, "cnv-u", 2, "RCRA facilities lesson of U", tenant="U"))

    offered = library.shared("T", "cnv-b")
    assert [(p.pattern_id, p.conversation) for p in offered] == [
        ("cnv-a:turn-2:pattern-extracted", "cnv-a")]  # not the provisional one, not U's
    assert library.shared("T", "cnv-a") == []  # its own come from its log, not from here
    assert [p.conversation for p in library.shared("U", "cnv-b")] == ["cnv-u"]
    assert library.shared("V", "cnv-b") == []


def test_an_isolated_turn_teaches_nothing_and_the_library_is_bounded() -> None:
    sealer = Sealer(MemoryKeyStore())
    library = PatternLibrary(sealer, kept=2)
    library.apply(requested("cnv-a", 2, isolated=True))
    library.apply(learned(sealer, "cnv-a", 2, LESSON))
    assert library.shared("T", "cnv-b") == []
    for n in (4, 6, 8):
        library.apply(learned(sealer, "cnv-a", n, f"lesson {n}"))
    assert [p.text for p in library.shared("T", "cnv-b")] == ["lesson 6", "lesson 8"]


def test_an_erased_conversation_is_forgotten_when_one_of_its_patterns_is_chosen() -> None:
    sealer = Sealer(MemoryKeyStore())
    library = PatternLibrary(sealer, kept=10)
    library.apply(learned(sealer, "cnv-a", 2, LESSON))
    library.apply(learned(sealer, "cnv-a", 4, "another lesson"))
    late = learned(sealer, "cnv-a", 6, "a lesson recorded before the erasure, read after")
    (first, _) = library.shared("T", "cnv-b")
    assert library.still_open("T", first)
    sealer.erase("cnv-a")
    assert not library.still_open("T", first)
    assert library.shared("T", "cnv-b") == []
    library.apply(late)  # its key is gone: nothing to learn from it
    assert library.shared("T", "cnv-b") == []


def test_patterns_are_ranked_by_bm25_and_say_why() -> None:
    own = [Pattern("own-p", "cnv-b:turn-2", "provisional", "Asked: rainfall per county",
                   ("rainfall", "county"), 5)]
    elsewhere = [Pattern("a-p", "cnv-a:turn-2", "extracted", LESSON, (), 12,
                         conversation="cnv-a"),
                 Pattern("c-p", "cnv-c:turn-4", "extracted", "Bus timetables: join on stop id",
                         (), 3, conversation="cnv-c")]
    chosen = rank([*own, *elsewhere], "Which RCRA facilities in Texas are near rivers?",
                  conversation="cnv-b")
    assert [s.pattern_id for s in chosen] == ["a-p"]
    (why,) = chosen
    assert why.elsewhere and why.score > 0 and set(why.matched) == {"rcra", "facility"}
    state = state_text({"message": "x"}, {}, chosen)
    assert "[SUGGESTED CONTEXT]" in state and LESSON in state
    assert "another conversation; matched: rcra, facility; BM25 " in state

    mine = rank([*own, *elsewhere], "rainfall by county", conversation="cnv-b")
    assert [s.pattern_id for s in mine] == ["own-p"] and not mine[0].elsewhere
    assert "this conversation, turn-2; matched: rainfall, county" in state_text(
        {"message": "x"}, {}, mine)
