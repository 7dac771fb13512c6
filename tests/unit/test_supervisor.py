"""``voice up`` keeps its children running: a child that exits is started again after a backoff,
and one that keeps dying stops the whole stack (issue 12: one crashed worker was the end of
every process)."""

from __future__ import annotations

from typing import Any

from deploy.supervisor import Restarts, announce_ready, watch


class FakeProc:
    def __init__(self, name: str, alive: bool = True) -> None:
        self.name, self.returncode = name, None if alive else -9

    def poll(self) -> int | None:
        return self.returncode

    def die(self, code: int = -9) -> None:
        self.returncode = code


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


def test_backoff_doubles_and_the_limit_is_per_window() -> None:
    r = Restarts(limit=3, window_s=60)
    assert [r.next_start(t) for t in (0, 1, 2)] == [0.5, 2.0, 4.0]
    assert r.next_start(3) is None             # a fourth death within the window: broken
    assert r.next_start(60.5) == 60.5 + 2.0    # the oldest left the window: one more chance


def test_a_dead_child_is_started_again_and_the_others_are_untouched() -> None:
    started: list[str] = []
    worker, edge = FakeProc("worker"), FakeProc("edge")
    children: dict[str, Any] = {"worker": worker, "edge": edge}

    def spawn(name: str) -> Any:
        def start() -> FakeProc:
            started.append(name)
            return FakeProc(name)
        return start

    worker.die()
    ticks = iter(range(40))
    code = watch(children, {"worker": spawn("worker"), "edge": spawn("edge")},
                 {n: Restarts(limit=2, window_s=60) for n in children},
                 stopping=lambda: next(ticks) >= 39, clock=Clock(), tick=0)
    assert code == 0 and started == ["worker"]
    assert children["worker"] is not worker and children["edge"] is edge


def test_a_child_that_keeps_dying_stops_everything_with_its_code() -> None:
    children: dict[str, Any] = {"worker": FakeProc("worker", alive=False)}
    ticks = iter(range(500))
    code = watch(children, {"worker": lambda: FakeProc("worker", alive=False)},
                 {"worker": Restarts(limit=2, window_s=60)},
                 stopping=lambda: next(ticks) >= 499, clock=Clock(), tick=0)
    assert code == -9


def test_ready_is_announced_once_the_stack_answers(capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr("deploy.supervisor.READY_POLL_S", 0)
    answers = iter(["the edge", "the edge", ""])
    assert announce_ready(None, stopping=lambda: False, clock=Clock(),  # type: ignore[arg-type]
                          waits_for=lambda: next(answers))
    out = capsys.readouterr().out
    assert out.count("voice up: ready in") == 1 and "commands topic" in out


def test_a_long_wait_says_what_it_waits_for_once_each(capsys: Any, monkeypatch: Any) -> None:
    """A worker reading a grown changelog back kept the stack unready for minutes, silently."""
    monkeypatch.setattr("deploy.supervisor.READY_POLL_S", 0)
    answers = iter(["the edge"] * 3 + ["the worker's tables"] * 20 + [""])
    clock = Clock()
    assert announce_ready(None, stopping=lambda: False, clock=clock,  # type: ignore[arg-type]
                          waits_for=lambda: next(answers))
    lines = capsys.readouterr().out.splitlines()
    waits = [line for line in lines if "not ready yet" in line]
    assert len(waits) == 1 and "the worker's tables" in waits[0], lines
    assert lines[-1].startswith("voice up: ready in")


def test_nothing_is_announced_when_stopped_first(capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr("deploy.supervisor.READY_POLL_S", 0)
    stops = iter([False, True])
    assert not announce_ready(None, stopping=lambda: next(stops),  # type: ignore[arg-type]
                              clock=Clock(), waits_for=lambda: "the edge")
    assert "ready" not in capsys.readouterr().out
