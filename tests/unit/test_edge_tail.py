"""The edge's tail with records it cannot use (decision 0008), without a broker: it skips,
logs and counts them, and goes on; the views keep applying the records after them."""

from __future__ import annotations

import asyncio

from api.frame.tail import EdgeTail
from schemas.conversation import ConversationStarted
from streams.envelope import Envelope, encode
from streams.settings import VoiceSettings
from streams.topics import ISSUES

SETTINGS = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", topic_prefix="t.")


def record(seq: int, owner: str = "alice") -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    env = Envelope(record=ConversationStarted(conversation="cnv-1", owner=owner), key="cnv-1",
                   source="/test", seq=seq)
    return encode(env)


def test_a_record_a_view_cannot_apply_is_skipped_counted_and_the_tail_goes_on() -> None:
    applied: list[int] = []

    def on_conversation(env: Envelope) -> None:
        if env.record.owner == "poison":  # type: ignore[attr-defined]
            raise ValueError("impossible content for this view")
        applied.append(env.seq or 0)

    async def go() -> EdgeTail:
        tail = EdgeTail(SETTINGS, on_conversation=on_conversation,
                        more={ISSUES: lambda env: None})
        tail._loop = asyncio.get_running_loop()  # what start() sets; no thread here
        conv = "t.voice.conversations"
        # One poll's records, handed over to the loop at once.
        tail._hand_over([(conv, 0, 0, *record(1)),
                         (conv, 0, 1, b"k", b"\xff", []),             # undecodable
                         (conv, 0, 2, *record(2, owner="poison")),    # the view raises
                         (conv, 0, 3, *record(3))])
        tail._hand_over([("t.voice.issues", 1, 5, b"k", b"\x00", None)])
        tail._hand_over([])                                          # an empty poll: nothing
        await asyncio.sleep(0)
        return tail

    tail = asyncio.run(go())
    assert applied == [1, 3]
    assert tail.skipped_counts() == {
        "t.voice.conversations": {"not applied": 1, "undecodable": 1},
        "t.voice.issues": {"undecodable": 1}}
