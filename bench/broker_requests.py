"""The local broker's request counts, by kind, read over its JMX port.

The broker's CPU a turn follows how many requests it answers, not how many records: each
request costs it about the same, and a request carries few records at the stack's rates
(docs/benchmarks.md, issue 14, fourth and thirty-seventh passes). The count of requests a turn
is also nearly the same from run to run, where the broker's CPU a turn moves by a fifth; so a
change that removes a step from a turn's path shows in it in one run.

The reader is ``BrokerRequests.java`` beside this file, run as a single-file source program by
the JDK's ``java`` for as long as the bench runs: it prints one reading a line asked. Without a
JDK (a JRE cannot compile the source) or a JMX port, there is no reader and the figures say so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from deploy.kafka_local import port_open

SOURCE = Path(__file__).with_name("BrokerRequests.java")

Counts = dict[str, int]

PARTS = frozenset({"FetchConsumer", "FetchFollower"})
"""Kinds the broker counts a second time under another (a consumer's fetch is a ``Fetch`` and a
``FetchConsumer``): left out of a total."""


class BrokerRequests:
    """A running reader of one broker's request counts."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._proc = proc

    @classmethod
    def start(cls, java: str, jmx_port: int, timeout: float = 30.0) -> BrokerRequests:
        """A reader of the broker whose JMX port is ``jmx_port``, once it has read once."""
        deadline = time.monotonic() + timeout
        while not port_open("127.0.0.1", jmx_port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no JMX port open at 127.0.0.1:{jmx_port}")
            time.sleep(0.2)
        proc = subprocess.Popen([java, str(SOURCE), str(jmx_port)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        reader = cls(proc)
        try:
            reader.read()
        except Exception:
            reader.close()
            raise
        return reader

    def read(self) -> Counts:
        """The broker's requests so far, by kind (``Produce``, ``Fetch``, ``FetchConsumer`` …)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write("\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the reader is gone: the read below says why
        line = self._proc.stdout.readline()
        if not line:
            err = self._proc.stderr.read() if self._proc.stderr else ""
            raise RuntimeError(f"the broker's request reader stopped: {err.strip()[-500:]}")
        counts: Counts = json.loads(line)
        return counts

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()


def reading(reader: BrokerRequests | None) -> Counts | None:
    """A reading of ``reader``, or None when there is none (no reader, or it failed: a figure
    without its counts is still a figure)."""
    if reader is None:
        return None
    try:
        return reader.read()
    except Exception as exc:
        print(f"[bench] the broker's request counts: {exc}", file=sys.stderr, flush=True)
        return None


def per_unit(before: Counts | None, after: Counts | None, units: float) -> dict[str, float] | None:
    """The requests of each kind between two readings, per unit (a turn), the kinds that had
    any; ``total`` is all of them (``PARTS`` counted once). None without both readings."""
    if before is None or after is None or units <= 0:
        return None
    grown = {kind: n - before.get(kind, 0) for kind, n in after.items()}
    out = {kind: round(n / units, 2) for kind, n in sorted(grown.items()) if n > 0}
    out["total"] = round(sum(n for kind, n in grown.items() if n > 0 and kind not in PARTS)
                         / units, 2)
    return out
