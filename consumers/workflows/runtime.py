"""The workflow engine inside the worker: applies records to state, runs steps as tasks.

A step never blocks the consumer's loop: it runs as an asyncio task and reports its outcome as
a ``StepOutcome`` record, which this workflow's owner applies like any other (so only the
agent, inside its stream, writes the table). The record that started the step is *held* (not
acknowledged) until the workflow stops running. Faust commits an
offset only up to the first unacknowledged record, so if this worker dies mid-step the
partition's next owner re-reads from the held record, finds the step running with no task
holding it, records the lost attempt and runs the step again. That is the lease.

Order inside one transition, per workflow under a lock: produce the records (and wait for the
broker's acks) → write the table → start the step task → acknowledge the input record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka.partitioner import murmur2

from consumers.engine.cancel import CancelToken
from consumers.workflows import engine
from consumers.workflows.engine import Pause, StepContext, Transition, WorkflowDef, WorkflowState
from schemas.base import Sealed
from schemas.workflow import StepOutcome, WorkflowCommandReceived, WorkflowStarted
from streams.envelope import Envelope
from streams.free_text import TextSealer, describe, open_text, seal_text
from streams.producer import Publisher
from streams.retry import Unprocessable
from streams.settings import VoiceSettings
from streams.topics import WORKFLOWS, topic_name

log = logging.getLogger(__name__)

SOURCE = "/voice/workflow-engine"


PROBE_EVERY_S = 5.0
"""A running workflow with no task is probed at most this often."""


def partition_of(key: str, partitions: int) -> int:
    """The partition a key's records land in (murmur2, as every producer here partitions)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def failure_words(sealer: TextSealer, state: WorkflowState) -> str:
    """A failed workflow's last failure in words, for a record that seals them again under
    its own content id: the code, and the message while it still opens (not after erasure)."""
    words = None
    if state.last_error_sealed is not None and state.sealed_by is not None:
        content_id = engine.error_content_id(state.workflow, state.step_index, state.attempt)
        words = open_text(sealer, state.sealed_by, content_id,
                          Sealed.model_validate(state.last_error_sealed))
    return f"{state.last_error}: {words}" if words else str(state.last_error)


class StepError(Exception):
    """A step's failure; ``retryable=False`` fails the workflow without more attempts."""

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class WorkflowRuntime:
    """Runs the registered workflow kinds for the partitions this worker owns."""

    def __init__(self, settings: VoiceSettings, table: Any, publisher: Publisher,
                 sealer: TextSealer | None = None) -> None:
        """``sealer`` seals failing steps' messages (``WorkflowDef.sealed_by``); without
        one only their codes are kept."""
        self.settings = settings
        self.sealer = sealer
        self.table = table
        self.publisher = publisher
        self.defs: dict[str, WorkflowDef] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._held: dict[str, tuple[Callable[[], Any], Any, int | None]] = {}
        """workflow → (ack of the record holding its lease, its topic-partition, its offset)"""
        self._slots = asyncio.Semaphore(settings.worker_concurrency)
        self._probed: dict[str, float] = {}
        self.cancels: dict[str, CancelToken] = {}
        """The cancel token of each step running here."""
        self.topic = topic_name(settings, WORKFLOWS)

    def register(self, wf: WorkflowDef) -> None:
        self.defs[wf.kind] = wf

    def _lock(self, workflow: str) -> asyncio.Lock:
        return self._locks.setdefault(workflow, asyncio.Lock())

    async def handle(self, env: Envelope, ack: Callable[[], Any], tp: Any = None,
                     offset: int | None = None) -> None:
        """Apply one voice.workflows record; ``ack`` is called now or when the step ends."""
        rec = env.record
        workflow = getattr(rec, "workflow", env.key)
        async with self._lock(workflow):
            state = WorkflowState.from_dict(self.table.get(workflow))
            t: Transition | None = None
            if isinstance(rec, WorkflowStarted):
                wf = self.defs.get(rec.kind)
                if wf is None:  # dead-lettered by the agent (``consumers.frame.failures``)
                    raise Unprocessable(f"no workflow kind {rec.kind!r} (workflow {workflow!r})")
                if state is None:
                    t = engine.start(wf, rec)
                    t.state.tenant = env.tenant or rec.input.get("tenant")
            elif isinstance(rec, WorkflowCommandReceived) and not self._same_tenant(state, env):
                log.warning("ignoring command %s of another tenant for workflow %r", env.id,
                            workflow)
            elif isinstance(rec, WorkflowCommandReceived) and rec.command == "cancel":
                token = self.cancels.get(workflow)
                if token is not None:  # running here (this worker owns the workflow)
                    token.cancel(f"cancelled by {rec.by}")
            elif isinstance(rec, WorkflowCommandReceived) and state is not None:
                t = engine.command(self.defs[state.kind], state, rec)
            elif isinstance(rec, StepOutcome) and state is not None:
                t = self._outcome(state, rec)
                if t is not None:
                    self.tasks.pop(workflow, None)
            if t is None and workflow in self.tasks:
                held = self._held.get(workflow)
                if held is not None and offset is not None and (held[1], held[2]) == (tp, offset):
                    # The held record itself, redelivered after a rebalance that kept the
                    # partition here: the step still runs, and this delivery now holds the
                    # lease. The old delivery is never acknowledged: Faust would take its
                    # offset as done and commit past the lease.
                    self._held[workflow] = (ack, tp, offset)
                else:
                    ack()  # a later record of a running workflow: the held one keeps the lease
                return
            if t is None and state is not None and state.status == "running":
                # Running, yet no task here holds it: its worker died mid-step.
                t = engine.worker_lost(self.defs[state.kind], state, self.settings.step_attempts)
            if t is None:
                ack()
                return
            await self._apply(t, env.correlation or workflow)
            if t.run_step:
                previous = self._held.pop(workflow, None)
                if previous is not None and (previous[1], previous[2]) != (tp, offset):
                    previous[0]()  # an earlier record: the lease moves to this one
                self._held[workflow] = (ack, tp, offset)
                self._spawn(t.state)
                return
            held = self._held.pop(workflow, None)
            if held is not None:
                held[0]()
            ack()

    @staticmethod
    def _same_tenant(state: WorkflowState | None, env: Envelope) -> bool:
        """Whether ``env`` may command the workflow: same tenant (or one not yet known)."""
        return state is None or state.tenant is None or env.tenant == state.tenant

    def _outcome(self, state: WorkflowState, rec: StepOutcome) -> Transition | None:
        if state.status != "running" or state.attempt != rec.attempt \
                or state.step_index != rec.step_index:
            return None  # superseded: a later attempt or another owner took over
        wf = self.defs[state.kind]
        if rec.status == "paused":
            return engine.step_paused(wf, state, Pause(rec.waiting_for or "command"))
        if rec.status == "failed":
            return engine.step_failed(wf, state, rec.error, rec.error_type or "Error",
                                      rec.retryable, self.settings.step_attempts,
                                      rec.sealed_error, rec.sealed_by)
        return engine.step_succeeded(wf, state, rec.output)

    async def _apply(self, t: Transition, correlation: str) -> None:
        s = t.state
        futs = []
        for e in t.emits:
            env = Envelope(record=e.record, key=s.workflow, source=SOURCE, subject=s.workflow,
                           seq=e.seq, tenant=s.tenant, correlation=correlation,
                           id=e.id(s.workflow))
            futs.append(self._send(env))
        for f in futs:
            await f
        self.table[s.workflow] = s.to_dict()
        if t.ended:
            wf = self.defs[s.kind]
            if wf.on_end is not None:
                await wf.on_end(s)

    def _send(self, env: Envelope) -> Any:
        return self.publisher.produce(WORKFLOWS, env)

    def _spawn(self, state: WorkflowState) -> None:
        task = asyncio.get_running_loop().create_task(self._run_step(state))
        self.tasks[state.workflow] = task

    async def _run_step(self, state: WorkflowState) -> None:
        """Run the step and report its outcome as a record (the task never writes state)."""
        wf = self.defs[state.kind]
        step = wf.step(state.step_index)
        cancel = self.cancels[state.workflow] = CancelToken()
        ctx = StepContext(workflow=state.workflow, kind=state.kind, step=step.name,
                          attempt=state.attempt, input=state.input, outputs=state.outputs,
                          commands=state.commands, cancel=cancel)
        report = dict(workflow=state.workflow, step=step.name, step_index=state.step_index,
                      attempt=state.attempt)
        try:
            async with self._slots:
                result = await step.run(ctx)
            if isinstance(result, Pause):
                outcome = StepOutcome(**report, status="paused", waiting_for=result.waiting_for)
            else:
                outcome = StepOutcome(**report, status="succeeded", output=result)
        except asyncio.CancelledError:
            raise  # keep_only() let go of it; the partition's new owner resumes it
        except Exception as exc:  # a step's failure is a record, never a crash
            # Its message may quote a model or a participant: sealed in the record, only
            # described (type, fields) in the log.
            log.warning("step %s of %s failed (attempt %s): %s", step.name, state.workflow,
                        state.attempt, describe(exc))
            outcome = StepOutcome(**report, status="failed", error_type=type(exc).__name__,
                                  retryable=getattr(exc, "retryable", True),
                                  **self._sealed_message(wf, state, exc))
        if self.cancels.get(state.workflow) is cancel:
            del self.cancels[state.workflow]
        env = Envelope(record=outcome, key=state.workflow, source=SOURCE,
                       subject=state.workflow, tenant=state.tenant, correlation=state.workflow,
                       id=f"{state.workflow}:outcome:{state.step_index}:{state.attempt}")
        try:
            await self._send(env)
        except Exception:
            log.exception("reporting the outcome of %s failed", state.workflow)

    def _sealed_message(self, wf: WorkflowDef, state: WorkflowState, exc: Exception
                        ) -> dict[str, Any]:
        """A failed step's message sealed under its workflow's aggregate; without one (or
        when sealing fails, e.g. the aggregate was erased) the outcome keeps the code only."""
        key = wf.sealed_by(state.input) if wf.sealed_by is not None else None
        text = str(exc) or repr(exc)
        if key is None or self.sealer is None:
            return {}
        content_id = engine.error_content_id(state.workflow, state.step_index, state.attempt)
        try:
            return {"sealed_error": seal_text(self.sealer, key, content_id, text),
                    "sealed_by": key}
        except Exception as sealing:
            log.warning("the message of %s's failure was dropped, not sealed: %s",
                        state.workflow, describe(sealing))
            return {}

    def unheld(self, active_partitions: set[int], partitions: int) -> list[str]:
        """Running workflows of this worker's partitions that no local task holds.

        Kafka cannot be trusted to redeliver a step's record after a crash (Faust may commit
        past an unacknowledged record), so the owner also looks at its table: each of these gets
        a ``LeaseCheck`` record, and consuming it resumes the step (``worker_lost``).
        """
        now = time.monotonic()
        out = []
        for workflow, d in list(self.table.items()):
            if not d or d.get("status") != "running" or workflow in self.tasks:
                continue
            if partition_of(workflow, partitions) not in active_partitions:
                continue  # a standby copy: another worker owns it
            if now - self._probed.get(workflow, 0.0) < PROBE_EVERY_S:
                continue
            self._probed[workflow] = now
            out.append(workflow)
        return out

    def keep_only(self, assigned: set[Any]) -> None:
        """After a rebalance: stop steps whose partition went elsewhere (its owner resumes them)."""
        for workflow, (_ack, tp, _offset) in list(self._held.items()):
            if tp is not None and tp not in assigned:
                task = self.tasks.pop(workflow, None)
                if task is not None:
                    task.cancel()
                self._held.pop(workflow, None)
                self.cancels.pop(workflow, None)


