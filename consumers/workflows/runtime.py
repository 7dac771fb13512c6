"""The workflow engine inside the worker: applies records to state, runs steps as tasks.

A step never blocks the consumer's loop: it runs as an asyncio task and reports its outcome as
a ``StepOutcome`` record, which this workflow's owner applies like any other. A kind whose
outcome no reader needs (a turn's: ``WorkflowDef.outcome_recorded``) has it applied by the
step's own task instead, under the workflow's lock, as if handling the record that holds its
lease (Faust's current event, counted in flight for a handover) — one record and one consume
fewer a step; without the lease it is recorded all the same. The record that started the step
is *held* (not acknowledged) until the workflow stops running. Faust commits an
offset only up to the first unacknowledged record, so if this worker dies mid-step the
partition's next owner re-reads from the held record, finds the step running with no task
holding it, records the lost attempt and runs the step again. That is the lease.

Order inside one transition, per workflow under a lock: produce the records (and wait for the
broker's acks) → write the table → answer the commands it decided (``CommandAcknowledged``,
delivery not awaited, as the writer's: what it announces is durable) → start the step task, or
(the workflow ended) run its ``on_end`` and mark it settled in the table → acknowledge the
input record. A command is decided by ``consumers.workflows.commands``: at once, or — while the
workflow is between two states — as soon as it reaches the next one. A worker that dies before
the settled mark leaves an ended, unsettled workflow, whose owner runs ``on_end`` again (its
effects carry ids derived from the workflow, so they land once).

Every step attempt has a deadline (``VOICE_STEP_DEADLINE_S``): past it the step is stopped and
fails ``DEADLINE_EXCEEDED``, not retried, so its workflow fails and ``on_end`` ends its turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import faust.streams as faust_streams

from consumers.engine.cancel import CancelToken
from consumers.frame.aggregate import Ack
from consumers.frame.failures import InFlight
from consumers.frame.writer import Raw, answer_to
from consumers.workflows import commands, engine
from consumers.workflows.engine import Pause, StepContext, Transition, WorkflowDef, WorkflowState
from consumers.workflows.steploop import StepLoop
from schemas.base import Sealed
from schemas.workflow import (
    FORGET_AT_MOST,
    StepOutcome,
    WorkflowCommandReceived,
    WorkflowsForgotten,
    WorkflowStarted,
)
from streams.crashpoints import CrashPoints
from streams.envelope import Envelope
from streams.free_text import TextSealer, describe, open_text, seal_text
from streams.producer import Publisher
from streams.retry import Unprocessable
from streams.settings import VoiceSettings
from streams.topics import ACKS, WORKFLOWS, partition_of, topic_name

log = logging.getLogger(__name__)

SOURCE = "/voice/workflow-engine"

DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
"""The error type of a step stopped at its deadline (and the code of a turn ended at its)."""


CHANGELOG_SENT_S = 1.0
"""Tests only: how long past the linger (``VOICE_WORKER_CHANGELOG_LINGER_S``, at most what a
table write is held back) the ``before_turn_over`` crash point waits for the table's
changelog."""

PROBE_EVERY_S = 5.0
"""A running workflow with no task is probed at most this often."""
FULL_LOOK_S = 60.0
"""``unheld`` looks at every workflow of the table at least this often."""


ENDED = ("completed", "failed")


def _needs_owner(d: dict[str, Any] | None) -> bool:
    """Whether a workflow's stored state needs its owner when no task of it runs: running,
    or ended with its ``on_end`` not yet run."""
    if not d:
        return False
    status = d.get("status")
    return status == "running" or (d.get("settled") is False and status in ENDED)


def _may_forget(d: dict[str, Any] | None, ended_before: float, oldest_held: int | None
                ) -> bool:
    """Whether a ``WorkflowsForgotten`` of ``ended_before`` may drop this stored state: ended,
    settled, ended before then, and by a record older than any this partition holds a lease
    with (a worker dying now is redelivered from the oldest: no record of it is among them)."""
    if not d or d.get("status") not in ENDED or d.get("settled") is False:
        return False
    ended_at, ended_offset = d.get("ended_at"), d.get("ended_offset")
    if ended_at is not None and ended_at > ended_before:
        return False
    return oldest_held is None or ended_offset is None or ended_offset < oldest_held


def address(env: Envelope) -> commands.Address:
    """Where the answer to the command ``env`` carries goes (the edge waits on its id)."""
    return {"workflow": env.key, "id": env.id, "tenant": env.tenant,
            "correlation": env.correlation}


def failure_words(sealer: TextSealer, state: WorkflowState) -> str:
    """A failed workflow's last failure in words, for a record that seals them again under
    its own content id: the code, and the message while it still opens (not after erasure)."""
    words = None
    if state.last_error_sealed is not None and state.sealed_by is not None:
        content_id = engine.error_content_id(state.workflow, state.step_index, state.attempt)
        words = open_text(sealer, state.sealed_by, content_id,
                          Sealed.model_validate(state.last_error_sealed))
    return f"{state.last_error}: {words}" if words else str(state.last_error)


def outcome_transition(wf: WorkflowDef, state: WorkflowState, rec: StepOutcome,
                       max_attempts: int) -> Transition | None:
    """The transition a step's reported outcome makes (None when superseded). Pure: the
    runtime applies it, and a replay folds a recorded workflow with it (``deploy.rerun_steps``)."""
    if state.status != "running" or state.attempt != rec.attempt \
            or state.step_index != rec.step_index:
        return None  # superseded: a later attempt or another owner took over
    if rec.status == "paused":
        t = engine.step_paused(wf, state, Pause(rec.waiting_for or "command"))
    elif rec.status == "failed":
        t = engine.step_failed(wf, state, rec.error, rec.error_type or "Error", rec.retryable,
                               max_attempts, rec.sealed_error, rec.sealed_by)
    else:
        t = engine.step_succeeded(wf, state, rec.output)
    commands.settle(wf, t)  # the commands that waited for this state
    return t


@contextlib.contextmanager
def _handling(ack: Callable[[], Any]) -> Iterator[None]:
    """For the block, Faust's current event is the one whose ``ack`` this is (the lease's
    record: ``WorkerContext`` hands the runtime ``event.ack``), as in the stream handling it.
    Nothing changes for an ``ack`` of no event (a test's)."""
    event = getattr(ack, "__self__", None)
    if getattr(event, "message", None) is None:
        yield
        return
    token = faust_streams._current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        faust_streams._current_event.reset(token)


class _Locked:
    """A workflow's lock, dropped from its map once nobody holds or waits for it: the map
    kept one for every workflow ever run (~210 bytes each), for good."""

    __slots__ = ("_by", "_key", "_lock", "_users")

    def __init__(self, by: dict[str, _Locked], key: str) -> None:
        self._by, self._key = by, key
        self._lock = asyncio.Lock()
        self._users = 0

    async def __aenter__(self) -> None:
        self._users += 1
        try:
            await self._lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        self._leave()

    def _leave(self) -> None:
        self._users -= 1
        if self._users == 0:
            del self._by[self._key]


class StepError(Exception):
    """A step's failure; ``retryable=False`` fails the workflow without more attempts."""

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class Erased(StepError):
    """The step's aggregate was erased: its key is gone, nothing of it can be read again.

    Its words stay plain (they name the aggregate, never its content): the sealed copy of a
    failure is sealed under the aggregate's key, which no longer exists, so plain is the only
    place an owner or an operator can read why the step ended."""

    plain_message = True

    def __init__(self, kind: str, id_: str) -> None:
        super().__init__(f"{kind} {id_!r} was erased", retryable=False)


class WorkflowRuntime:
    """Runs the registered workflow kinds for the partitions this worker owns."""

    def __init__(self, settings: VoiceSettings, table: Any, publisher: Publisher,
                 sealer: TextSealer | None = None, steps: StepLoop | None = None,
                 crash: CrashPoints | None = None, in_flight: InFlight | None = None
                 ) -> None:
        """``sealer`` seals failing steps' messages (``WorkflowDef.sealed_by``); without
        one only their codes are kept. ``steps``: the loop steps run on (the worker's own, so
        a step never delays its writer); without one they run on the caller's loop.
        ``crash``: the worker's test crash points (none by default). ``in_flight``: what a
        handover waits for (the app's), where an outcome applied in its step's task counts."""
        self.settings = settings
        self.steps = steps
        self.sealer = sealer
        self.table = table
        self.publisher = publisher
        self.defs: dict[str, WorkflowDef] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._spawned: dict[str, float] = {}
        """When each task of ``tasks`` was started (``snapshot``)."""
        self._locks: dict[str, _Locked] = {}
        self._held: dict[str, tuple[Callable[[], Any], Any, int | None]] = {}
        """workflow → (ack of the record holding its lease, its topic-partition, its offset)"""
        self._slots = asyncio.Semaphore(settings.worker_concurrency)
        self._probed: dict[str, float] = {}
        self._unfinished: set[str] = set()
        """Workflows last seen running or unsettled (``unheld`` looks at them each time)."""
        self._looked_for: tuple[frozenset[int], bool] | None = None
        self._looked_at = 0.0
        """What ``unheld`` last looked at every workflow for, and when."""
        self._forgettable: dict[int, list[str]] = {}
        self._forget_before = 0.0
        """Per partition: the ended, settled workflows that ended before ``_forget_before``
        (``VOICE_WORKFLOW_RETAIN_S`` before the last look at every workflow)."""
        self._ended_unstamped: dict[str, float] = {}
        """Ended workflows stored without ``ended_at`` (before it was kept): when a look at
        every workflow first saw them, which stands for it."""
        self.cancels: dict[str, CancelToken] = {}
        """The cancel token of each step running here."""
        self.topic = topic_name(settings, WORKFLOWS)
        self.crash = crash or CrashPoints()
        self.in_flight = in_flight or InFlight()
        self._answers: set[asyncio.Future[Any]] = set()
        self._handing_over = False
        """Between ``release_leases`` and the next ``keep_only``: hold no record."""
        self._mine: set[tuple[int, int]] = set()
        """Where the records this runtime wrote since its last rebalance landed (partition,
        offset), until its agent reads them back (``already_applied``)."""

    def register(self, wf: WorkflowDef) -> None:
        self.defs[wf.kind] = wf

    def _locked(self, workflow: str) -> _Locked:
        """``workflow``'s lock, to hold (``async with``): its records are applied one at a
        time."""
        entry = self._locks.get(workflow)
        if entry is None:
            entry = self._locks[workflow] = _Locked(self._locks, workflow)
        return entry

    async def handle(self, env: Envelope, ack: Callable[[], Any], tp: Any = None,
                     offset: int | None = None) -> None:
        """Apply one voice.workflows record; ``ack`` is called now or when the step ends."""
        rec = env.record
        if isinstance(rec, WorkflowsForgotten):
            await self._forget(rec, env.key, tp)
            ack()
            return
        workflow = getattr(rec, "workflow", env.key)
        async with self._locked(workflow):
            state = WorkflowState.from_dict(self.table.get(workflow))
            t: Transition | None = None
            if isinstance(rec, WorkflowStarted):
                wf = self.defs.get(rec.kind)
                if wf is None:  # dead-lettered by the agent (``consumers.frame.failures``)
                    raise Unprocessable(f"no workflow kind {rec.kind!r} (workflow {workflow!r})")
                if state is None:
                    t = engine.start(wf, rec)
                    t.state.tenant = env.tenant or rec.input.get("tenant")
            elif isinstance(rec, WorkflowCommandReceived) and rec.command == "cancel":
                token = self.cancels.get(workflow)
                if token is not None and self._same_tenant(state, env):  # running here
                    if self.steps is not None:  # the token belongs to the step's loop
                        self.steps.call(token.cancel, f"cancelled by {rec.by}")
                    else:
                        token.cancel(f"cancelled by {rec.by}")
            elif isinstance(rec, WorkflowCommandReceived):
                if state is None or not self._same_tenant(state, env):
                    # Not this tenant's to command: as if there were no such workflow.
                    self._answer(address(env), Ack.rejected(f"no such workflow {workflow!r}"))
                else:
                    t = engine.Transition(state.copied())
                    commands.receive(self.defs[state.kind], t, rec, address(env))
            elif isinstance(rec, StepOutcome) and state is not None:
                t = self._outcome(state, rec)
                if t is not None:
                    self.tasks.pop(workflow, None)
                    self._spawned.pop(workflow, None)
            if t is not None and not t.emits:
                # A command refused, queued or answered again: its state and answers only; the
                # record is then treated like any other that changes no step.
                await self._apply(t, env.correlation or workflow, offset)
                state, t = t.state, None
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
                commands.settle(self.defs[state.kind], t)
            if t is None and state is not None and not state.settled \
                    and state.status in ("completed", "failed"):
                # Ended, but its worker died before the turn-over bookkeeping: run it now.
                await self._settle(state)
            if t is None:
                ack()
                return
            await self._apply(t, env.correlation or workflow, offset)
            self._hand_on(t, ack, tp, offset)

    def _hand_on(self, t: Transition, ack: Callable[[], Any], tp: Any, offset: int | None
                 ) -> None:
        """After ``t`` is made for the record at ``tp``/``offset`` (``ack``): start the next
        step, that record now holding the lease, or let go of the lease and the record."""
        workflow = t.state.workflow
        previous = self._held.pop(workflow, None)
        if previous is not None and (previous[1], previous[2]) != (tp, offset):
            previous[0]()  # an earlier record: the lease moves to this one, or ends
        if not t.run_step:
            ack()
            return
        if self._handing_over:
            ack()  # the table is the lease now (``release_leases``)
        else:
            self._held[workflow] = (ack, tp, offset)
        self._spawn(t.state)

    @staticmethod
    def _same_tenant(state: WorkflowState | None, env: Envelope) -> bool:
        """Whether ``env`` may command the workflow: same tenant (or one not yet known)."""
        return state is None or state.tenant is None or env.tenant == state.tenant

    def _outcome(self, state: WorkflowState, rec: StepOutcome) -> Transition | None:
        return outcome_transition(self.defs[state.kind], state, rec, self.settings.step_attempts)

    async def _apply(self, t: Transition, correlation: str, offset: int | None = None
                     ) -> None:
        """Make ``t``: its records, its state, its answers, and (ended) its ``on_end``;
        ``offset``: of the record whose handling makes it."""
        s = t.state
        if t.ended:
            s.ended_at, s.ended_offset = time.time(), offset
        elif s.status not in ENDED:
            s.ended_at = s.ended_offset = None
        # Ended: unsettled until ``_settle`` has run its on_end (when it acts on this end).
        # Running again (a retried failure): its next end settles it.
        wf = self.defs[s.kind]
        s.settled = not (t.ended and wf.on_end is not None and s.status in wf.on_end_when)
        futs = []
        for e in t.emits:
            env = Envelope(record=e.record, key=s.workflow, source=SOURCE, subject=s.workflow,
                           seq=e.seq, tenant=s.tenant, correlation=correlation,
                           id=e.id(s.workflow))
            futs.append(self._send(env))
        for f in futs:
            self._landed(await f)
        self._write(s)
        for where, answer in t.answers:
            self._answer(where, answer)
        if not s.settled:
            await self._settle(s)

    async def _settle(self, state: WorkflowState) -> None:
        """Run an ended workflow's ``on_end`` (e.g. end its turn), then mark it settled.

        Called inside the stream (the table may be written): after the transition that ended
        it, and again for an ended workflow still unsettled — its worker died in between —
        when a record of it is consumed (a redelivery, or the owner's ``LeaseCheck``). The
        effects of ``on_end`` carry ids derived from the workflow, so a second run lands once.
        """
        if self.crash.armed("before_turn_over", state.workflow):
            # Tests only: the worst case, where the workflow's end has reached the table's
            # changelog too (held back at most the linger), so the next owner finds the
            # workflow ended — not running, which would re-derive the end from its record.
            await asyncio.sleep(self.settings.worker_changelog_linger_s + CHANGELOG_SENT_S)
            self.crash.hit("before_turn_over", state.workflow)
        wf = self.defs[state.kind]
        if wf.on_end is not None:
            await wf.on_end(state)
        state.settled = True
        self._write(state)

    def _write(self, state: WorkflowState) -> None:
        """Store ``state``, noting whether it may need an owner later (``unheld``)."""
        d = state.to_dict()
        self.table[state.workflow] = d
        if _needs_owner(d):
            self._unfinished.add(state.workflow)
        else:
            self._unfinished.discard(state.workflow)

    def _answer(self, where: commands.Address, answer: Ack) -> None:
        """Produce a command's ``CommandAcknowledged`` (its delivery is not awaited: a lost
        one costs its caller a 503 and a retry, answered again from ``decided``)."""
        env = answer_to(where["id"], where["workflow"], where.get("tenant"),
                        where.get("correlation"), answer, SOURCE)
        delivery = asyncio.ensure_future(self.publisher.produce(ACKS, env))
        self._answers.add(delivery)
        delivery.add_done_callback(self._answered)

    def _answered(self, delivery: asyncio.Future[Any]) -> None:
        self._answers.discard(delivery)
        if not delivery.cancelled() and delivery.exception() is not None:
            log.warning("a workflow command's answer was not delivered: %s",
                        delivery.exception())

    def _send(self, env: Envelope) -> Any:
        return self.publisher.produce(WORKFLOWS, env)

    def _landed(self, delivered: Any) -> None:
        """Note where a record of ``_apply`` landed (its delivery report), for
        ``already_applied``."""
        partition, offset = getattr(delivered, "partition", None), getattr(delivered, "offset",
                                                                           None)
        if callable(partition) and callable(offset):
            self._mine.add((partition(), offset()))

    def already_applied(self, raw: Raw) -> bool:
        """Whether ``raw`` is a record this runtime wrote itself and ``handle`` would only
        acknowledge, so its agent acknowledges it unread (issue 14: two of a turn's four
        workflow records are its own ``StepStarted`` and ``LastStepSucceeded``, read back).

        Exact: the record is one of ``_apply``'s, found by where it landed — a lifecycle record
        (``StepStarted`` … ``WorkflowResumed``), never one ``handle`` decides on (a start, a
        command, an outcome, a probe, a forgetting) — and its workflow either has its step
        running here (``handle`` acknowledges any later record of it) or is neither running
        nor ended unsettled in what this runtime wrote (``handle`` finds nothing to do). After
        a rebalance nothing counts as this runtime's (``keep_only``, ``release_leases``):
        the table may then hold a state this runtime did not write, which the record wakes
        (``worker_lost``)."""
        if raw.partition is None or raw.offset is None:
            return False
        spot = (raw.partition, raw.offset)
        if spot not in self._mine:
            return False
        self._mine.discard(spot)
        workflow = (raw.key or b"").decode("utf-8", "replace")
        return workflow in self.tasks or workflow not in self._unfinished

    def _spawn(self, state: WorkflowState) -> None:
        task = asyncio.get_running_loop().create_task(self._run_step(state))
        self.tasks[state.workflow] = task
        self._spawned[state.workflow] = time.monotonic()

    async def _run_step(self, state: WorkflowState) -> None:
        """Run the step, then apply its outcome here (``_apply_here``) or report it as a
        record."""
        wf = self.defs[state.kind]
        step = wf.step(state.step_index)
        cancel = self.cancels[state.workflow] = CancelToken()
        ctx = StepContext(workflow=state.workflow, kind=state.kind, step=step.name,
                          attempt=state.attempt, input=state.input, outputs=state.outputs,
                          commands=state.commands, cancel=cancel)
        report = dict(workflow=state.workflow, step=step.name, step_index=state.step_index,
                      attempt=state.attempt)
        deadline: asyncio.Timeout | None = None
        try:
            async with self._slots:
                self.crash.hit("before_step", state.workflow)
                # From when the step runs, not while it waits for a slot.
                deadline = asyncio.timeout(self.settings.step_deadline_s)
                async with deadline:
                    result = await (step.run(ctx) if self.steps is None
                                    else self.steps.run(step.run(ctx)))
            if isinstance(result, Pause):
                outcome = StepOutcome(**report, status="paused", waiting_for=result.waiting_for)
            else:
                outcome = StepOutcome(**report, status="succeeded", output=result)
        except asyncio.CancelledError:
            raise  # keep_only() let go of it; the partition's new owner resumes it
        except TimeoutError as exc:
            outcome = (self._overdue(report, state, step.name)
                       if deadline is not None and deadline.expired()
                       else self._failure(report, wf, state, step.name, exc))
        except Exception as exc:  # a step's failure is a record, never a crash
            outcome = self._failure(report, wf, state, step.name, exc)
        if self.cancels.get(state.workflow) is cancel:
            del self.cancels[state.workflow]
        if not wf.outcome_recorded and await self._apply_here(outcome):
            return
        env = Envelope(record=outcome, key=state.workflow, source=SOURCE,
                       subject=state.workflow, tenant=state.tenant, correlation=state.workflow,
                       id=f"{state.workflow}:outcome:{state.step_index}:{state.attempt}")
        try:
            await self._send(env)
        except Exception:
            log.exception("reporting the outcome of %s failed", state.workflow)

    async def _apply_here(self, outcome: StepOutcome) -> bool:
        """Apply a step's ``outcome`` in the step's own task (``WorkflowDef.outcome_recorded``
        false), as ``handle`` applies its record, the record holding the lease standing as the
        one handled: Faust's current event (a table write's changelog partition, the
        write-behind's cause), in flight for a handover to wait on. False, nothing done, when
        this task holds no lease (a handover under way; another attempt took over) or the
        outcome changes nothing: the caller records it then, as for any kind."""
        workflow = outcome.workflow
        async with self._locked(workflow):
            held = self._held.get(workflow)
            if held is None or self._handing_over \
                    or self.tasks.get(workflow) is not asyncio.current_task():
                return False
            state = WorkflowState.from_dict(self.table.get(workflow))
            t = None if state is None else self._outcome(state, outcome)
            if t is None:
                return False
            ack, tp, offset = held
            lease = Raw(self.topic, getattr(tp, "partition", None), offset,
                        workflow.encode(), None, None)
            with self.in_flight.handling(lease), _handling(ack):
                self.tasks.pop(workflow, None)
                self._spawned.pop(workflow, None)
                try:
                    await self._apply(t, workflow, offset)
                except Exception:
                    # Its state stays running, or ended unsettled: its owner probes it
                    # (``unheld``) and resumes or settles it, as after a worker's death.
                    log.exception("applying the outcome of %s failed", workflow)
                    return True
                self._hand_on(t, ack, tp, offset)
            return True

    def _overdue(self, report: dict[str, Any], state: WorkflowState, step: str
                 ) -> StepOutcome:
        """The outcome of a step stopped at its deadline (Voice's own words: plain)."""
        log.warning("step %s of %s ran over its deadline (attempt %s)", step, state.workflow,
                    state.attempt)
        return StepOutcome(**report, status="failed", error_type=DEADLINE_EXCEEDED,
                           error=f"step {step!r} ran over its deadline (VOICE_STEP_DEADLINE_S"
                                 f" = {self.settings.step_deadline_s:g} s)",
                           retryable=False)

    def _failure(self, report: dict[str, Any], wf: WorkflowDef, state: WorkflowState,
                 step: str, exc: Exception) -> StepOutcome:
        """The outcome of a step that raised ``exc``."""
        # Its message may quote a model or a participant: sealed in the record, only
        # described (type, fields) in the log.
        log.warning("step %s of %s failed (attempt %s): %s", step, state.workflow,
                    state.attempt, describe(exc))
        if getattr(type(exc), "plain_message", False):  # Voice's own words: kept plain
            return StepOutcome(**report, status="failed", error_type=type(exc).__name__,
                               error=str(exc), retryable=getattr(exc, "retryable", True))
        return StepOutcome(**report, status="failed", error_type=type(exc).__name__,
                           retryable=getattr(exc, "retryable", True),
                           **self._sealed_message(wf, state, exc))

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

    def unheld(self, active_partitions: set[int], partitions: int, ready: bool = True
               ) -> list[str]:
        """Workflows of this worker's partitions that need their owner: running with no local
        task holding them, or ended with their ``on_end`` not yet run (``settled`` false).

        Kafka cannot be trusted to redeliver a step's record after a crash (Faust may commit
        past an unacknowledged record), so the owner also looks at its table: each of these gets
        a ``LeaseCheck`` record, and consuming it resumes the step (``worker_lost``) or runs
        the bookkeeping (``_settle``).

        Every workflow's state stays in the table once it has ended, so looking at all of them
        each second grew with every turn the partitions ever ran (12 ms a look in a worker
        whose stack had run a few thousand turns: docs/benchmarks.md, issue 14, twenty-fourth
        pass). It looks at all of them when what the table may hold changed since its last
        look at all — other active partitions, or ``ready`` (tables read back: Faust not
        recovering nor rebalancing) changed — and at least every ``FULL_LOOK_S``; in between
        only at those it last saw needing an owner or wrote itself running or unsettled.

        A look at all, once the tables are back, also notes what may be forgotten
        (``forgettable``).
        """
        now = time.monotonic()
        key = (frozenset(active_partitions), ready)
        if key != self._looked_for or now - self._looked_at >= FULL_LOOK_S:
            self._looked_for, self._looked_at = key, now
            self._look_at_all(active_partitions, partitions, ready)
        out = []
        for workflow in sorted(self._unfinished):
            d = self.table.get(workflow)
            if not _needs_owner(d):
                self._unfinished.discard(workflow)
                self._probed.pop(workflow, None)
                continue
            if workflow in self.tasks:
                continue
            if partition_of(workflow, partitions) not in active_partitions:
                continue  # a standby copy: another worker owns it
            if now - self._probed.get(workflow, 0.0) < PROBE_EVERY_S:
                continue
            self._probed[workflow] = now
            out.append(workflow)
        return out

    def _look_at_all(self, active_partitions: set[int], partitions: int, ready: bool) -> None:
        """One pass over the table: the workflows needing an owner, and (tables back) those
        of our partitions ended and settled longer than ``VOICE_WORKFLOW_RETAIN_S`` ago."""
        wall = time.time()
        before = wall - self.settings.workflow_retain_s
        unfinished: set[str] = set()
        forgettable: dict[int, list[str]] = {}
        unstamped: dict[str, float] = {}
        for workflow, d in list(self.table.items()):
            if _needs_owner(d):
                unfinished.add(workflow)
                continue
            if not ready or not d or d.get("status") not in ENDED:
                continue
            ended_at = d.get("ended_at")
            if ended_at is None:
                ended_at = unstamped[workflow] = self._ended_unstamped.get(workflow, wall)
            if ended_at <= before and workflow not in self.tasks:
                partition = partition_of(workflow, partitions)
                if partition in active_partitions:
                    forgettable.setdefault(partition, []).append(workflow)
        self._unfinished = unfinished
        if ready:
            self._ended_unstamped = unstamped
            self._forgettable, self._forget_before = forgettable, before

    def forgettable(self) -> list[WorkflowsForgotten]:
        """The records that make this worker's partitions forget their workflows ended and
        settled longer than ``VOICE_WORKFLOW_RETAIN_S`` ago, as the last look at every
        workflow found them (each once; keyed by their first workflow). Their owner checks
        each again when it consumes them (``_forget``)."""
        out = []
        for partition in sorted(self._forgettable):
            workflows = sorted(self._forgettable[partition])
            for i in range(0, len(workflows), FORGET_AT_MOST):
                out.append(WorkflowsForgotten(workflows=workflows[i:i + FORGET_AT_MOST],
                                              ended_before=self._forget_before))
        self._forgettable = {}
        return out

    async def _forget(self, rec: WorkflowsForgotten, key: str, tp: Any) -> None:
        """Drop the stored state of each workflow ``rec`` names that is of its partition,
        runs nowhere here, and may still be forgotten (``_may_forget``): a tombstone in the
        table's changelog, so a worker reading the table back no longer reads it."""
        partitions = self.settings.topic_partitions
        here = partition_of(key, partitions)
        oldest_held = min((o for _ack, t, o in self._held.values() if t == tp and o is not None),
                          default=None)
        forgotten = 0
        for workflow in rec.workflows:
            if partition_of(workflow, partitions) != here or workflow in self.tasks:
                continue  # another partition's (its tombstone would land in this one's)
            async with self._locked(workflow):
                if not _may_forget(self.table.get(workflow), rec.ended_before, oldest_held):
                    continue
                del self.table[workflow]
            self._unfinished.discard(workflow)
            self._probed.pop(workflow, None)
            self._ended_unstamped.pop(workflow, None)
            forgotten += 1
        log.info("forgot %d of %d ended workflows of partition %d", forgotten,
                 len(rec.workflows), here)

    def snapshot(self) -> dict[str, Any]:
        """What this runtime holds now, for an operator (``consumers.frame.state_dump``): each
        step task (seconds since it started, whether it has finished — a finished one waits
        for its outcome record to come back, or for the lock to apply it), each lease (the
        record held, which the partition's commit cannot pass), the workflows whose lock is
        held or awaited, the free step slots, and whether a handover is under way."""
        now = time.monotonic()
        return {
            "steps": {workflow: {"for_s": round(now - self._spawned.get(workflow, now), 1),
                                 "finished": task.done()}
                      for workflow, task in sorted(self.tasks.items())},
            "leases": {workflow: f"{getattr(tp, 'topic', tp)}[{getattr(tp, 'partition', '?')}]"
                                 f"@{offset}"
                       for workflow, (_ack, tp, offset) in sorted(self._held.items())},
            "locked": sorted(self._locks),
            "free_step_slots": self._slots._value,
            "handing_over": self._handing_over,
        }

    def release_leases(self) -> None:
        """Before this worker hands its partitions over (a rebalance, a shutdown): acknowledge
        every held lease record, so that the handover can wait for the records in flight and
        flush the table's changelog (``consumers.frame.context.VoiceApp``) — a held record
        would make that wait last as long as its step.

        The steps go on running. From here the table is their lease: a worker that gets their
        partition finds them running with no task of its own and probes them (``unheld`` →
        ``LeaseCheck`` → ``worker_lost``); a step's late outcome for a superseded attempt is
        ignored (``_outcome``); ``keep_only`` stops them here if their partition went elsewhere.
        """
        self._handing_over = True  # a record in flight that starts a step holds nothing
        self._mine.clear()
        for ack, _tp, _offset in self._held.values():
            ack()
        self._held.clear()

    def keep_only(self, assigned: set[Any]) -> None:
        """After a rebalance: stop the steps whose workflow's partition went elsewhere (its
        next owner resumes them); ``assigned`` holds topic-partitions (``.topic``,
        ``.partition``)."""
        self._handing_over = False
        self._mine.clear()
        mine = {tp.partition for tp in assigned if tp.topic == self.topic}
        for workflow in list(self.tasks):
            if partition_of(workflow, self.settings.topic_partitions) in mine:
                continue
            task = self.tasks.pop(workflow, None)
            if task is not None:
                task.cancel()
            self._spawned.pop(workflow, None)
            self._held.pop(workflow, None)
            self.cancels.pop(workflow, None)
