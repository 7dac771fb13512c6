"""One core for a process's Python threads, the others for librdkafka's (decision 0017).

Only one thread of a process runs Python at a time (the GIL), but the scheduler spreads a
worker's dozen Python threads over every core: each hand-over of the GIL then wakes a thread on
another core, and a ``produce()`` — which holds the GIL while it wakes librdkafka's broker
thread (docs/benchmarks.md, sixteenth and thirty-third passes) — can be preempted by the very
thread it woke. ``ThreadPinning`` keeps the Python threads on one core and librdkafka's threads
(named ``rdk:…``) on the others, so neither waits for the other's core.

The threads are found by name in ``/proc/self/task``, now and every ``interval_s`` after (a
client made later brings its own threads; a new thread first has its creator's cores). Linux
only; anywhere else, or with a single core allowed, it does nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

NATIVE_PREFIX = "rdk:"
"""The name librdkafka gives each of its threads (``rdk:main``, ``rdk:broker1``, …)."""
INTERVAL_S = 1.0
"""How often threads made since the last look are pinned."""


@dataclass(frozen=True)
class Split:
    """Where each kind of thread may run."""

    python: frozenset[int]
    native: frozenset[int]


def split(setting: str, allowed: Iterable[int], pid: int) -> Split | None:
    """The cores for ``setting`` (``off``, ``auto`` or a core number) out of the ``allowed``
    ones; None when nothing is to be pinned (``off``, or fewer than two cores allowed).

    ``auto`` takes the core ``pid`` falls on among the allowed ones, so workers started
    together on one host take different cores; a number takes that core (it must be allowed).
    Raises ``ValueError`` for any other setting, or a core that is not allowed.
    """
    cores = sorted(set(allowed))
    value = setting.strip().lower()
    if value == "off":
        return None
    if value == "auto":
        core = cores[pid % len(cores)] if cores else None
    else:
        try:
            core = int(value)
        except ValueError:
            raise ValueError(f"VOICE_WORKER_PIN_PYTHON must be off, auto or a core number, "
                             f"not {setting!r}") from None
        if core not in cores:
            raise ValueError(f"VOICE_WORKER_PIN_PYTHON={core}: this process may run on cores "
                             f"{cores} only")
    if core is None or len(cores) < 2:
        return None
    return Split(python=frozenset({core}), native=frozenset(c for c in cores if c != core))


class ThreadPinning:
    """Pins each thread of this process, once, to the cores of its kind (see the module)."""

    def __init__(self, cores: Split, tasks: Path = Path("/proc/self/task"),
                 pin: Callable[[int, frozenset[int]], None] = os.sched_setaffinity,
                 interval_s: float = INTERVAL_S) -> None:
        self.cores = cores
        self.tasks = tasks
        self.pin = pin
        self.interval_s = interval_s
        self.pinned: set[int] = set()
        """Ids of the live threads already pinned (an ended thread's id is forgotten: the
        kernel may give it to a new thread, which is then pinned as its own kind)."""

    def scan(self) -> int:
        """Pin every thread not pinned yet; returns how many were."""
        try:
            ids = {int(name) for name in os.listdir(self.tasks) if name.isdigit()}
        except OSError:
            return 0
        self.pinned &= ids
        done = 0
        for tid in ids - self.pinned:
            try:
                name = (self.tasks / str(tid) / "comm").read_text().strip()
                self.pin(tid, self.cores.native if name.startswith(NATIVE_PREFIX)
                         else self.cores.python)
            except OSError:  # gone meanwhile, or not ours to move
                continue
            self.pinned.add(tid)
            done += 1
        return done

    def start(self) -> ThreadPinning:
        """Pin what runs now, then look again every ``interval_s`` in a daemon thread."""
        self.scan()
        threading.Thread(target=self._run, name="voice-pinning", daemon=True).start()
        log.info("Python threads on core(s) %s, librdkafka's on %s",
                 sorted(self.cores.python), sorted(self.cores.native))
        return self

    def _run(self) -> None:
        while True:
            time.sleep(self.interval_s)
            self.scan()


def pin_threads(setting: str) -> ThreadPinning | None:
    """Start pinning this process's threads as ``setting`` says (``split``); None if it says
    nothing is pinned, or this system cannot."""
    if not hasattr(os, "sched_getaffinity") or not Path("/proc/self/task").is_dir():
        return None
    cores = split(setting, os.sched_getaffinity(0), os.getpid())
    return ThreadPinning(cores).start() if cores is not None else None
