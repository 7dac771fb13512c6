"""``voice up: ready`` means a request is answered: the edge ready *and* a worker holding every
partition of the commands topic. The edge alone said ready while the first worker was still
joining its group, and the README's first ``POST /me/conversations`` answered 503."""

from __future__ import annotations

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from deploy.processes import group_holds, stack_ready, worker_group
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import COMMANDS, topic_name
from tests.support import wait_for

pytestmark = pytest.mark.integration


def test_ready_only_once_a_worker_holds_the_commands(settings: VoiceSettings, start_edge,
                                                     start_worker) -> None:  # noqa: ANN001
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    edge = start_edge()
    commands = topic_name(settings, COMMANDS)
    assert httpx.get(f"{edge}/readyz").json()["ready"] is True
    assert not group_holds(admin, worker_group(settings), commands, settings.topic_partitions)
    assert not stack_ready(settings, edge, admin), "no worker yet: a command would wait"
    start_worker(wait=False)
    wait_for(lambda: stack_ready(settings, edge, admin), timeout=60, what="the stack ready")
    # ready means answered: the README's first request
    headers = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    created = httpx.post(f"{edge}/me/conversations", headers=headers, timeout=20)
    assert created.status_code == 201, created.text
    assert created.json()["conversation"].startswith("cnv-")


def test_not_ready_while_the_edge_is_not(settings: VoiceSettings, start_worker) -> None:  # noqa: ANN001
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    start_worker()
    assert group_holds(admin, worker_group(settings), topic_name(settings, COMMANDS),
                       settings.topic_partitions)
    assert not stack_ready(settings, "http://127.0.0.1:9", admin), "no edge there"


def test_a_group_holds_with_members_only_once_all_of_them_joined(settings: VoiceSettings,
                                                                  start_worker) -> None:  # noqa: ANN001
    """The bench waits for all its workers (``wait_group_stable(members=…)``): a group stable
    with the first to join rebalances again when the next one does, mid-run."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    group = worker_group(settings)
    start_worker()
    assert group_holds(admin, group, members=1)
    assert not group_holds(admin, group, members=2), "one worker is one member"
    start_worker(wait=False)
    wait_for(lambda: group_holds(admin, group, members=2), timeout=60, what="both workers")
