"""The worker process: a ``WorkerContext`` (the Faust app and what its products share) with
the products listed in ``products`` registered on it.

Every aggregate's commands are applied by ``consumers.frame.writer`` (records produced and
acknowledged by the broker, then the table, then the command's ack), so Faust commits an
offset only after its outputs are on the log (at-least-once; readers dedupe by record id or
per-aggregate seq). Workflow records are acknowledged only when their step is done (see
``consumers.workflows.runtime``). A new product is one more entry in ``products``.
"""

from __future__ import annotations

import logging
from typing import Any

from consumers.assistant import Assistant
from consumers.conversations import Conversations
from consumers.conversations.turns import ConcernAgent
from consumers.frame.context import Product, WorkerContext
from consumers.staff import Staff
from streams.settings import VoiceSettings
from streams.topics import CHANGELOG_CONFIG

log = logging.getLogger(__name__)


def products(agent: ConcernAgent | None = None) -> list[Product]:
    """The products every worker runs, in registration order."""
    return [Conversations(agent=agent), Staff(), Assistant()]


def declare_changelogs(worker: WorkerContext) -> None:
    """Create every table's changelog topic before the app starts, and give one that exists
    the configs it lacks (``CHANGELOG_CONFIG``: a topic made before them kept Kafka's 1 GiB,
    7-day segment, which compaction never reaches).

    Faust creates them at start, racing its consumer's first metadata snapshot; a table whose
    changelog missed it fails every write (``PartitionsMismatch``) until the next metadata
    refresh, minutes later. Best effort: Faust still creates whatever is missing.
    """
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
    )

    s = worker.settings
    config = {"cleanup.policy": "compact", **CHANGELOG_CONFIG}
    try:
        admin = AdminClient({"bootstrap.servers": s.bootstrap})
        names = [t.changelog_topic.get_topic_name() for t in worker.app.tables.values()]
        new = [NewTopic(name, num_partitions=s.topic_partitions,
                        replication_factor=s.replication_factor, config=config)
               for name in names]
        existed = []
        for name, fut in admin.create_topics(new, operation_timeout=10).items():
            try:
                fut.result(timeout=15)
            except Exception as exc:
                if "already exists" in str(exc) or "TOPIC_ALREADY_EXISTS" in str(exc):
                    existed.append(name)
                else:
                    log.warning("could not create %s now (Faust will): %s", name, exc)
        if not existed:
            return
        entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                   for k, v in CHANGELOG_CONFIG.items()]
        resources = [ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=entries)
                     for name in existed]
        for res, fut in admin.incremental_alter_configs(resources).items():
            try:
                fut.result(timeout=15)
            except Exception as exc:
                log.warning("could not set the segment configs of %s: %s", res.name, exc)
    except Exception as exc:
        log.warning("could not create the changelog topics now (Faust will): %s", exc)


def create_worker(settings: VoiceSettings, agent: ConcernAgent | None = None,
                  client: Any = None) -> WorkerContext:
    """Build a worker (Faust app + every product) for the given settings.

    ``agent`` replaces the concern agent of conversation turns; ``client`` replaces the model
    client of every agent (a ``ModelPort`` fake, for tests and benchmarks).
    """
    ctx = WorkerContext(settings, client=client)
    ctx.register(*products(agent))
    return ctx


def use_uvloop() -> None:
    """Every event loop this process makes from now on is uvloop's (libuv): Faust's, its
    consumer thread's and the steps' (``consumers.workflows.steploop``). Meant to cost less
    per callback, socket write and cross-thread wake-up than asyncio's selector loop; off by
    default (``VOICE_WORKER_UVLOOP``) until it measures better."""
    import asyncio

    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run_worker(settings: VoiceSettings, loglevel: str = "warning", client: Any = None) -> None:
    """Run the worker in the foreground until SIGINT/SIGTERM."""
    from faust.worker import Worker as FaustWorker

    from streams.affinity import pin_threads
    from streams.heap import settle_heap

    pin_threads(settings.worker_pin_python)  # before its clients start their threads
    if settings.worker_uvloop:
        use_uvloop()
    w = create_worker(settings, client=client)
    declare_changelogs(w)
    fw = FaustWorker(w.app, loglevel=loglevel, quiet=True)
    # Faust's spinner sets the root logger to DEBUG, so every debug call of aiokafka and Faust
    # builds a record nobody prints: ~6 % of a worker's CPU (docs/benchmarks.md).
    fw.spinner = None
    settle_heap()  # built: out of every later full collection
    fw.execute_from_commandline()
