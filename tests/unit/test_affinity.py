"""A worker's Python threads on one core, librdkafka's on the others (``streams.affinity``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.affinity import Split, ThreadPinning, split


def test_auto_takes_a_core_by_the_process_id_and_leaves_the_rest_to_librdkafka() -> None:
    assert split("auto", {0, 1}, pid=10) == Split(python=frozenset({0}), native=frozenset({1}))
    assert split("auto", {0, 1}, pid=11) == Split(python=frozenset({1}), native=frozenset({0}))
    assert split(" AUTO ", [4, 6, 5], pid=7) == Split(python=frozenset({5}),
                                                      native=frozenset({4, 6}))


def test_a_core_number_is_taken_as_given() -> None:
    assert split("3", {0, 1, 2, 3}, pid=1) == Split(python=frozenset({3}),
                                                    native=frozenset({0, 1, 2}))


def test_nothing_is_pinned_when_off_or_with_one_core() -> None:
    assert split("off", {0, 1}, pid=1) is None
    assert split("auto", {0}, pid=1) is None
    assert split("0", {0}, pid=1) is None


def test_a_core_not_allowed_or_a_bad_value_is_refused_with_the_setting_named() -> None:
    with pytest.raises(ValueError, match=r"VOICE_WORKER_PIN_PYTHON=5: .* cores \[0, 1\] only"):
        split("5", {0, 1}, pid=1)
    with pytest.raises(ValueError, match="VOICE_WORKER_PIN_PYTHON must be off, auto or"):
        split("half", {0, 1}, pid=1)


def tasks(root: Path, names: dict[int, str]) -> Path:
    for tid, name in names.items():
        (root / str(tid)).mkdir(parents=True, exist_ok=True)
        (root / str(tid) / "comm").write_text(name + "\n")
    return root


def test_each_thread_is_pinned_once_by_its_name_and_later_ones_at_the_next_look(
        tmp_path: Path) -> None:
    pins: list[tuple[int, frozenset[int]]] = []
    root = tasks(tmp_path, {100: "python", 101: "rdk:main", 102: "rdk:broker1", 103: "python"})
    pinning = ThreadPinning(Split(python=frozenset({0}), native=frozenset({1, 2})), tasks=root,
                            pin=lambda tid, cores: pins.append((tid, cores)))
    assert pinning.scan() == 4
    assert sorted(pins) == [(100, {0}), (101, {1, 2}), (102, {1, 2}), (103, {0})]
    assert pinning.scan() == 0  # nothing new: nothing pinned again
    tasks(root, {104: "rdk:broker2"})  # a client made later
    assert pinning.scan() == 1 and pins[-1] == (104, {1, 2})


def test_an_ended_threads_id_is_forgotten_so_a_new_thread_given_it_is_pinned(
        tmp_path: Path) -> None:
    import shutil

    pins: list[tuple[int, frozenset[int]]] = []
    root = tasks(tmp_path, {100: "python", 101: "python"})
    pinning = ThreadPinning(Split(python=frozenset({0}), native=frozenset({1})), tasks=root,
                            pin=lambda tid, cores: pins.append((tid, cores)))
    assert pinning.scan() == 2
    shutil.rmtree(root / "101")  # ended
    assert pinning.scan() == 0 and pinning.pinned == {100}
    tasks(root, {101: "rdk:broker1"})  # its id given to a librdkafka thread
    assert pinning.scan() == 1 and pins[-1] == (101, {1})


def test_a_thread_gone_or_not_movable_is_skipped_and_tried_again(tmp_path: Path) -> None:
    refused = {101}
    pins: list[int] = []

    def pin(tid: int, cores: frozenset[int]) -> None:  # noqa: ARG001
        if tid in refused:
            raise PermissionError("not ours")
        pins.append(tid)

    root = tasks(tmp_path, {100: "python", 101: "rdk:main"})
    (root / "102").mkdir()  # no comm: gone between the listing and the read
    pinning = ThreadPinning(Split(python=frozenset({0}), native=frozenset({1})), tasks=root,
                            pin=pin)
    assert pinning.scan() == 1 and pins == [100]
    refused.clear()
    assert pinning.scan() == 1 and pins == [100, 101]


def test_a_stack_on_one_host_gives_its_workers_the_allowed_cores_in_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from deploy.processes import pinned_worker_env

    monkeypatch.delenv("VOICE_WORKER_PIN_PYTHON", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {1, 0})
    assert [pinned_worker_env(i) for i in range(3)] == [
        {"VOICE_WORKER_PIN_PYTHON": "0"}, {"VOICE_WORKER_PIN_PYTHON": "1"},
        {"VOICE_WORKER_PIN_PYTHON": "0"}]
    monkeypatch.setenv("VOICE_WORKER_PIN_PYTHON", "off")  # the operator's word wins
    assert pinned_worker_env(0) == {}
    monkeypatch.delenv("VOICE_WORKER_PIN_PYTHON")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {3})  # one core: nothing
    assert pinned_worker_env(0) == {}
