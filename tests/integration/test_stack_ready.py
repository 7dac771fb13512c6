"""``voice up: ready`` means a request is answered: the edge ready *and* a worker holding every
partition of the commands topic, its tables read back. The edge alone said ready while the first
worker was still joining its group, and the README's first ``POST /me/conversations`` answered
503; later the group held while the worker still read an 860 MB changelog back (the worker's
ready file, and changelog segments that compaction can reach)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from consumers.app import create_worker, declare_changelogs
from deploy.processes import group_holds, stack_ready, stop, worker_group
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import CHANGELOG_CONFIG, COMMANDS, topic_name
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


def test_not_ready_until_the_worker_says_so(settings: VoiceSettings, start_edge, start_worker,
                                            tmp_path: Path) -> None:  # noqa: ANN001
    """The worker's ready file appears once it handles records and is gone once it stops; the
    stack is not ready without it, whatever the group says."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    edge = start_edge()
    start_worker()  # one worker holds every partition, and has no ready file
    missing = tmp_path / "never.ready"
    assert group_holds(admin, worker_group(settings), topic_name(settings, COMMANDS),
                       settings.topic_partitions)
    assert stack_ready(settings, edge, admin)
    assert not stack_ready(settings, edge, admin, [missing]), "that worker has not said ready"

    path = tmp_path / "run" / "worker.ready"
    path.parent.mkdir()
    path.write_text("1\n")  # a killed worker's, before this one
    proc = start_worker(wait=False, VOICE_WORKER_READY_FILE=str(path))
    wait_for(lambda: not path.exists(), timeout=30, what="the stale file removed")
    wait_for(lambda: stack_ready(settings, edge, admin, [path]), timeout=90,
             what="the second worker ready")
    headers = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    created = httpx.post(f"{edge}/me/conversations", headers=headers, timeout=20)
    assert created.status_code == 201, created.text
    stop(proc)
    assert not path.exists(), "a stopped worker is not ready"


def test_changelogs_roll_segments_compaction_can_reach(settings: VoiceSettings) -> None:
    """A changelog made before ``CHANGELOG_CONFIG`` (compaction only: Kafka's 1 GiB, 7-day
    segment, never compacted while active) gets the segment configs at the worker's start; one
    made now has them from its creation."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    worker = create_worker(settings)
    names = sorted(t.changelog_topic.get_topic_name() for t in worker.app.tables.values())
    old = names[0]
    admin.create_topics([NewTopic(old, num_partitions=settings.topic_partitions,
                                  replication_factor=1,
                                  config={"cleanup.policy": "compact"})])[old].result(15)
    declare_changelogs(worker)
    wanted = {"cleanup.policy": "compact", **CHANGELOG_CONFIG}

    def configs() -> dict[str, dict[str, str]]:  # as the broker serves them (they propagate)
        resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
        out = {}
        for res, fut in admin.describe_configs(resources).items():
            try:
                out[res.name] = {k: c.value for k, c in fut.result(15).items() if k in wanted}
            except Exception:  # a topic just made, not yet known to every broker part
                out[res.name] = {}
        return out

    wait_for(lambda: all(got == wanted for got in configs().values()), timeout=20,
             what="every changelog's configs")


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
