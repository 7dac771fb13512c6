"""Helpers the tests share: the Kafka fixture's broker choice and process runners."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deploy.processes import (  # noqa: F401  (re-exported for the tests)
    spawn_voice,
    stop,
    voice_env,
    wait_group_stable,
    wait_http_ready,
    worker_group,
)
from streams.reading import read_topic
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


env_for = voice_env


def read_all(settings: VoiceSettings, topic: str, timeout: float = 5.0) -> list:  # list[Message]
    """Every record currently on ``topic`` (all partitions), read with a plain consumer."""
    return read_topic(settings, topic, timeout=timeout)


def wait_for(predicate, timeout: float = 20, interval: float = 0.1, what: str = "condition"):  # noqa: ANN001, ANN201
    """Poll ``predicate`` until it returns a truthy value; return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached in {timeout}s")
