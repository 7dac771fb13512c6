"""A worker's ready file (``VOICE_WORKER_READY_FILE``) exists only while it handles records:
``voice up`` printed its ready line while the worker was still reading a grown changelog back,
and the README's first request answered 503 (``docs/benchmarks.md``, issue 14, thirteenth
pass)."""

from __future__ import annotations

import asyncio
import types
from pathlib import Path

from consumers.frame.readiness import ReadyFile, faust_ready


def app(completed: bool, rebalancing: bool = False, recovering: bool = False) -> object:
    done = asyncio.Event()
    if completed:
        done.set()
    recovery = types.SimpleNamespace(completed=done, in_recovery=recovering)
    return types.SimpleNamespace(tables=types.SimpleNamespace(recovery=recovery),
                                 rebalancing=rebalancing)


def test_ready_only_after_a_recovery_and_outside_a_rebalance() -> None:
    assert not faust_ready(app(completed=False)), "starting: no recovery finished yet"
    assert faust_ready(app(completed=True))
    assert not faust_ready(app(completed=True, rebalancing=True))
    assert not faust_ready(app(completed=True, recovering=True)), "taking partitions over"


def test_the_file_follows_the_state_and_a_stale_one_is_gone_at_start(tmp_path: Path) -> None:
    path = tmp_path / "run" / "worker.ready"
    path.parent.mkdir()
    path.write_text("1\n")  # left by a worker that was killed
    shown = ReadyFile(path)
    assert not path.exists(), "a new worker is not ready because its predecessor was"
    shown.show(False)
    assert not path.exists()
    shown.show(True)
    assert path.read_text().strip().isdigit()
    assert not list(path.parent.glob(".*")), "written whole, through a temporary name"
    shown.show(False)
    assert not path.exists(), "a rebalance makes it not ready again"
    shown.show(True)
    shown.close()
    assert not path.exists(), "a stopped worker is not ready"


def test_a_missing_folder_is_made(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "worker.ready"
    ReadyFile(path).show(True)
    assert path.exists()


def test_a_path_it_cannot_write_is_logged_once_and_never_raises(tmp_path: Path,
                                                                caplog: object) -> None:
    """A careless setting (a folder where the file should be, a read-only place) must not stop
    the worker's timer, and so the worker: it is logged and never shown ready."""
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a folder")
    shown = ReadyFile(blocker / "worker.ready")  # its parent is a file
    for _ in range(3):
        shown.show(True)
        shown.show(False)
    assert not (blocker / "worker.ready").exists()
    shown.close()  # the worker's shutdown: nothing raised there either
    errors = [r for r in caplog.records if r.levelname == "ERROR"]  # type: ignore[attr-defined]
    assert len(errors) == 1 and "VOICE_WORKER_READY_FILE" in errors[0].getMessage()
