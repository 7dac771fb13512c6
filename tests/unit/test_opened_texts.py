"""A worker keeps the transcript entries it opened for a conversation's next turn, and obeys an
erasure as the sealer does (``consumers.conversations.opened``)."""

from __future__ import annotations

import pytest

from consumers.conversations.opened import MAX_READS, LastRead, OpenedTexts
from consumers.conversations.turns import history_of
from schemas.base import Sealed
from schemas.conversation import HistorySummarised, MessageRecorded, ReplyRecorded
from streams.envelope import Envelope
from streams.sealing import KeyErased, MemoryKeyStore, Sealer

CNV = "cnv-0000000000000001"


class CountingSealer(Sealer):
    """A real sealer that counts the blobs it opens."""

    def __init__(self) -> None:
        super().__init__(MemoryKeyStore())
        self.opens = 0

    def open(self, conversation: str, content_id: str, sealed: Sealed) -> bytes:
        self.opens += 1
        return super().open(conversation, content_id, sealed)


def turn(sealer: Sealer, n: int) -> list[Envelope]:
    """Turn ``n``'s message and reply, freshly sealed."""
    return [Envelope(record=MessageRecorded(
                conversation=CNV, message_id=f"m{n}", text=sealer.seal(CNV, f"m{n}", f"ask {n}"),
                at="now"), key=CNV, source="/t", seq=10 * n + 3),
            Envelope(record=ReplyRecorded(
                conversation=CNV, turn=f"t{n}", reply_id=f"r{n}",
                text=sealer.seal(CNV, f"r{n}", f"answer {n}")), key=CNV, source="/t",
                seq=10 * n + 5)]


def conversation(sealer: Sealer, turns: int, summary: bool = False) -> list[Envelope]:
    records = []
    if summary:
        records.append(Envelope(record=HistorySummarised(
            conversation=CNV, turn="t0", summary_id="s", through_seq=1,
            text=sealer.seal(CNV, "s", "earlier")), key=CNV, source="/t", seq=2))
    for n in range(turns):
        records.extend(turn(sealer, n))
    return records


def test_a_later_turn_opens_only_what_is_new() -> None:
    sealer = CountingSealer()
    opened = OpenedTexts(sealer)
    records = conversation(sealer, 5, summary=True)
    first = history_of(sealer, CNV, records, opened=opened)
    assert sealer.opens == 11  # the summary, five messages, five replies
    assert first == history_of(sealer, CNV, records), "the same history as without the cache"
    sealer.opens = 0
    records = [*records, *turn(sealer, 5)]
    history, seqs = history_of(sealer, CNV, records, opened=opened)
    assert sealer.opens == 2
    assert history[-2:] == [{"role": "user", "content": "ask 5"},
                            {"role": "assistant", "content": "answer 5"}]
    assert seqs[-1] == 55


def test_an_erased_conversation_s_kept_texts_are_never_served() -> None:
    sealer = CountingSealer()
    opened = OpenedTexts(sealer)
    records = conversation(sealer, 3)
    history_of(sealer, CNV, records, opened=opened)
    assert len(opened) == 6
    sealer.erase(CNV)  # learnt from the key topic, before the worker reads the erasure record
    with pytest.raises(KeyErased):
        history_of(sealer, CNV, records, opened=opened)
    opened.forget(CNV)  # the erasure record read
    assert len(opened) == 0


def test_the_same_content_id_sealed_again_is_opened_again() -> None:
    sealer = CountingSealer()
    opened = OpenedTexts(sealer)
    first = sealer.seal(CNV, "m", "one")
    second = sealer.seal(CNV, "m", "two")  # another nonce: another blob
    opened.check(CNV)
    assert opened.open(CNV, "m", first) == "one"
    assert opened.open(CNV, "m", second) == "two"
    assert opened.open(CNV, "m", first) == "one" and sealer.opens == 2


def test_the_texts_kept_are_bounded_by_characters_least_recently_used_first() -> None:
    sealer = CountingSealer()
    opened = OpenedTexts(sealer, max_chars=25)
    blobs = {n: sealer.seal(CNV, f"m{n}", str(n) * 10) for n in range(4)}
    opened.check(CNV)
    for n in (0, 1):
        opened.open(CNV, f"m{n}", blobs[n])
    opened.open(CNV, "m0", blobs[0])  # 0 used last: 1 goes first
    opened.open(CNV, "m2", blobs[2])
    assert len(opened) == 2 and sealer.opens == 3
    opened.open(CNV, "m0", blobs[0])
    assert sealer.opens == 3, "0 was kept"
    opened.open(CNV, "m1", blobs[1])
    assert sealer.opens == 4, "1 was dropped"
    big = sealer.seal(CNV, "big", "x" * 26)
    assert opened.open(CNV, "big", big) == "x" * 26 and len(opened) == 2, "over the bound: not kept"


def test_forget_drops_one_conversation_only() -> None:
    sealer = CountingSealer()
    opened = OpenedTexts(sealer)
    other = "cnv-0000000000000002"
    opened.open(CNV, "a", sealer.seal(CNV, "a", "A"))
    opened.open(other, "b", kept := sealer.seal(other, "b", "B"))
    opened.forget(CNV)
    assert len(opened) == 1
    sealer.opens = 0
    assert opened.open(other, "b", kept) == "B" and sealer.opens == 0


def test_open_all_opens_only_what_is_not_kept_and_answers_in_order() -> None:
    sealer = CountingSealer()
    opened = OpenedTexts(sealer, max_chars=30)
    blobs = [(f"m{n}", sealer.seal(CNV, f"m{n}", str(n) * 10)) for n in range(4)]
    opened.check(CNV)
    assert opened.open(CNV, *blobs[1]) == "1" * 10 and sealer.opens == 1
    texts = opened.open_all(CNV, [blobs[0], blobs[1], blobs[2], blobs[0]])
    assert texts == ["0" * 10, "1" * 10, "2" * 10, "0" * 10]
    assert sealer.opens == 4, "1 was kept; 0 (twice in the call) and 2 were opened"
    assert len(opened) == 3
    # Over the bound: the least recently used go first (1 was found first, then 0 and 2 kept).
    assert opened.open_all(CNV, [blobs[3]]) == ["3" * 10] and len(opened) == 3
    sealer.opens = 0
    opened.open_all(CNV, [blobs[0], blobs[2], blobs[3]])
    assert sealer.opens == 0 and opened.open(CNV, *blobs[1]) == "1" * 10 and sealer.opens == 1


def test_a_history_joins_one_role_s_consecutive_entries_as_before() -> None:
    sealer = CountingSealer()
    records = conversation(sealer, 2, summary=True)  # the summary, then m0 (seq 3), r0, m1, r1
    again = Envelope(record=MessageRecorded(
        conversation=CNV, message_id="m0b", text=sealer.seal(CNV, "m0b", "and again"), at="now"),
        key=CNV, source="/t", seq=4)
    records.insert(2, again)
    history, seqs = history_of(sealer, CNV, records, opened=OpenedTexts(sealer))
    assert (history, seqs) == history_of(sealer, CNV, records)
    assert history[0] == {"role": "user", "content":
                          "[CONVERSATION SUMMARY through seq 1]\nearlier\n\nask 0\n\nand again"}
    assert seqs == [4, 5, 13, 15]


def _read(partition: int, first: int, count: int, text: str = "t") -> LastRead:
    positions = [(seq, 100 + seq) for seq in range(first, first + count)]
    return LastRead(partition, positions, ["user"] * count, [f"{text}{s}" for s, _ in positions])


def test_a_last_read_serves_the_positions_it_read_and_only_those() -> None:
    """What the next turn names (older positions dropped, new ones after) is served from
    where it starts; an older turn's positions (a prefix) too; anything else is not."""
    last = _read(0, 1, 5)  # seqs 1..5
    assert last.reuse(0, [(3, 103), (4, 104), (5, 105), (6, 106)]) == (
        ["user"] * 3, ["t3", "t4", "t5"])
    assert last.reuse(0, [(1, 101), (2, 102)]) == (["user"] * 2, ["t1", "t2"])
    assert last.reuse(0, [(6, 106), (7, 107)]) == ([], []), "nothing of it"
    assert last.reuse(1, [(3, 103)]) == ([], []), "another partition"
    assert last.reuse(0, [(3, 999), (4, 104)]) == ([], []), "another offset"
    assert last.reuse(0, [(2, 102), (4, 104)]) == ([], []), "not the same run of positions"
    assert last.reuse(0, []) == ([], [])
    assert last.reuse(0, [[3, 103]]) == ([], []), "a pair of another type (never compared)"  # type: ignore[list-item]


def test_last_reads_are_bounded_and_forgotten_with_their_conversation() -> None:
    texts = OpenedTexts(Sealer(MemoryKeyStore()), max_chars=100)
    texts.keep_read("a", _read(0, 1, 3, "x" * 20))  # ~63 characters
    texts.keep_read("b", _read(0, 1, 1, "y" * 20))
    assert texts.last_read("a") is not None  # now the most recently used
    texts.keep_read("c", _read(0, 1, 1, "z" * 20))
    assert texts.last_read("b") is None, "the least recently used went first"
    assert texts.last_read("a") is not None and texts.last_read("c") is not None
    texts.keep_read("a", _read(0, 1, 1, "w"))  # replaces its own
    assert texts.last_read("a").texts == ["w1"]  # type: ignore[union-attr]
    texts.keep_read("d", _read(0, 1, 6, "v" * 20))  # over the bound alone: not kept
    assert texts.last_read("d") is None
    texts.forget("c")
    assert texts.last_read("c") is None and texts.last_read("a") is not None
    many = OpenedTexts(Sealer(MemoryKeyStore()))
    for n in range(MAX_READS + 5):
        many.keep_read(f"c{n}", _read(0, 1, 1))
    assert many.last_read("c0") is None and many.last_read(f"c{MAX_READS + 4}") is not None
