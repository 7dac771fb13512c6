"""Whether this worker is handling records now, shown as a file that exists only then.

A worker that has just joined its group (or taken partitions over in a rebalance) reads its
tables' changelogs back before it handles a record: until then a command for its partitions
waits, and the request behind it may answer 503. ``voice up`` prints its ready line only once
the file is there; in a container it is the readiness probe (``test -f``), on whatever host
the worker runs — the file is this process's own, never shared.

Ready means: Faust has finished a recovery (``Recovery.completed``), is neither rebalancing nor
recovering now, and the consumer reads its partitions again.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

READY_CHECK_S = 0.25
"""How often the worker looks at its state."""


def faust_ready(app: Any) -> bool:
    """Whether Faust handles records now (not starting, rebalancing or recovering)."""
    recovery = app.tables.recovery
    return bool(recovery.completed.is_set() and not app.rebalancing
                and not recovery.in_recovery)


class ReadyFile:
    """The file that exists while the worker is ready (``VOICE_WORKER_READY_FILE``)."""

    def __init__(self, path: Path, clock: Any = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self.began = clock()
        self.ready: bool | None = None
        self.failed = False
        """A write failed (logged once)."""
        self._remove()  # one a process before this one left

    def _remove(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass  # not ours to remove, or not a file: ``show`` says so

    def show(self, ready: bool) -> None:
        """Make the file say ``ready`` (written or removed only when that changes). A path
        the worker cannot write is logged, once, and the worker goes on handling records:
        it is then never shown ready, which its probe reports."""
        if ready == self.ready:
            return
        try:
            if ready:
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
                tmp.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(f"{os.getpid()}\n")
                tmp.replace(self.path)  # never seen half written
                log.warning("worker ready: tables recovered, records handled "
                            "(%.1f s after start)", self.clock() - self.began)
            else:
                self.path.unlink(missing_ok=True)
                if self.ready is not None:
                    log.warning("worker not ready: rebalancing or recovering its tables")
        except OSError as exc:
            if not self.failed:
                log.error("VOICE_WORKER_READY_FILE %s cannot be written (%s): this worker "
                          "is never shown ready", self.path, exc)
            self.failed = True
            return
        self.ready = ready

    def close(self) -> None:
        """The worker stops: no longer ready (a path it could never write raises nothing
        here either: this runs in Faust's shutdown)."""
        self._remove()
        self.ready = False
