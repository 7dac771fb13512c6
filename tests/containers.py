"""The test suite's broker in a container: the official ``apache/kafka`` image, single-node KRaft.

Used by the session's ``kafka_bootstrap`` fixture when a Docker engine answers (see
``broker_choice``). It is not testcontainers' ``KafkaContainer``: that class drives the
Confluent ``cp-kafka`` image (it writes a start script calling ``/etc/confluent/docker/*`` and
``kafka-storage format``, none of which ``apache/kafka`` has) and its ``with_kraft()`` refuses
any tag below Confluent's ``7.0.0`` — so ``apache/kafka:4.1.1`` failed before a container
started. Here the image is driven as its own documentation says (docker/examples/README.md of
apache/kafka): every broker setting through ``KAFKA_*`` variables, the list complete because
the image drops its defaults once any is given, and its own ``/etc/kafka/docker/run`` to start.

The one value known only after the start is the host port Docker mapped, which clients must be
advertised; the container therefore waits for a file carrying ``KAFKA_ADVERTISED_LISTENERS``
and then runs the image's start script. The container part has never run: there is no Docker
engine where Voice is developed or tested (docs/containers.md); the pure parts are checked by
tests/unit/test_containers.py.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Literal

KAFKA_IMAGE = "apache/kafka:4.1.1"
"""The broker version the local broker (``deploy/kafka_local.py``) and CI run."""

CLIENT_PORT = 9092
"""The listener the host's clients reach through the port Docker maps."""
BROKER_PORT = 9093
"""Inter-broker listener, reached only inside the container."""
CONTROLLER_PORT = 9094
"""KRaft controller listener, reached only inside the container."""

ADVERTISED_FILE = "/tmp/voice-advertised-listeners"
"""Where the fixture writes ``KAFKA_ADVERTISED_LISTENERS`` once the mapped port is known."""
IMAGE_START = "/etc/kafka/docker/run"
"""The image's own start script (its ``CMD``): configure from ``KAFKA_*``, format, launch."""
STARTED = r"Kafka Server started"
"""What ``KafkaRaftServer`` logs once the broker serves (``KafkaBroker.STARTED_MESSAGE``)."""

DockerChoice = Literal["auto", "always", "never"]


def kraft_env(cluster_id: str = "MsPiKPwnQ2WSufk82HhZpQ") -> dict[str, str]:
    """The ``apache/kafka`` image's environment for one broker+controller node.

    The same broker settings as ``deploy/kafka_local.py`` (so a test sees the same broker on
    either path): no auto-created topics, replication factor 1 for every internal topic.
    ``KAFKA_ADVERTISED_LISTENERS`` is not here: it carries the mapped port (``advertised``).
    """
    return {
        "CLUSTER_ID": cluster_id,
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": (f"PLAINTEXT://:{CLIENT_PORT},BROKER://:{BROKER_PORT},"
                            f"CONTROLLER://:{CONTROLLER_PORT}"),
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": (
            "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT"),
        "KAFKA_INTER_BROKER_LISTENER_NAME": "BROKER",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@localhost:{CONTROLLER_PORT}",
        "KAFKA_LOG_DIRS": "/var/lib/kafka/data",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "6",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_NUM_PARTITIONS": "1",
        "KAFKA_LOG_INDEX_SIZE_MAX_BYTES": "1048576",
    }


def advertised(host: str, mapped_port: int) -> str:
    """``KAFKA_ADVERTISED_LISTENERS``: clients at the host's mapped port, the broker to itself
    inside the container. The controller listener is never advertised (the image refuses it)."""
    return f"PLAINTEXT://{host}:{mapped_port},BROKER://localhost:{BROKER_PORT}"


def start_command() -> list[str]:
    """Wait for the advertised listeners, then hand over to the image's own start script."""
    script = (f"while [ ! -s {ADVERTISED_FILE} ]; do sleep 0.1; done; "
              f'export KAFKA_ADVERTISED_LISTENERS="$(cat {ADVERTISED_FILE})"; '
              f"exec {IMAGE_START}")
    return ["bash", "-c", script]


def broker_choice(env: Mapping[str, str], docker: bool) -> Literal["given", "docker", "local"]:
    """Which broker the session uses: ``VOICE_KAFKA_BOOTSTRAP`` if set; else per
    ``VOICE_TEST_DOCKER`` (``auto``: a container when ``docker`` answers, else the local
    broker; ``always``: a container or an error; ``never``: the local broker)."""
    if env.get("VOICE_KAFKA_BOOTSTRAP"):
        return "given"
    choice = env.get("VOICE_TEST_DOCKER", "auto")
    if choice not in ("auto", "always", "never"):
        raise ValueError(f"VOICE_TEST_DOCKER={choice!r}: expected auto, always or never")
    if choice == "always" and not docker:
        raise RuntimeError("VOICE_TEST_DOCKER=always but no Docker engine answers `docker info`")
    return "docker" if choice != "never" and docker else "local"


def docker_answers() -> bool:
    """True when a Docker engine answers (then the broker can run in a container)."""
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextmanager
def kafka_container(timeout: float = 180.0) -> Iterator[str]:
    """An ``apache/kafka`` KRaft broker in a container; yields its bootstrap ``host:port``."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    container = DockerContainer(KAFKA_IMAGE).with_exposed_ports(CLIENT_PORT)
    container.with_envs(**kraft_env()).with_command(start_command())
    with container:
        host = container.get_container_host_ip()
        port = int(container.get_exposed_port(CLIENT_PORT))
        container.copy_into_container(advertised(host, port).encode(), ADVERTISED_FILE)
        LogMessageWaitStrategy(STARTED).with_startup_timeout(int(timeout)).wait_until_ready(
            container)
        bootstrap = f"{host}:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        deadline, last = time.monotonic() + timeout, "no broker in the metadata"
        while time.monotonic() < deadline:  # serving through the mapped port, not only started
            try:
                if admin.list_topics(timeout=5).brokers:
                    break
            except KafkaException as exc:
                last = str(exc)
            time.sleep(0.5)
        else:
            raise TimeoutError(f"{KAFKA_IMAGE} at {bootstrap}: not serving in {timeout}s: {last}")
        yield bootstrap
