"""Fixtures: one Kafka broker per test session, and per test its own topics and groups.

The broker is, in order: ``VOICE_KAFKA_BOOTSTRAP`` if set; else the official ``apache/kafka``
image in a container (``tests/containers.py``) when a Docker engine answers and
``VOICE_TEST_DOCKER`` is ``auto`` (the default) or ``always`` (which fails without Docker); else
the local broker from the Maven cache (what CI uses here, with ``VOICE_TEST_DOCKER=never``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streams.settings import VoiceSettings
from tests.containers import broker_choice, docker_answers, kafka_container
from tests.support import (
    settings_with_topics,
    spawn_voice,
    stop,
    wait_group_stable,
    wait_http_ready,
    worker_group,
)

LOG_TAIL_LINES = 300
"""Lines of each log a failed test's report ends with: a worker logging at ``info`` writes
~240 by the time it hands over its first records, its takeover's seek among them."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    """A failed test's processes' logs (``start_worker``, ``start_edge``: ``*.log`` in its
    ``tmp_path``), their last lines each, in its report: CI keeps only pytest's output."""
    report = yield
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and isinstance(tmp_path, Path):
        for log in sorted(tmp_path.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            if lines:
                report.sections.append((f"{log.name}, its last lines", "\n".join(lines)))
    return report


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of the session's broker."""
    choice = broker_choice(os.environ, docker=docker_answers())
    if choice == "given":
        yield os.environ["VOICE_KAFKA_BOOTSTRAP"]
        return
    if choice == "docker":
        with kafka_container() as bootstrap:
            yield bootstrap
        return
    from deploy.kafka_local import LocalKafka, free_port

    broker = LocalKafka(data_dir=tmp_path_factory.mktemp("kafka"), port=free_port())
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[object]:
    """A broker of this test's own (``LocalKafka``), to stop, pause and start again without
    touching the session's."""
    from deploy.kafka_local import LocalKafka, free_port

    broker = LocalKafka(data_dir=tmp_path / "kafka", port=free_port(), heap="512m")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: Path) -> VoiceSettings:
    """This test's settings: its own topic prefix and group prefix, topics created."""
    return settings_with_topics(kafka_bootstrap, tmp_path)


@pytest.fixture
def held_model() -> Iterator[str]:
    """A model endpoint that accepts connections and never answers: turns keep running
    (a deadline, a cancel or a killed worker ends them)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)  # many turns at once hold a connection each
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture(scope="session")
def simulator_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The model simulator (``voice simulator``) for the session's workers."""
    import subprocess
    import sys

    from deploy.kafka_local import free_port

    port = free_port()
    log = open(tmp_path_factory.mktemp("simulator") / "simulator.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "simulator", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http_ready(f"{url}/health", proc=proc)
    yield url
    stop(proc)


@pytest.fixture
def start_worker(settings: VoiceSettings, tmp_path: Path, simulator_url: str
                 ) -> Iterator[Callable[..., object]]:
    """Start ``voice worker`` processes for this test; all stopped at the end."""
    procs = []

    def start(wait: bool = True, loglevel: str = "warning", **env: str):  # noqa: ANN202
        env = {"ANTHROPIC_API_KEY": "simulator", "ANTHROPIC_BASE_URL": simulator_url, **env}
        proc = spawn_voice(settings, "worker", "--loglevel", loglevel,
                           log=tmp_path / f"worker{len(procs)}.log", **env)
        procs.append(proc)
        if wait:
            wait_group_stable(settings, worker_group(settings))
        return proc

    yield start
    for p in procs:
        stop(p)


@pytest.fixture
def start_edge(settings: VoiceSettings, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start ``voice edge`` processes on free ports; returns each one's base URL."""
    from deploy.kafka_local import free_port

    procs = []

    def start(**env: str) -> str:
        port = free_port()
        proc = spawn_voice(settings, "edge", "--port", str(port),
                           log=tmp_path / f"edge{len(procs)}.log", **env)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http_ready(f"{url}/readyz", proc=proc)
        return url

    yield start
    for p in procs:
        stop(p)


@pytest.fixture
def make_worker() -> Iterator[Callable[..., object]]:
    """``consumers.app.create_worker`` for a test that builds a worker without running it;
    each one is closed after the test (its key store's consumer, made with it, would reconnect
    to the test's absent broker for the rest of the session)."""
    from consumers.app import create_worker

    made: list[object] = []

    def make(*args: object, **kwargs: object) -> object:
        made.append(create_worker(*args, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for worker in made:
        worker.close()  # type: ignore[attr-defined]
