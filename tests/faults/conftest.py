"""Fixtures the fault tests share: a whole stack (worker, edge, an authenticated client) on a
broker of the test's own, to stop, pause or restart.

The session's broker and the per-test ``settings``/``start_worker``/``start_edge``/
``held_model`` come from ``tests/conftest.py``; this adds what more than one fault test opened
by hand.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from deploy.kafka_local import LocalKafka, free_port
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from tests.support import (
    settings_with_topics,
    spawn_voice,
    stop,
    wait_group_stable,
    wait_http_ready,
    worker_group,
)


@dataclass
class OwnStack:
    """One worker and one edge on the test's own broker, and a client of the edge (alice)."""

    broker: LocalKafka
    settings: VoiceSettings
    worker: subprocess.Popen[bytes]
    edge: subprocess.Popen[bytes]
    url: str
    client: httpx.Client

    def alive(self) -> bool:
        """Whether neither process has exited."""
        return self.worker.poll() is None and self.edge.poll() is None


@pytest.fixture
def own_stack(own_broker: LocalKafka, tmp_path: Path, simulator_url: str
              ) -> Iterator[Callable[[float], OwnStack]]:
    """``own_stack(bound_s)``: the stack on ``own_broker`` with that gateway bound, quotas
    off (a steady load must not meet them), ready (the edge answers, the worker's group is
    assigned); stopped at the end."""
    made: list[OwnStack] = []

    def make(bound_s: float) -> OwnStack:
        settings = settings_with_topics(own_broker.bootstrap, tmp_path, gateway_bound_s=bound_s)
        port = free_port()
        worker = spawn_voice(settings, "worker", log=tmp_path / "worker.log",
                             ANTHROPIC_API_KEY="simulator", ANTHROPIC_BASE_URL=simulator_url,
                             VOICE_QUOTA_TENANT_TOKENS_PER_DAY="0")
        edge = spawn_voice(settings, "edge", "--port", str(port), log=tmp_path / "edge.log",
                           VOICE_QUOTA_MESSAGES_PER_MINUTE="0")
        url = f"http://127.0.0.1:{port}"
        auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
        client = httpx.Client(base_url=url, headers=auth, timeout=bound_s * 3,
                              limits=httpx.Limits(max_connections=200))
        stack = OwnStack(own_broker, settings, worker, edge, url, client)
        made.append(stack)
        wait_http_ready(f"{url}/readyz", proc=edge, timeout=90)
        wait_group_stable(settings, worker_group(settings))
        return stack

    yield make
    for stack in made:
        stack.client.close()
        stop(stack.edge)
        stop(stack.worker)
