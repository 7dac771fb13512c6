"""A whole Voice stack for benchmarks: simulator (zero latency), worker(s) and an edge, as
child processes on the benchmark's broker; started once per run, stopped when the run ends.

Its topics carry the run's own prefix (``<prefix>voice.bench.<run id>.stack.``) and its
consumer groups the run's own group prefix, so a run on an existing cluster touches nothing
else; ``close_all`` deletes them again there (a throwaway broker simply goes away).

Every process is the plain ``voice`` command. The what-if patches once measured here
(``spinner``, ``effects_nowait``, ``inline_deps``) are production code now; a what-if is a
product or an agent runner passed through ``consumers.app.create_worker``, not a monkeypatch
of code that drifts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.harness import Context
from bench.settings import BenchSettings
from deploy.kafka_local import free_port
from deploy.processes import (
    pinned_worker_env,
    spawn_voice,
    stop,
    wait_group_stable,
    wait_http_ready,
    wait_workers_ready,
    worker_group,
)
from streams.reading import end_offset
from streams.settings import VoiceSettings
from streams.topics import create_topics

_STACK: Stack | None = None
_CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far (Linux ``/proc``), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK
    except (OSError, IndexError, ValueError):
        return None


def threads_cpu_seconds(pid: int) -> dict[str, float] | None:
    """CPU seconds each live thread of a process has run so far, by ``name/tid``, to the
    nanosecond (each thread's ``/proc/…/schedstat``); None if unreadable."""
    try:
        return {f"{(task / 'comm').read_text().strip()}/{task.name}":
                int((task / "schedstat").read_text().split()[0]) / 1e9
                for task in Path(f"/proc/{pid}/task").iterdir()}
    except (OSError, IndexError, ValueError):
        return None


def live_threads_cpu_seconds(pid: int) -> float | None:
    """CPU seconds the live threads of a process have run so far, to the nanosecond: for
    windows of tens of ms, where ``cpu_seconds``' 10 ms ticks are the figure's size. A thread
    that has ended no longer counts: compare two readings of a process whose threads outlive
    the window. None if unreadable."""
    threads = threads_cpu_seconds(pid)
    return None if threads is None else sum(threads.values())


JIT_THREADS = ("C1 Compiler", "C2 Compiler")
"""How HotSpot's JIT compiler threads' names (``C2 CompilerThread0``, cut to 15 characters in
``/proc``) begin."""


def jit_seconds(threads: dict[str, float]) -> float:
    """Of ``threads_cpu_seconds``' reading, the seconds of a JVM's JIT compiler threads."""
    return sum(s for name, s in threads.items() if name.startswith(JIT_THREADS))


def jit_cpu_seconds(pid: int) -> float | None:
    """CPU seconds a JVM's JIT compiler threads have run so far, or None.

    A broker started for the run is still compiling minutes later, in the figures' windows too
    (~15 % of its CPU in ``turn.sustained``, issue 14's thirty-seventh pass); one that has run
    for days is not. The figures give this part of the broker's CPU beside the whole. Live
    threads only: a compiler thread HotSpot stopped no longer counts (two cores run one of
    each, and they live as long as the JVM)."""
    threads = threads_cpu_seconds(pid)
    return None if threads is None else jit_seconds(threads)


def rss_kib(pid: int) -> int:
    """The process's resident set, KiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class Stack:
    settings: VoiceSettings
    edge_url: str
    simulator_url: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    broker_pid: int | None = None
    external: bool = False

    def describe(self) -> dict[str, Any]:
        return {"workers": sum(1 for n in self.procs if n.startswith("worker")),
                "edges": 1, "simulator_latency_ms": 0,
                "topic_partitions": self.settings.topic_partitions,
                "worker_concurrency": self.settings.worker_concurrency}

    def cpu(self) -> dict[str, float | None]:
        """CPU seconds used so far by each child, the broker (when local; ``broker_jit`` is the
        part of it its JIT compiler ran) and this process."""
        out: dict[str, float | None] = {n: cpu_seconds(p.pid) for n, p in self.procs.items()}
        out["broker"] = cpu_seconds(self.broker_pid) if self.broker_pid else None
        out["broker_jit"] = jit_cpu_seconds(self.broker_pid) if self.broker_pid else None
        out["bench_client"] = own_cpu_seconds()
        return out

    def rss_mib(self) -> dict[str, float | None]:
        """The resident set of each child now, MiB (None if it cannot be read)."""
        out: dict[str, float | None] = {}
        for name, proc in self.procs.items():
            try:
                out[name] = round(rss_kib(proc.pid) / 1024, 1)
            except (OSError, RuntimeError):
                out[name] = None
        return out

    def topics(self) -> list[str]:
        admin = AdminClient({"bootstrap.servers": self.settings.bootstrap})
        md = admin.list_topics(timeout=10)
        app = worker_group(self.settings)
        return sorted(t for t in md.topics
                      if t.startswith(self.settings.topic_prefix) or t.startswith(app))

    def watermarks(self) -> dict[str, int]:
        """Records each of the stack's topics holds now (sum of its high watermarks)."""
        c = Consumer({"bootstrap.servers": self.settings.bootstrap,
                      "group.id": f"{self.settings.group_prefix}-bench-read"})
        try:
            md = c.list_topics(timeout=10)
            out: dict[str, int] = {}
            for t in self.topics():
                meta = md.topics.get(t)
                if meta is None:
                    continue
                out[t] = sum(end_offset(c, TopicPartition(t, p), 10) for p in meta.partitions)
            return out
        finally:
            c.close()

    def close(self) -> None:
        for name in reversed(list(self.procs)):
            stop(self.procs[name])
        self.procs.clear()
        if not BenchSettings().keep_state:  # logs, keys, Faust's data
            shutil.rmtree(self.settings.state_dir, ignore_errors=True)
        if self.external:  # leave nothing behind on someone else's cluster
            with contextlib.suppress(Exception):
                names = self.topics()
                if names:
                    admin = AdminClient({"bootstrap.servers": self.settings.bootstrap})
                    for fut in admin.delete_topics(names, operation_timeout=30).values():
                        with contextlib.suppress(Exception):
                            fut.result(timeout=60)


BENCH_QUOTAS = {f"VOICE_QUOTA_{name}": "1000000000" for name in (
    "MESSAGES_PER_MINUTE", "CONVERSATIONS_PER_DAY", "UPLOADS_PER_DAY", "STREAMS",
    "TENANT_TOKENS_PER_DAY")}
"""One principal posts hundreds of messages a minute here: quotas stay counted (their cost is
measured) but never refuse."""


def stack(ctx: Context, workers: int | None = None) -> Stack:
    """The run's stack (started on first use, on the run's broker)."""
    global _STACK
    if _STACK is None:
        _STACK = start_stack(ctx, "stack", workers=workers)
    return _STACK


def stack_settings(ctx: Context, label: str, partitions: int | None = None) -> VoiceSettings:
    """Settings of a stack of its own: topics ``…<run id>.<label>.``, its own groups and a
    fresh state folder; ``partitions`` per topic when given (else the run's)."""
    base = ctx.settings
    state = Path(tempfile.mkdtemp(prefix=f"voice-bench-{label}-"))
    return base.model_copy(update={
        "topic_prefix": f"{base.topic_prefix}voice.bench.{ctx.run_id}.{label}.",
        "group_prefix": f"bench{ctx.run_id}{label}", "state_dir": state, "env": "test",
        "topic_partitions": partitions or base.topic_partitions})


def start_stack(ctx: Context, label: str, workers: int | None = None,
                model_url: str | None = None, edge_env: dict[str, str] | None = None,
                partitions: int | None = None, pin: bool = True) -> Stack:
    """A stack of its own (topics ``…<run id>.<label>.``): the simulator at zero latency, or
    the model at ``model_url``; ``edge_env`` adds settings of the edge alone; ``partitions``
    per topic when given; ``pin``: its workers' Python on the cores in turn, as ``voice up``
    pins its one (decision 0017); the caller closes it (``stack`` keeps the run's one)."""
    settings = stack_settings(ctx, label, partitions)
    state = settings.state_dir
    ctx.log(f"  starting the {label} (state {state})")
    t0 = time.perf_counter()
    create_topics(settings)
    bench = BenchSettings()
    st = Stack(settings, "", "", broker_pid=getattr(ctx, "broker_pid", None),
               external=getattr(ctx, "external", False))
    try:
        edge_port = free_port()
        if model_url is None:
            sim_port = free_port()
            sim = spawn_voice(settings, "simulator", "--port", str(sim_port),
                              log=state / "sim.log", VOICE_SIMULATOR_LATENCY_MS="0",
                              VOICE_SIMULATOR_CHUNK_DELAY_MS="0")
            st.procs["simulator"] = sim
            model_url = f"http://127.0.0.1:{sim_port}"
            wait_http_ready(f"{model_url}/health", proc=sim)
        st.simulator_url = model_url
        model_env = {"ANTHROPIC_API_KEY": "simulator", "ANTHROPIC_BASE_URL": model_url}
        count = workers or bench.workers
        ready = [state / f"worker{i}.ready" for i in range(count)]
        for i in range(count):
            st.procs[f"worker{i}"] = spawn_voice(
                settings, "worker", log=state / f"worker{i}.log", **model_env, **BENCH_QUOTAS,
                **(pinned_worker_env(i) if pin else {}),
                VOICE_WORKER_READY_FILE=str(ready[i]))
        # All of them: a group stable with the first to join rebalances again, mid-run, when
        # the next one joins (docs/benchmarks.md, issue 14, thirteenth pass); and each with
        # its tables read back after that last rebalance.
        wait_group_stable(settings, worker_group(settings), members=count)
        wait_workers_ready(ready, procs=[st.procs[f"worker{i}"] for i in range(count)])
        edge = spawn_voice(settings, "edge", "--port", str(edge_port), log=state / "edge.log",
                           **{**BENCH_QUOTAS, **(edge_env or {})})
        st.procs["edge"] = edge
        st.edge_url = f"http://127.0.0.1:{edge_port}"
        wait_http_ready(f"{st.edge_url}/readyz", proc=edge)
    except BaseException:
        st.close()
        raise
    ctx.log(f"  {label} up in {time.perf_counter() - t0:.1f} s")
    return st


def current() -> Stack | None:
    return _STACK


def close_all() -> None:
    """Stop the run's stack (if one was started) and, on an existing cluster, drop its topics."""
    global _STACK
    if _STACK is not None:
        _STACK.close()
        _STACK = None
