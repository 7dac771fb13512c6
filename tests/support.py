"""Helpers the tests share: the Kafka fixture's broker choice and process runners."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from streams.settings import VoiceSettings

REPO = Path(__file__).resolve().parent.parent


def docker_answers() -> bool:
    """True when a Docker engine answers (then testcontainers can run Kafka)."""
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextmanager
def testcontainers_kafka() -> Iterator[str]:
    """A KRaft Kafka in a container (not run on machines without a Docker engine)."""
    from testcontainers.kafka import KafkaContainer

    with KafkaContainer("apache/kafka:4.1.1").with_kraft() as kafka:
        yield kafka.get_bootstrap_server()


def unique_settings(bootstrap: str, tmp: Path, **overrides: object) -> VoiceSettings:
    """Settings with a fresh topic prefix and group prefix (one per test)."""
    tag = uuid.uuid4().hex[:8]
    values: dict[str, object] = {
        "kafka_bootstrap": bootstrap, "topic_prefix": f"t{tag}.", "group_prefix": f"g{tag}",
        "topic_partitions": 3, "state_dir": tmp, "env": "test",
    }
    values.update(overrides)
    return VoiceSettings(**values)  # type: ignore[arg-type]


def env_for(settings: VoiceSettings, **extra: str) -> dict[str, str]:
    """The environment a child process needs to act as part of this test's stack."""
    env = dict(os.environ)
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


def spawn_voice(settings: VoiceSettings, *args: str, log: Path, **extra: str
                ) -> subprocess.Popen[bytes]:
    """Start ``voice ARGS`` as a child process with the test's settings."""
    out = open(log, "ab")
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", *args],
                            env=env_for(settings, **extra), stdout=out, stderr=subprocess.STDOUT,
                            cwd=settings.state_dir)


def stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_group_stable(settings: VoiceSettings, group: str, timeout: float = 60) -> None:
    """Wait until a consumer group has members with partitions assigned."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            desc = admin.describe_consumer_groups([group])[group].result(timeout=5)
            if str(desc.state).endswith("STABLE") and any(
                m.assignment.topic_partitions for m in desc.members
            ):
                return
        except Exception:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"consumer group {group!r} not stable in {timeout}s")


def wait_http_ready(url: str, timeout: float = 60, proc: subprocess.Popen[bytes] | None = None
                    ) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready in {timeout}s")


def read_all(settings: VoiceSettings, topic: str, timeout: float = 5.0
             ) -> list:  # list[confluent_kafka.Message]
    """Every record currently on ``topic`` (all partitions), read with a plain consumer."""
    c = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                  "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=10)
        parts = list(md.topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out, deadline = [], time.monotonic() + timeout
        pos = {p: 0 for p in parts}
        while any(pos[p] < ends[p] for p in parts) and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None or msg.error():
                continue
            out.append(msg)
            pos[msg.partition()] = msg.offset() + 1
        return out
    finally:
        c.close()


def wait_for(predicate, timeout: float = 20, interval: float = 0.1, what: str = "condition"):  # noqa: ANN001, ANN201
    """Poll ``predicate`` until it returns a truthy value; return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached in {timeout}s")
