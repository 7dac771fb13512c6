"""Records of the workflow engine's lifecycle (topic voice.workflows, key = workflow id).

Each workflow's records carry a dense per-workflow ``voice_seq``; the workflow's state is the
fold of these records, so a Faust table of it can always be rebuilt from the log.

A workflow's first step starts with its ``WorkflowStarted`` (attempt 1, no ``StepStarted`` of
its own since issue 14; logs written before hold one); a later step, a retry and a resumed step
get their ``StepStarted``. A workflow whose last step succeeds ends with one
``LastStepSucceeded`` (before: ``StepSucceeded`` and ``WorkflowCompleted``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas.base import Record, Sealed, record_type


@record_type("voice.workflow.started.v1")
class WorkflowStarted(Record):
    workflow: str
    kind: str
    """conversation-turn | research | disclosure-review | update-delivery"""
    input: dict[str, Any] = {}


@record_type("voice.workflow.step_started.v1")
class StepStarted(Record):
    workflow: str
    step: str
    attempt: int = Field(ge=1)
    lease_until: str | None = None
    """ISO time after which another worker may take the step over (its worker is presumed dead)."""
    worker: str | None = None


@record_type("voice.workflow.step_succeeded.v1")
class StepSucceeded(Record):
    workflow: str
    step: str
    attempt: int = Field(ge=1)
    output: dict[str, Any] = {}


@record_type("voice.workflow.step_failed.v1")
class StepFailed(Record):
    workflow: str
    step: str
    attempt: int = Field(ge=1)
    error: str | None = None
    """Plain text: Voice's own wording (``WorkerLost``), or a record written before errors
    were sealed. An exception's message is in ``sealed_error``."""
    error_type: str
    """The plain code: the exception's type name."""
    retryable: bool = True
    sealed_error: Sealed | None = None
    """The failure in words, sealed with the data key of ``sealed_by`` (content id
    ``{workflow}/error/{step_index}/{attempt}``): it may quote a model or a participant."""
    sealed_by: str | None = None
    """The aggregate whose key sealed ``sealed_error`` (e.g. the turn's conversation)."""


@record_type("voice.workflow.paused.v1")
class WorkflowPaused(Record):
    workflow: str
    step: str
    waiting_for: str
    """What resumes it, e.g. ``review`` or ``second_review``."""


@record_type("voice.workflow.command_received.v1")
class WorkflowCommandReceived(Record):
    workflow: str
    command: str
    command_id: str
    by: str
    payload: dict[str, Any] = {}


@record_type("voice.workflow.resumed.v1")
class WorkflowResumed(Record):
    workflow: str
    step: str


@record_type("voice.workflow.completed.v1")
class WorkflowCompleted(Record):
    workflow: str
    output: dict[str, Any] = {}


@record_type("voice.workflow.completed.v2")
class LastStepSucceeded(WorkflowCompleted):
    """The workflow's last step succeeded, so it completed: one record where v1 wrote
    ``StepSucceeded`` then ``WorkflowCompleted`` (``output`` is the step's, as both held it).

    A ``WorkflowCompleted`` to every reader of one; a reader of step successes takes it
    through ``step_success``."""

    step: str
    attempt: int = Field(ge=1)


@record_type("voice.workflow.failed.v1")
class WorkflowFailed(Record):
    workflow: str
    step: str
    error: str | None = None
    """Plain text: the last failure's code (and Voice's own wording, if any)."""
    attempts: int = Field(ge=1)
    error_type: str | None = None
    """The last failure's plain code."""
    sealed_error: Sealed | None = None
    """The last failure in words, as its ``StepFailed`` sealed it."""
    sealed_by: str | None = None


@record_type("voice.workflow.step_outcome.v1")
class StepOutcome(Record):
    """What a step's task reports; the engine turns it into the lifecycle records above.

    The task itself never touches workflow state: the workflow's owner applies this record.
    """

    workflow: str
    step: str
    step_index: int = Field(ge=0)
    attempt: int = Field(ge=1)
    status: Literal["succeeded", "failed", "paused"]
    output: dict[str, Any] = {}
    error: str | None = None
    """Plain text only (Voice's own wording); an exception's message goes sealed."""
    error_type: str | None = None
    retryable: bool = True
    waiting_for: str | None = None
    sealed_error: Sealed | None = None
    sealed_by: str | None = None


@record_type("voice.workflow.lease_check.v1")
class LeaseCheck(Record):
    """A probe the workflow's owner produces for a running workflow that no local task holds
    (e.g. after it took the partition over): consuming it resumes the step."""

    workflow: str


FORGET_AT_MOST = 512
"""The most workflows one ``WorkflowsForgotten`` names (~40 bytes each: well under a record's
bound)."""


@record_type("voice.workflow.forgotten.v1")
class WorkflowsForgotten(Record):
    """Housekeeping of one partition of ``voice.workflows`` (keyed by the first workflow it
    names, so it lands in theirs): its owner forgets these ended, settled workflows, each
    ended before ``ended_before`` (epoch seconds), dropping their state from its table (a
    changelog tombstone). It names no tenant: it carries no one's words, only ids.

    A forgotten workflow's later records change nothing, but a ``WorkflowStarted`` of it
    would start it again: ``VOICE_WORKFLOW_RETAIN_S`` must outlast any redelivery of one."""

    workflows: list[str] = Field(min_length=1, max_length=FORGET_AT_MOST)
    ended_before: float


def step_success(record: Record) -> StepSucceeded | None:
    """The step success a ``voice.workflows`` record reports, in either shape: a
    ``StepSucceeded``, or the one a ``LastStepSucceeded`` carries (else None)."""
    if isinstance(record, LastStepSucceeded):
        return StepSucceeded(workflow=record.workflow, step=record.step, attempt=record.attempt,
                             output=record.output)
    return record if isinstance(record, StepSucceeded) else None
