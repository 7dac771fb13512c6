"""The workflow engine's pure part: definitions, state, and the transitions between them.

Nothing here does I/O. Each transition takes the state and an event and returns the new state
and the lifecycle records to produce, with dense per-workflow seqs and ids derived from them
(``{workflow}:{seq}``), so a replayed transition produces identical records.

Retries are immediate and bounded (``attempts``); a step that waits for someone outside Voice
returns ``Pause`` and a command resumes it (``consumers.workflows.commands`` decides each
command and answers it); a worker that died mid-step shows up as a running step no task
holds, recorded as a failed attempt (``WorkerLost``) and retried elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from consumers.engine.cancel import CancelToken
from consumers.frame.aggregate import Ack, json_copy
from schemas.base import Record, Sealed
from schemas.workflow import (
    LastStepSucceeded,
    StepFailed,
    StepStarted,
    StepSucceeded,
    WorkflowCommandReceived,
    WorkflowFailed,
    WorkflowPaused,
    WorkflowResumed,
    WorkflowStarted,
)

Status = Literal["running", "paused", "completed", "failed"]


@dataclass(frozen=True)
class Pause:
    """A step's answer when it must wait for a command (``waiting_for`` names which)."""

    waiting_for: str


@dataclass(frozen=True)
class StepContext:
    """What a step sees: the workflow's input, earlier outputs, commands received, attempt."""

    workflow: str
    kind: str
    step: str
    attempt: int
    input: dict[str, Any]
    outputs: dict[str, dict[str, Any]]
    commands: dict[str, dict[str, Any]]
    cancel: CancelToken = field(default_factory=CancelToken)
    """Set by a ``cancel`` command while the step runs; a step hands it to its agent."""


StepFn = Callable[[StepContext], Awaitable[dict[str, Any] | Pause]]


@dataclass(frozen=True)
class StepDef:
    name: str
    run: StepFn


@dataclass(frozen=True)
class WorkflowDef:
    """A kind of workflow: its ordered steps and what happens when it ends."""

    kind: str
    steps: tuple[StepDef, ...]
    on_end: Callable[[WorkflowState], Awaitable[None]] | None = None
    """Called once the workflow completed or failed (e.g. record the turn's outcome)."""
    on_end_when: tuple[Status, ...] = ("completed", "failed")
    """The ends ``on_end`` acts on; a workflow that ends otherwise is settled with its end
    (no bookkeeping to wait for: one table write, not two)."""
    answers: Callable[[WorkflowState, WorkflowCommandReceived], str] | None = None
    """Which pause a command answers, when not the one its name says (e.g. a ``review``
    answers whichever of the two reviews the workflow waits for)."""
    refuse: Callable[[WorkflowState, WorkflowCommandReceived], str | None] | None = None
    """Why the workflow refuses a command that answers its pause (``None``: it takes it)."""
    sealed_by: Callable[[dict[str, Any]], str | None] | None = None
    """The aggregate (from the input) whose data key seals a failing step's message, which
    may quote a model or a participant (``streams.free_text``); None keeps only its code."""
    outcome_recorded: bool = True
    """Whether a step's outcome is a record of its own (``StepOutcome``), applied when the
    workflow's owner consumes it. False: the step's task applies it where the step ran, under
    the workflow's lock, while it holds the lease (one record and one consume fewer a step) —
    for a turn's kinds: the replay's fold (``deploy.rerun_steps.succeeded_steps``) takes a
    step's success record for the outcome it stands for. Without the lease (a handover under
    way) it is recorded all the same."""

    def step(self, index: int) -> StepDef:
        return self.steps[index]


@dataclass
class WorkflowState:
    """The fold of a workflow's records (a Faust table value, as a dict)."""

    workflow: str
    kind: str
    input: dict[str, Any]
    status: Status = "running"
    step_index: int = 0
    attempt: int = 1
    failures: int = 0
    seq: int = 1
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)
    seen_commands: list[str] = field(default_factory=list)
    """Command ids applied before decisions were remembered (``decided``); kept for them."""
    decided: dict[str, dict[str, Any]] = field(default_factory=dict)
    """command id → its answer (outcome, seq, detail), the most recent ones."""
    queued: list[dict[str, Any]] = field(default_factory=list)
    """Commands received while running, decided when it next stops (``commands.settle``)."""
    waiting_for: str | None = None
    last_error: str | None = None
    """Plain: the last failure's code (and Voice's own wording); its message is sealed."""
    last_error_sealed: dict[str, Any] | None = None
    """The last failure's message, ``Sealed`` as a dict, under ``sealed_by``'s key."""
    sealed_by: str | None = None
    tenant: str | None = None
    """The tenant it runs for (its start's); its records carry it, other tenants' commands
    are ignored."""
    settled: bool = True
    """False from the moment it ended until its definition's ``on_end`` (the turn-over
    bookkeeping) has run: the runtime runs it again for an ended, unsettled workflow, so a
    worker dying in between never leaves a turn open."""
    ended_at: float | None = None
    """When it ended (epoch seconds, its owner's clock), and the offset of the record whose
    handling ended it; None while it runs or waits, and in a state stored before they were
    kept. What ``WorkflowsForgotten`` goes by."""
    ended_offset: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The table's value: a deep copy (``json_copy``), never sharing structure."""
        return json_copy({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> WorkflowState | None:
        return None if d is None else cls(**json_copy(d))

    def copied(self) -> WorkflowState:
        """A deep copy (a transition changes its own, never the state it was given)."""
        return WorkflowState(**self.to_dict())


def error_content_id(workflow: str, step_index: int, attempt: int) -> str:
    """The content id a failed attempt's message is sealed for (``streams.free_text``)."""
    return f"{workflow}/error/{step_index}/{attempt}"


@dataclass(frozen=True)
class Emit:
    """A lifecycle record with its per-workflow seq and deterministic id."""

    record: Record
    seq: int

    def id(self, workflow: str) -> str:
        return f"{workflow}:{self.seq}"


@dataclass
class Transition:
    state: WorkflowState
    emits: list[Emit] = field(default_factory=list)
    run_step: bool = False
    """True when the current step must be (re)started by a task."""
    ended: bool = False
    answers: list[tuple[dict[str, Any], Ack]] = field(default_factory=list)
    """Commands decided by this transition: where each answer goes, and the answer."""


def _emit(t: Transition, record: Record) -> None:
    t.state.seq += 1
    t.emits.append(Emit(record, t.state.seq))


def _start_step(t: Transition, wf: WorkflowDef) -> None:
    s = t.state
    _emit(t, StepStarted(workflow=s.workflow, step=wf.step(s.step_index).name, attempt=s.attempt))
    t.run_step = True


def start(wf: WorkflowDef, started: WorkflowStarted) -> Transition:
    """A new workflow (its ``started`` record has seq 1): start the first step.

    Its ``StepStarted`` is written although ``WorkflowStarted`` says as much (step 0, attempt
    1): after a hand-over it is the record that wakes the next owner of a workflow whose
    worker left mid-step (``WorkflowStarted`` was acknowledged with the lease released), which
    then finds it running with no task and runs the step again. Without it, a rebalance storm
    left a first step that never ran (docs/reliability.md, fault 4)."""
    state = WorkflowState(workflow=started.workflow, kind=started.kind, input=dict(started.input))
    t = Transition(state)
    _start_step(t, wf)
    return t


def step_succeeded(wf: WorkflowDef, state: WorkflowState, output: dict[str, Any]) -> Transition:
    t = Transition(state.copied())
    s = t.state
    name = wf.step(s.step_index).name
    s.outputs[name] = output
    if s.step_index + 1 < len(wf.steps):
        _emit(t, StepSucceeded(workflow=s.workflow, step=name, attempt=s.attempt, output=output))
        s.step_index += 1
        s.attempt, s.failures = 1, 0
        _start_step(t, wf)
    else:  # the step's success and the workflow's end, one record
        s.status = "completed"
        _emit(t, LastStepSucceeded(workflow=s.workflow, step=name, attempt=s.attempt,
                                   output=output))
        t.ended = True
    return t


def step_failed(wf: WorkflowDef, state: WorkflowState, error: str | None, error_type: str,
                retryable: bool, max_attempts: int, sealed_error: Sealed | None = None,
                sealed_by: str | None = None) -> Transition:
    """Record the failure; retry at once while attempts remain, else fail the workflow.

    ``error`` is plain text of Voice's own (or None); a message that may quote anyone's words
    comes as ``sealed_error`` under ``sealed_by``'s key and stays sealed in every record and
    in the state.
    """
    t = Transition(state.copied())
    s = t.state
    name = wf.step(s.step_index).name
    s.failures += 1
    s.last_error = f"{error_type}: {error}" if error else error_type
    s.last_error_sealed = sealed_error.model_dump() if sealed_error is not None else None
    s.sealed_by = sealed_by if sealed_error is not None else None
    _emit(t, StepFailed(workflow=s.workflow, step=name, attempt=s.attempt, error=error,
                        error_type=error_type, retryable=retryable, sealed_error=sealed_error,
                        sealed_by=s.sealed_by))
    if retryable and s.failures < max_attempts:
        s.attempt += 1
        _start_step(t, wf)
    else:
        s.status = "failed"
        _emit(t, WorkflowFailed(workflow=s.workflow, step=name, error=s.last_error,
                                attempts=s.attempt, error_type=error_type,
                                sealed_error=sealed_error, sealed_by=s.sealed_by))
        t.ended = True
    return t


def step_paused(wf: WorkflowDef, state: WorkflowState, pause: Pause) -> Transition:
    t = Transition(state.copied())
    s = t.state
    s.status, s.waiting_for = "paused", pause.waiting_for
    _emit(t, WorkflowPaused(workflow=s.workflow, step=wf.step(s.step_index).name,
                            waiting_for=pause.waiting_for))
    return t


def worker_lost(wf: WorkflowDef, state: WorkflowState, max_attempts: int) -> Transition:
    """A running step that no task holds: its worker died (or lost the partition)."""
    return step_failed(wf, state, "the worker running this step stopped", "WorkerLost",
                       True, max_attempts)


def resume(wf: WorkflowDef, t: Transition) -> None:
    """Run the current step again: a pause answered, or a failed workflow retried."""
    s = t.state
    s.status, s.waiting_for = "running", None
    s.attempt, s.failures = 1, 0
    _emit(t, WorkflowResumed(workflow=s.workflow, step=wf.step(s.step_index).name))
    _start_step(t, wf)
