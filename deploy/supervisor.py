"""``voice up``: start what is not configured from outside, run it in the foreground, and stop
every process it started on Ctrl-C (SIGINT) or SIGTERM.

Order: local broker (unless ``VOICE_KAFKA_BOOTSTRAP``) → topics → model simulator (unless
``ANTHROPIC_API_KEY``) → worker → telemetry sink → edge. A child that dies is started again
after a short backoff (one crashed worker is not the end of the stack: its partitions' records
were not committed, so the new one resumes them); a child that dies more than
``VOICE_UP_RESTARTS`` times within ``VOICE_UP_RESTART_WINDOW_S`` is broken, and then every
process is stopped, so a broken stack never looks half alive. ``voice up: ready`` is printed once
a request would be answered: the edge ready, a worker holding every commands partition, and
that worker's tables read back (its ``VOICE_WORKER_READY_FILE``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from deploy.kafka_local import LocalKafka, LocalKafkaSettings
from deploy.processes import pinned_worker_env, stack_waits_for
from deploy.simulator import SimulatorSettings
from streams.model_settings import SIMULATOR_KEY, ModelSettings
from streams.settings import VoiceSettings
from streams.topics import create_topics


def bootstrap_file(settings: VoiceSettings) -> Path:
    """Where ``voice up`` writes the local broker's address for other ``voice`` commands."""
    return settings.state_dir / "kafka" / "bootstrap"


def _spawn(name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    print(f"voice up: starting {name}: voice {' '.join(args)}", flush=True)
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", *args], env=env)


def worker_ready_file(settings: VoiceSettings) -> Path:
    """The worker's ready file: ``VOICE_WORKER_READY_FILE`` when set, else one in the state
    folder (the worker removes a stale one as it starts)."""
    return settings.worker_ready_file or settings.state_dir / "worker.ready"


@dataclass
class Restarts:
    """When a child that exited may start again: after a backoff that doubles with each recent
    restart (0.5 s, 1 s, 2 s … at most 10 s), and never more than ``limit`` times within
    ``window_s`` seconds — past that it is broken, not unlucky."""

    limit: int = 5
    window_s: float = 300.0
    times: deque[float] = field(default_factory=deque)

    def next_start(self, now: float) -> float | None:
        """When to start the child that just exited (None: give up)."""
        while self.times and now - self.times[0] > self.window_s:
            self.times.popleft()
        if len(self.times) >= self.limit:
            return None
        delay = min(10.0, 0.5 * 2 ** len(self.times))
        self.times.append(now)
        return now + delay


READY_POLL_S = 0.5
WAIT_NOTE_AFTER_S = 5.0
"""Past this long without the ready line, each new thing the stack waits for is printed."""


def announce_ready(settings: VoiceSettings, stopping: Callable[[], bool],
                   clock: Callable[[], float] = time.monotonic,
                   waits_for: Callable[[], str] | None = None,
                   worker_ready: Path | None = None) -> bool:
    """Print ``voice up: ready`` once the stack answers requests (``stack_waits_for``
    nothing: the edge ready, ``worker_ready`` there — the worker's tables read back — and a
    worker holding every commands partition), and before it, what it still waits for; returns
    whether it did (False: stopped first). Until then a request may wait for a worker still
    joining its group or reading its changelogs, and answer 503 — the broker's group
    coordinator alone can take seconds after a start."""
    if waits_for is None:
        host = "127.0.0.1" if settings.edge_host in ("0.0.0.0", "::", "") else settings.edge_host
        admin = AdminClient({"bootstrap.servers": settings.bootstrap})
        url = f"http://{host}:{settings.edge_port}"

        def waits_for() -> str:
            return stack_waits_for(settings, url, admin,
                                   [worker_ready] if worker_ready is not None else [])

    began = clock()
    noted = ""
    while not stopping():
        waiting = waits_for()
        if not waiting:
            print(f"voice up: ready in {clock() - began:.1f} s (the edge answers, and a worker "
                  "holds every partition of the commands topic, its tables read back)",
                  flush=True)
            return True
        if waiting != noted and clock() - began >= WAIT_NOTE_AFTER_S:
            print(f"voice up: not ready yet ({clock() - began:.0f} s): waiting for {waiting}",
                  flush=True)
            noted = waiting
        time.sleep(READY_POLL_S)
    return False


def watch(children: dict[str, subprocess.Popen[bytes]],
          start: dict[str, Callable[[], subprocess.Popen[bytes]]],
          restarts: dict[str, Restarts], stopping: Callable[[], bool],
          clock: Callable[[], float] = time.monotonic, tick: float = 0.2) -> int:
    """Keep ``children`` running until ``stopping()``: restart each that exits (per its
    ``Restarts``); the exit code of the first that may not start again, else 0."""
    due: dict[str, float] = {}
    while not stopping():
        now = clock()
        for name, proc in children.items():
            if name in due or proc.poll() is None:
                continue
            when = restarts[name].next_start(now)
            if when is None:
                print(f"voice up: {name} exited with {proc.returncode}, "
                      f"{restarts[name].limit} times in {restarts[name].window_s:.0f} s; "
                      "stopping everything", flush=True)
                return proc.returncode or 1
            print(f"voice up: {name} exited with {proc.returncode}; starting it again in "
                  f"{when - now:.1f} s", flush=True)
            due[name] = when
        for name, when in list(due.items()):
            if clock() >= when:
                del due[name]
                children[name] = start[name]()
        time.sleep(tick)
    return 0


def up(settings: VoiceSettings, with_simulator: bool | None = None) -> int:
    """Run the whole stack in the foreground; returns the exit code."""
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    broker: LocalKafka | None = None
    children: dict[str, subprocess.Popen[bytes]] = {}
    env = dict(os.environ)  # handed down to the children, which read their own settings
    try:
        if settings.kafka_bootstrap:
            print(f"voice up: using the Kafka cluster at {settings.kafka_bootstrap}", flush=True)
        else:
            port = LocalKafkaSettings().local_kafka_port
            broker = LocalKafka(data_dir=settings.state_dir / "kafka", port=port)
            print(f"voice up: starting the local Kafka broker (KRaft) on 127.0.0.1:{port}; "
                  f"data in {broker.data_dir}", flush=True)
            settings = settings.model_copy(update={"kafka_bootstrap": broker.start()})
            bootstrap_file(settings).write_text(settings.bootstrap + "\n")
        env["VOICE_KAFKA_BOOTSTRAP"] = settings.bootstrap
        created = create_topics(settings)
        print(f"voice up: topics ready ({sum(v == 'created' for v in created.values())} created, "
              f"{sum(v == 'exists' for v in created.values())} existed)", flush=True)
        if with_simulator is None:
            with_simulator = ModelSettings().api_key is None
        if with_simulator:
            env["ANTHROPIC_BASE_URL"] = f"http://127.0.0.1:{SimulatorSettings().port}"
            if not env.get("ANTHROPIC_API_KEY"):
                env["ANTHROPIC_API_KEY"] = SIMULATOR_KEY
            children["simulator"] = _spawn("the model simulator (replies come from it, "
                                           "not from a real model)", ["simulator"], env)
        worker_ready = worker_ready_file(settings)
        worker_env = {**env, "VOICE_WORKER_READY_FILE": str(worker_ready),
                      **pinned_worker_env(0)}  # its Python on one core (decision 0017)
        start: dict[str, Callable[[], subprocess.Popen[bytes]]] = {
            "worker": lambda: _spawn("the worker", ["worker"], worker_env),
            "telemetry": lambda: _spawn("the telemetry sink (ClickHouse: embedded unless "
                                        "VOICE_CLICKHOUSE_URL; query it with `voice sql`)",
                                        ["telemetry"], env),
            "edge": lambda: _spawn("the edge", ["edge"], env),
        }
        if "simulator" in children:
            start["simulator"] = lambda: _spawn("the model simulator", ["simulator"], env)
        for name in ("worker", "telemetry", "edge"):
            children[name] = start[name]()
        print(f"voice up: edge on http://{settings.edge_host}:{settings.edge_port} "
              f"(OpenAPI at /docs); Ctrl-C stops everything", flush=True)
        threading.Thread(target=announce_ready, args=(settings, lambda: stopping),
                         kwargs={"worker_ready": worker_ready},
                         name="voice-up-ready", daemon=True).start()
        restarts = {name: Restarts(settings.up_restarts, settings.up_restart_window_s)
                    for name in children}
        return watch(children, start, restarts, lambda: stopping)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for proc in children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name, proc in children.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"voice up: {name} did not stop in time; killing it", flush=True)
                proc.kill()
                proc.wait()
        if broker is not None:
            print("voice up: stopping the local Kafka broker", flush=True)
            broker.stop()
            bootstrap_file(settings).unlink(missing_ok=True)
        print("voice up: stopped", flush=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
