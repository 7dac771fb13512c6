"""What the edge does for every request and every event, held to its shape: the dependency
tree FastAPI solves for a message's POST, and an event's frame (docs/benchmarks.md, "Issue 14,
thirty-fifth pass").

FastAPI solves every node of a route's dependency tree on every request — a cached
dependency's sub-tree again at each place it is named — at ~7 µs a node on an idle core, and a
dependency with an exit costs an exit stack's entry and leave besides. So the trees are
measured here by what they hold, not by time."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.sse import ServerSentEvent, format_sse_event

from api.app import create_app
from api.frame.deps import get_principal
from api.frame.sse import event_frame_bytes, sse_frame
from tests.unit.test_edge_input import api_routes


def _nodes(d: Dependant) -> Iterator[Dependant]:
    for sub in d.dependencies:
        yield sub
        yield from _nodes(sub)


def _has_exit(d: Dependant) -> bool:
    return inspect.isasyncgenfunction(d.call) or inspect.isgeneratorfunction(d.call)


def _route(method: str, path: str) -> APIRoute:
    found = [r for r in api_routes(create_app().routes) if r.path == path and method in r.methods]
    assert len(found) == 1, f"{method} {path}: {len(found)} routes"
    return found[0]


def test_a_messages_post_solves_fourteen_dependency_nodes_and_none_with_an_exit() -> None:
    route = _route("POST", "/me/conversations/{conversation}/messages")
    nodes = list(_nodes(route.dependant))
    # 22 before: the quota's admission (an exit, and the principal's sub-tree once more), the
    # owner check's projection and sealer, the commands' settings, producer and tail.
    assert len(nodes) == 14, [getattr(n.call, "__qualname__", n.call) for n in nodes]
    assert sum(n.call is get_principal for n in nodes) == 3
    assert not any(_has_exit(n) for n in nodes)


def test_a_stream_still_holds_its_slot_through_a_dependency_with_an_exit() -> None:
    route = _route("GET", "/me/conversations/{conversation}/stream")
    assert any(_has_exit(n) for n in _nodes(route.dependant)), \
        "the stream's slot is released when its response ends: a dependency with an exit"


FRAMES = [
    ('{"seq":5,"state":"Replied"}', "turn", "5"),
    ('{"text":"naïve — ✓ \\u2028"}', "message", "12"),
    ("", "message", "1"),
    ("line one\nline two", "delta", None),
    ("a\r\nb\rc\n", "x", "3"),
    ("\n", None, None),
    (None, "ping", None),
    ('{"n":1}', None, "7"),
    (None, None, None),
]


@pytest.mark.parametrize(("data", "event", "id_"), FRAMES)
def test_an_events_frame_is_the_bytes_fastapi_frames(data: str | None, event: str | None,
                                                     id_: str | None) -> None:
    expected = format_sse_event(data_str=data, event=event, id=id_)
    assert event_frame_bytes(data, event, id_) == expected
    sse = ServerSentEvent(event=event, id=id_, raw_data=data)
    assert sse_frame(sse) == expected


def test_a_frame_with_retry_or_a_comment_is_framed_by_fastapi() -> None:
    sse = ServerSentEvent(event="e", id="1", raw_data="x", retry=1500, comment="hi\nthere")
    assert sse_frame(sse) == format_sse_event(data_str="x", event="e", id="1", retry=1500,
                                              comment="hi\nthere")
