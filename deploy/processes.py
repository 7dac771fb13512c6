"""Starting and stopping Voice's processes as children (tests, benchmarks, ``voice up``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import httpx
from confluent_kafka.admin import AdminClient

from streams.settings import VoiceSettings
from streams.topics import COMMANDS, topic_name

SOURCE_TREE = Path(__file__).resolve().parents[1]
"""The checkout this code runs from (when it runs from one: it holds ``pyproject.toml``)."""


def voice_env(settings: VoiceSettings, **extra: str) -> dict[str, str]:
    """The environment a child process needs to act as part of the same stack.

    A child started from a source checkout imports that checkout first (``PYTHONPATH``): it
    starts in the stack's state folder, where ``python -m`` would find the project where it is
    installed — with an editable install, another checkout's code than its parent's (an A/B
    benchmark's "before" side once ran the "after" side's worker, ``docs/benchmarks.md``,
    eleventh pass)."""
    env = dict(os.environ)
    if (SOURCE_TREE / "pyproject.toml").is_file():
        env["PYTHONPATH"] = os.pathsep.join(
            [str(SOURCE_TREE), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.update({
        "VOICE_KAFKA_BOOTSTRAP": settings.bootstrap,
        "VOICE_TOPIC_PREFIX": settings.topic_prefix,
        "VOICE_GROUP_PREFIX": settings.group_prefix,
        "VOICE_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "VOICE_STATE_DIR": str(settings.state_dir),
        "VOICE_ENV": settings.env,
        "VOICE_GATEWAY_BOUND_S": str(settings.gateway_bound_s),
    })
    env.update(extra)
    return env


def worker_core(index: int) -> str | None:
    """The core the ``index``-th worker of a stack on this host pins its Python threads to
    (``VOICE_WORKER_PIN_PYTHON``, decision 0017): the allowed cores in turn; None with one
    core allowed (nothing to pin) or where the system cannot say."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    return str(cores[index % len(cores)]) if len(cores) >= 2 else None


def pinned_worker_env(index: int) -> dict[str, str]:
    """``VOICE_WORKER_PIN_PYTHON`` for the ``index``-th worker of a stack on this host, unless
    the environment sets it already."""
    core = worker_core(index)
    if core is None or "VOICE_WORKER_PIN_PYTHON" in os.environ:
        return {}
    return {"VOICE_WORKER_PIN_PYTHON": core}


def spawn_voice(settings: VoiceSettings, *args: str, log: Path, **extra: str
                ) -> subprocess.Popen[bytes]:
    """Start ``voice ARGS`` as a child with the stack's settings; output goes to ``log``."""
    out = open(log, "ab")
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", *args],
                            env=voice_env(settings, **extra), stdout=out,
                            stderr=subprocess.STDOUT, cwd=settings.state_dir)


def stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it does not go in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def worker_group(settings: VoiceSettings) -> str:
    """The consumer group (= Faust app id) of the stack's workers."""
    return f"{settings.group_prefix}-{settings.topic_prefix}worker".replace(".", "-")


def group_holds(admin: AdminClient, group: str, topic: str | None = None,
                partitions: int = 0, members: int = 0) -> bool:
    """Whether consumer group ``group`` is stable with partitions assigned — with ``topic``,
    all ``partitions`` of it (every record of it has a consumer now); with ``members``, at
    least that many members. False while the broker cannot say (its group coordinator still
    loading, a broker unreachable)."""
    try:
        desc = admin.describe_consumer_groups([group])[group].result(timeout=5)
    except Exception:
        return False
    if not str(desc.state).endswith("STABLE"):
        return False
    if len(desc.members) < members:
        return False
    held = [tp for m in desc.members for tp in m.assignment.topic_partitions]
    if topic is None:
        return bool(held)
    return {tp.partition for tp in held if tp.topic == topic} >= set(range(partitions))


def wait_group_stable(settings: VoiceSettings, group: str, timeout: float = 60,
                      members: int = 0) -> None:
    """Wait until a consumer group has members with partitions assigned — with ``members``,
    at least that many (processes started together join one by one: a group stable with the
    first of them rebalances again when the next joins)."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    _wait_until(lambda: group_holds(admin, group, members=members),
                f"consumer group {group!r} with {members or 'any'} members", timeout)


def stack_waits_for(settings: VoiceSettings, edge_url: str, admin: AdminClient,
                    worker_ready: Iterable[Path] = ()) -> str:
    """What the stack waits for before it answers a request ("" when nothing): the edge's
    ``/readyz``; each of ``worker_ready`` (the ``VOICE_WORKER_READY_FILE`` of a worker started
    here: it has read its tables back and handles records — a grown changelog once took a
    worker minutes after joining); the workers' group holding every partition of the commands
    topic (else a command waits, and its request answers 503, until a worker has joined)."""
    if not answers_ok(f"{edge_url}/readyz"):
        return "the edge to read its views (/readyz)"
    if missing := [path for path in worker_ready if not path.exists()]:
        return (f"the worker to read its tables back from their changelogs ({missing[0]} "
                "appears then; a large state folder takes minutes)")
    if not group_holds(admin, worker_group(settings), topic_name(settings, COMMANDS),
                       settings.topic_partitions):
        return "a worker to hold every partition of the commands topic"
    return ""


def stack_ready(settings: VoiceSettings, edge_url: str, admin: AdminClient,
                worker_ready: Iterable[Path] = ()) -> bool:
    """Whether the stack answers a request now (``stack_waits_for`` nothing)."""
    return not stack_waits_for(settings, edge_url, admin, worker_ready)


def wait_workers_ready(paths: Iterable[Path], timeout: float = 120,
                       procs: Iterable[subprocess.Popen[bytes]] = ()) -> None:
    """Wait until every worker's ready file exists (``VOICE_WORKER_READY_FILE``: its tables
    recovered), failing fast if one of ``procs`` exits first."""
    paths = list(paths)
    _wait_until(lambda: all(path.exists() for path in paths), f"the workers ({paths})",
                timeout, procs)


def _wait_until(ready: Callable[[], bool], what: str, timeout: float,
                procs: Iterable[subprocess.Popen[bytes]] = ()) -> None:
    """Poll ``ready`` until it holds, failing fast if one of ``procs`` exits first."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exited := [p for p in procs if p.poll() is not None]:
            raise RuntimeError(f"process exited with {exited[0].returncode} before {what} "
                               "was ready")
        if ready():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready in {timeout}s")


def answers_ok(url: str) -> bool:
    """Whether ``url`` answers 200 now (``/readyz`` does only when ready)."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_http_ready(url: str, timeout: float = 60, proc: subprocess.Popen[bytes] | None = None
                    ) -> None:
    """Wait until ``url`` answers 200 (failing fast if ``proc`` exits first)."""
    _wait_until(lambda: answers_ok(url), url, timeout, [proc] if proc is not None else [])
