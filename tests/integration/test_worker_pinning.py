"""A running worker's threads where ``VOICE_WORKER_PIN_PYTHON`` puts them (decision 0017): its
Python threads on one core, librdkafka's on the others — read from the kernel, not the code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import wait_for

pytestmark = pytest.mark.integration

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def cores_of(text: str) -> frozenset[int]:
    """``Cpus_allowed_list`` (``0-2,5``) as a set."""
    out: set[int] = set()
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return frozenset(out)


def threads_of(pid: int) -> dict[int, tuple[str, frozenset[int]]]:
    """Thread id → (name, the cores it may run on) of process ``pid``."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            status = (task / "status").read_text()
        except OSError:
            continue
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
        found[int(task.name)] = (name, cores_of(line.split(":", 1)[1]))
    return found


@pytest.mark.skipif(len(ALLOWED) < 2, reason="one core: nothing is pinned")
def test_a_workers_python_runs_on_one_core_and_librdkafka_on_the_others(
        start_worker) -> None:  # noqa: ANN001
    core = ALLOWED[-1]
    worker = start_worker(VOICE_WORKER_PIN_PYTHON=str(core))

    def settled() -> dict[int, tuple[str, frozenset[int]]] | None:
        found = threads_of(worker.pid)
        native = [c for n, c in found.values() if n.startswith("rdk:")]
        return found if native and all(c != frozenset(ALLOWED) for _, c in
                                       found.values()) else None

    found = wait_for(settled, timeout=10, what="every thread pinned")
    python = {c for n, c in found.values() if not n.startswith("rdk:")}
    native = {c for n, c in found.values() if n.startswith("rdk:")}
    assert python == {frozenset({core})}, found
    assert native == {frozenset(ALLOWED) - {core}}, found
    assert worker.poll() is None


@pytest.mark.skipif(len(ALLOWED) < 2, reason="one core: nothing is pinned")
def test_off_leaves_every_thread_where_the_process_may_run(start_worker) -> None:  # noqa: ANN001
    worker = start_worker(VOICE_WORKER_PIN_PYTHON="off")
    found = threads_of(worker.pid)
    assert any(n.startswith("rdk:") for n, _ in found.values())
    assert {c for _, c in found.values()} == {frozenset(ALLOWED)}, found


def test_a_core_the_worker_may_not_use_stops_it_at_start_naming_the_setting(
        settings, tmp_path: Path) -> None:  # noqa: ANN001
    from deploy.processes import spawn_voice, stop

    log = tmp_path / "worker.log"
    proc = spawn_voice(settings, "worker", log=log, VOICE_WORKER_PIN_PYTHON="4096")
    try:
        assert proc.wait(timeout=60) != 0
    finally:
        stop(proc)  # a worker that did not stop is not left running
    assert "VOICE_WORKER_PIN_PYTHON=4096" in log.read_text()
