"""A whole Voice stack for benchmarks: simulator (zero latency), worker(s) and an edge, as
child processes on the benchmark's broker; started once, stopped when the run ends."""

from __future__ import annotations

import atexit
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from deploy.kafka_local import free_port
from deploy.processes import (
    spawn_voice,
    stop,
    wait_group_stable,
    wait_http_ready,
    worker_group,
)
from streams.settings import VoiceSettings
from streams.topics import create_topics

_STACK: Stack | None = None


@dataclass
class Stack:
    settings: VoiceSettings
    edge_url: str
    simulator_url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def close(self) -> None:
        for p in reversed(self.procs):
            stop(p)
        self.procs.clear()


def stack(base: VoiceSettings, workers: int = 1) -> Stack:
    """The run's stack (started on first use)."""
    global _STACK
    if _STACK is not None:
        return _STACK
    state = Path(tempfile.mkdtemp(prefix="voice-bench-"))
    settings = base.model_copy(update={
        "topic_prefix": f"{base.topic_prefix}stack.", "group_prefix": "bench",
        "state_dir": state, "env": "test"})
    create_topics(settings)
    procs: list[subprocess.Popen[bytes]] = []
    sim_port, edge_port = free_port(), free_port()
    sim = spawn_voice(settings, "simulator", "--port", str(sim_port), log=state / "sim.log")
    procs.append(sim)
    sim_url = f"http://127.0.0.1:{sim_port}"
    wait_http_ready(f"{sim_url}/health", proc=sim)
    model_env = {"ANTHROPIC_API_KEY": "simulator", "ANTHROPIC_BASE_URL": sim_url}
    for i in range(workers):
        procs.append(spawn_voice(settings, "worker", log=state / f"worker{i}.log", **model_env))
    wait_group_stable(settings, worker_group(settings))
    edge = spawn_voice(settings, "edge", "--port", str(edge_port), log=state / "edge.log")
    procs.append(edge)
    url = f"http://127.0.0.1:{edge_port}"
    wait_http_ready(f"{url}/readyz", proc=edge)
    _STACK = Stack(settings, url, sim_url, procs)
    atexit.register(_STACK.close)
    return _STACK
