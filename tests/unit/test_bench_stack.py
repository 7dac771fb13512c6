"""The bench's readings: a JVM's JIT compiler threads told apart from the rest of its CPU;
the broker's request counts a unit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.broker_requests import per_unit, reading
from bench.stack import jit_cpu_seconds, jit_seconds, threads_cpu_seconds


def test_the_jit_part_counts_only_the_compiler_threads() -> None:
    threads = {"C2 CompilerThre/101": 1.5, "C1 CompilerThre/102": 0.25,
               "data-plane-kafk/130": 4.0, "GC Thread#0/12": 0.5, "java/1": 0.1}
    assert jit_seconds(threads) == 1.75


def test_a_process_without_a_jit_has_none_of_it_and_its_threads_are_read() -> None:
    threads = threads_cpu_seconds(os.getpid())
    assert threads is not None and any(name.endswith(f"/{os.getpid()}") for name in threads)
    assert jit_cpu_seconds(os.getpid()) == 0.0


def test_a_process_that_is_gone_reads_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    time.sleep(0.01)
    assert jit_cpu_seconds(proc.pid) is None


def test_counts_a_unit_leave_out_what_is_counted_twice() -> None:
    before = {"Produce": 10, "Fetch": 4, "FetchConsumer": 4, "Metadata": 1}
    after = {"Produce": 40, "Fetch": 14, "FetchConsumer": 14, "Metadata": 1, "ListOffsets": 5}
    assert per_unit(before, after, 10) == {"FetchConsumer": 1.0, "Fetch": 1.0,
                                           "ListOffsets": 0.5, "Produce": 3.0, "total": 4.5}
    assert per_unit(None, after, 10) is None
    assert per_unit(before, after, 0) is None
    assert reading(None) is None
