"""Display events: coalescing of text deltas, ordering, fields, transient progress."""

from __future__ import annotations

from consumers.engine import DisplayFactory, RecordingSink
from consumers.engine.display import CHANNELS


async def test_text_deltas_are_coalesced_into_500_char_slices_in_order():
    sink = RecordingSink()
    d = DisplayFactory(sink, "t1/a1", "t1", conversation_id="c1", clock=lambda: 12.5)
    body = "".join(f"word{i} " for i in range(250))  # ~1.7k chars
    for i in range(0, len(body), 7):
        await d.text(body[i:i + 7])
    assert [len(e.data["text"]) for e in sink.display()] == [500, 500, 500]
    await d.reasoning("thinking about it")  # a non-text event flushes what is pending first
    await d.text("tail")
    await d.flush_text()
    events = sink.display()
    assert [e.type for e in events] == ["text_delta"] * 4 + ["reasoning", "text_delta"]
    assert "".join(e.data["text"] for e in events if e.type == "text_delta") == body + "tail"
    assert len(events[3].data["text"]) == len(body) - 1500
    assert [e.id for e in events] == [f"t1/a1/d{i}" for i in range(1, 7)]
    assert len({e.key for e in sink.effects}) == len(sink.effects)
    assert all(e.conversation_id == "c1" and e.turn_id == "t1" for e in sink.effects)


async def test_slices_do_not_depend_on_how_the_model_chunked_its_deltas():
    body = "x" * 1234
    shapes = []
    for size in (1, 13, 499, 1234):
        sink = RecordingSink()
        d = DisplayFactory(sink, "p", "t")
        for i in range(0, len(body), size):
            await d.text(body[i:i + size])
        await d.flush_text()
        shapes.append([len(e.data["text"]) for e in sink.display()])
    assert shapes == [[500, 500, 234]] * 4


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
