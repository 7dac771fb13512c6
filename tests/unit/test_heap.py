"""The garbage collector of a long-running process (``streams.heap.settle_heap``): what a worker,
an edge or a telemetry sink holds once built is frozen out of later collections."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from streams.heap import settle_heap


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """Each test starts and ends with nothing frozen and no watch of this process's
    collections (``settle_heap`` installs one): the rest of the suite collects as Python does."""
    from streams.heap import WATCH

    gc.unfreeze()
    yield
    gc.unfreeze()
    while WATCH in gc.callbacks:
        gc.callbacks.remove(WATCH)


def _tracked(obj: object) -> bool:
    """Whether a collection walks ``obj`` (``gc.get_objects`` lists what it tracks)."""
    return any(o is obj for o in gc.get_objects())


def test_what_is_alive_is_frozen_and_what_comes_after_is_collected_as_before() -> None:
    kept = [[i] for i in range(1000)]  # alive when the heap settles
    assert _tracked(kept[0])
    settle_heap()
    assert gc.get_freeze_count() >= len(kept)
    assert not _tracked(kept[0])
    made_after = [0]
    assert _tracked(made_after)


def test_the_edge_settles_its_heap_once_built_before_it_serves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    from deploy import cli

    seen: dict[str, Any] = {}
    monkeypatch.setenv("VOICE_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(
        frozen=gc.get_freeze_count(), app_frozen=not _tracked(app)))
    monkeypatch.setattr(cli, "configure_tracing", lambda name: None)
    cli.edge(host="127.0.0.1", port=1)
    assert seen["frozen"] > 0
    assert seen["app_frozen"]  # the app it serves was built before


def test_the_worker_settles_its_heap_once_built_before_it_runs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from consumers import app as worker_app
    from streams.settings import VoiceSettings

    seen: dict[str, Any] = {}
    built = types.SimpleNamespace(app=None)

    class FakeFaustWorker:
        def __init__(self, app: Any, **kw: Any) -> None:
            self.spinner = object()

        def execute_from_commandline(self) -> None:
            seen.update(frozen=gc.get_freeze_count(), built_frozen=not _tracked(built))

    monkeypatch.setitem(sys.modules, "faust.worker",
                        types.SimpleNamespace(Worker=FakeFaustWorker))
    monkeypatch.setattr(worker_app, "create_worker", lambda settings, client=None: built)
    monkeypatch.setattr(worker_app, "declare_changelogs", lambda w: None)
    worker_app.run_worker(VoiceSettings(kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path))
    assert seen["frozen"] > 0
    assert seen["built_frozen"]


def test_a_long_full_collection_is_logged_with_what_it_walked(
        caplog: pytest.LogCaptureFixture) -> None:
    from streams.heap import FullCollections

    ticks = iter([0.0, 10.0, 10.2, 20.0, 20.01])  # made at 0
    watch = FullCollections(over_ms=50, clock=lambda: next(ticks))
    watch("start", {"generation": 0})  # young collections are not timed
    watch("stop", {"generation": 0})
    with caplog.at_level("WARNING", logger="streams.heap"):
        watch("start", {"generation": 2})
        watch("stop", {"generation": 2})  # 200 ms: logged
        watch("start", {"generation": 2})
        watch("stop", {"generation": 2})  # 10 ms: counted, not logged
    assert watch.count == 2
    assert watch.longest_ms == pytest.approx(200)
    assert watch.total_ms == pytest.approx(210)
    [line] = [r.getMessage() for r in caplog.records]
    assert "stopped this process for 200 ms" in line
    assert "objects" in line


def test_settle_heap_times_full_collections_once() -> None:
    from streams.heap import WATCH

    settle_heap()
    settle_heap()
    assert gc.callbacks.count(WATCH) == 1
    before = WATCH.count
    gc.collect()
    assert WATCH.count == before + 1


class _Node:
    """An object in a reference cycle with itself (only a collection frees it)."""

    def __init__(self) -> None:
        self.me = self


@contextlib.contextmanager
def _installed(watch: Any) -> Iterator[None]:
    gc.callbacks.append(watch)
    try:
        yield
    finally:
        gc.callbacks.remove(watch)


def test_what_survives_a_full_collection_is_frozen_and_later_ones_walk_only_what_came_after(
        ) -> None:
    from streams.heap import FullCollections

    watch = FullCollections(freeze_survivors=True, whole_walk_s=3600)
    with _installed(watch):
        held = [[i] for i in range(100)]
        gc.collect()
        assert not _tracked(held[0])  # survived, frozen: no later collection walks it
        after = [0]
        assert _tracked(after)
        frozen = gc.get_freeze_count()
        del held  # frozen objects are still freed by their reference counts
        assert gc.get_freeze_count() <= frozen - 100


def test_a_cycle_among_frozen_objects_is_freed_by_the_next_whole_walk() -> None:
    import weakref

    from streams.heap import FullCollections

    now = [0.0]
    watch = FullCollections(freeze_survivors=True, whole_walk_s=600, clock=lambda: now[0])
    with _installed(watch):
        node = _Node()
        gone = weakref.ref(node)
        gc.collect()  # it survives: frozen
        del node
        gc.collect()
        assert gone() is not None  # a frozen cycle waits for the whole walk
        now[0] = 601.0
        gc.collect()  # the whole walk: everything unfrozen first
        assert gone() is None
        assert watch.whole_walks == 1
        kept = [1]
        gc.collect()  # and what survives it is frozen again
        assert not _tracked(kept)


def test_without_freezing_survivors_a_full_collection_walks_everything_as_python_does(
        ) -> None:
    import weakref

    from streams.heap import FullCollections

    watch = FullCollections(freeze_survivors=False)
    with _installed(watch):
        node = _Node()
        gone = weakref.ref(node)
        gc.collect()
        assert _tracked(node)
        del node
        gc.collect()
        assert gone() is None


def _run_idle_collector(busy_at: Any, counts: Any, collect: Any, for_s: float = 0.15) -> None:
    from streams.heap import collect_when_idle

    async def go() -> None:
        task = asyncio.create_task(collect_when_idle(busy_at, idle_s=0.05, every_s=0.01,
                                                     counts=counts, collect=collect))
        await asyncio.sleep(for_s)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(go())


def test_an_idle_process_runs_its_full_collection_while_nothing_waits() -> None:
    collected: list[float] = []
    due = [3]  # middle collections since the last full one

    def collect() -> None:
        collected.append(time.monotonic())
        due[0] = 0  # a full collection resets the count, as Python's does

    _run_idle_collector(lambda: 0.0, lambda: (0, 0, due[0]), collect)
    assert len(collected) == 1  # once: nothing more could have reached the oldest generation


def test_a_busy_process_or_one_with_nothing_new_is_left_to_python() -> None:
    collected: list[int] = []
    _run_idle_collector(time.monotonic, lambda: (0, 0, 5), lambda: collected.append(1))
    assert collected == []  # busy: its last work ended less than idle_s ago
    _run_idle_collector(lambda: 0.0, lambda: (0, 0, 0), lambda: collected.append(1))
    assert collected == []  # idle, but no middle collection since the last full one
    gc.disable()
    try:
        _run_idle_collector(lambda: 0.0, lambda: (0, 0, 5), lambda: collected.append(1))
    finally:
        gc.enable()
    assert collected == []  # the collector is off: so is this


def test_the_idle_collection_is_a_real_full_collection_its_watch_sees() -> None:
    from streams.heap import WATCH

    settle_heap()
    before = WATCH.count
    gc.collect(1)  # a middle collection: a full one may now have something new to walk
    assert gc.get_count()[2] > 0
    ran: list[int] = []

    def collect() -> None:
        ran.append(WATCH.count)
        gc.collect()

    _run_idle_collector(lambda: 0.0, gc.get_count, collect, for_s=0.3)
    assert ran and ran[0] == before  # the idle collector's own, not one Python ran
    assert WATCH.count > before  # a full collection, timed and its survivors frozen


def test_the_edge_collects_while_idle_the_app_of_a_test_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    import uvicorn

    import api.app
    from deploy import cli

    seen: dict[str, Any] = {}
    real = api.app.create_app
    monkeypatch.setenv("VOICE_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setattr(api.app, "create_app",
                        lambda *a, **kw: seen.update(kw) or real(*a, **kw))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    monkeypatch.setattr(cli, "configure_tracing", lambda name: None)
    cli.edge(host="127.0.0.1", port=1)
    assert seen["idle_collections"] is True
    assert inspect.signature(real).parameters["idle_collections"].default is False
