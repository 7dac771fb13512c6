"""Display events: text deltas coalesced by time, ordering, fields, transient progress."""

from __future__ import annotations

import asyncio

from consumers.engine import DisplayFactory, RecordingSink
from consumers.engine.display import CHANNELS


async def test_text_that_arrives_together_goes_out_together_and_in_order():
    sink = RecordingSink()
    d = DisplayFactory(sink, "t1/a1", "t1", conversation_id="c1", clock=lambda: 12.5)
    body = "".join(f"word{i} " for i in range(100))
    for i in range(0, len(body), 7):  # all within the clock: one slice
        await d.text(body[i:i + 7])
    assert sink.display() == []  # not yet: the clock runs
    await d.reasoning("thinking about it")  # a non-text event flushes what is pending first
    await d.text("tail")
    await d.flush_text()
    events = sink.display()
    assert [e.type for e in events] == ["text_delta", "reasoning", "text_delta"]
    assert [e.data.get("text") for e in events] == [body, "thinking about it", "tail"]
    assert [e.id for e in events] == [f"t1/a1/d{i}" for i in range(1, 4)]
    assert len({e.key for e in sink.effects}) == len(sink.effects)
    assert all(e.conversation_id == "c1" and e.turn_id == "t1" for e in sink.effects)


async def test_a_streamed_piece_goes_out_within_the_clock_without_waiting_for_more():
    sink = RecordingSink()
    d = DisplayFactory(sink, "p", "t", coalesce_s=0.05)
    await d.text("Hel")
    await d.text("lo")
    await asyncio.sleep(0.2)  # no further delta, no flush: the clock emits it
    assert [e.data["text"] for e in sink.display()] == ["Hello"]
    await d.text(" there")  # a new clock for the next piece
    await asyncio.sleep(0.2)
    await d.text("!")
    await d.flush_text()
    assert [e.data["text"] for e in sink.display()] == ["Hello", " there", "!"]


async def test_slices_are_timed_by_the_stream_and_never_longer_than_the_limit():
    sink = RecordingSink()
    d = DisplayFactory(sink, "p", "t", coalesce_s=0.03, max_slice_chars=100)
    for word in ("a" * 10, "b" * 10):
        await d.text(word)
        await asyncio.sleep(0.1)  # slower than the clock: a slice each
    await d.text("c" * 250)  # past the limit: out at once, in limit-sized slices
    assert [e.data["text"] for e in sink.display()] == ["a" * 10, "b" * 10, "c" * 100,
                                                         "c" * 100]
    await d.flush_text()
    assert sink.display()[-1].data["text"] == "c" * 50


async def test_dropped_text_never_goes_out_and_no_clock_is_left_running():
    sink = RecordingSink()
    d = DisplayFactory(sink, "p", "t", coalesce_s=0.02)
    await d.text("a partial attempt")
    assert d.drop_pending_text() == len("a partial attempt")
    await asyncio.sleep(0.1)
    assert sink.display() == [] and d.text_emitted == 0


async def test_a_replay_compares_the_text_of_a_turn_not_how_it_was_sliced():
    from consumers.engine.replay import compare_effects

    runs = []
    for gap in (0.0, 0.06):
        sink = RecordingSink()
        d = DisplayFactory(sink, "p", "t", coalesce_s=0.03, clock=lambda: 1.0)
        for piece in ("one ", "two ", "three"):
            await d.text(piece)
            await asyncio.sleep(gap)
        await d.done(0.0)
        runs.append(sink.effects)
    assert len(runs[0]) != len(runs[1])  # sliced differently ...
    assert compare_effects(runs[0], runs[1]) == []  # ... the same turn
    sink = RecordingSink()
    d = DisplayFactory(sink, "p", "t", clock=lambda: 1.0)
    await d.text("one two thr33")
    await d.done(0.0)
    assert compare_effects(runs[0], sink.effects) != []  # other text: a divergence


async def test_event_fields_and_transient_progress():
    sink = RecordingSink()
    d = DisplayFactory(sink, "p", "turn-9", clock=lambda: 1.0)
    await d.busy("Working")
    await d.tool_call("search_issues", {"query": "lights"}, "toolu_1")
    await d.progress("half way", percent=50.0, group_id="toolu_1")
    await d.tool_result("search_issues", "{}", 12.0, "toolu_1", "ok")
    await d.card("chart", {"x": [1]}, display_id="c1")
    await d.cost(0.01, 100, 20, "claude-sonnet-4-5")
    await d.warning("careful")
    await d.error("broken", kind="X")
    await d.idle()
    await d.text_complete("all done")
    await d.done(0.01, end_reason="end_turn")
    events = sink.display()
    by_type = {e.type: e for e in events}
    assert by_type["progress"].persistent is False
    assert all(e.persistent for e in events if e.type != "progress")
    assert by_type["progress"].data == {"text": "half way", "percent": 50.0}
    assert by_type["tool_call"].data == {"tool": "search_issues", "input": {"query": "lights"},
                                         "tool_use_id": "toolu_1"}
    assert by_type["tool_result"].group_id == "toolu_1"
    assert by_type["card"].display_id == "c1" and by_type["card"].channel == "artifact"
    assert by_type["error"].data == {"text": "broken", "recoverable": False, "kind": "X"}
    assert by_type["done"].data == {"cost": 0.01, "end_reason": "end_turn"}
    for e in events:
        assert e.channel == CHANNELS[e.type] and e.message_id == "turn-9" and e.ts == 1.0
        wire = e.model_dump()
        assert {"id", "type", "channel", "scope", "message_id", "verb", "priority", "data",
                "persistent", "ts", "group_id", "parent_id", "display_id",
                "metadata"} == set(wire)
