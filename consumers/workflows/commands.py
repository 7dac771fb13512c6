"""A workflow's commands, decided: every command gets an answer, accepted or refused and why.

A command (a review, a retry) reaches its workflow as ``WorkflowCommandReceived`` on the
workflow's log. The workflow — not the edge, whose view may be behind — decides it:

- paused, and the command answers the pause (``WorkflowDef.answers``) and the workflow does
  not refuse it (``WorkflowDef.refuse``, e.g. four eyes) → accepted, the workflow resumes;
- paused for something else, completed, or failed (anything but ``retry``) → refused, with
  the reason;
- running (between two states: a step is deciding where it goes next) → *queued*; it is
  decided, in arrival order, as soon as the workflow stops running (pauses, completes,
  fails). A ``retry`` is never queued: it names a failure, and a running workflow has none.

Each decision is remembered by command id (bounded), so a command repeated — a double click
with the same idempotency key, a redelivery — gets the first answer again, and never resumes
twice. The answers become ``CommandAcknowledged`` records (the runtime produces them after the
workflow's records and its table: what an answer announces is durable), which the edge waits
for as it does for any writer's.

Pure, like ``consumers.workflows.engine``: no I/O; the queue and the memory live in the
workflow's state, both bounded so its table value stays small whatever a client sends.
"""

from __future__ import annotations

import json
from typing import Any

from consumers.frame.aggregate import Ack, remember
from consumers.workflows.engine import Transition, WorkflowDef, resume
from schemas.workflow import WorkflowCommandReceived

MAX_QUEUED = 8
"""Commands a running workflow holds for its next state; more are refused (retryable)."""
QUEUED_BYTES = 64 * 1024
"""The most the queued commands may take in the workflow's state (its table value)."""
MAX_ANSWERED_WITH = 8
"""Further deliveries of one queued command (same command id) answered when it is decided."""
MAX_DECIDED = 128
"""Decisions remembered per workflow (the oldest go first; a few hundred bytes each)."""

Address = dict[str, Any]
"""Where a command's answer goes: the id, tenant and correlation of the record that carried
it (the ``CommandAcknowledged`` is keyed by that id, which the edge waits on)."""


def receive(wf: WorkflowDef, t: Transition, cmd: WorkflowCommandReceived,
            address: Address) -> None:
    """Decide ``cmd`` now, answer it again, or queue it (changes ``t`` in place)."""
    s = t.state
    decided = s.decided.get(cmd.command_id)
    if decided is not None:
        t.answers.append((address, _again(decided)))
        return
    for queued in s.queued:
        if queued["command"]["command_id"] == cmd.command_id:  # answered with the first
            if len(queued["also"]) < MAX_ANSWERED_WITH:
                queued["also"].append(address)
            return
    if cmd.command_id in s.seen_commands:  # decided before decisions were remembered
        t.answers.append((address, Ack("duplicate", None, _detail(s.workflow, cmd.command))))
        return
    if s.status == "running" and cmd.command != "retry":
        _queue(t, cmd, address)
        return
    _answer(t, cmd, _decide(wf, t, cmd), [address])


def settle(wf: WorkflowDef, t: Transition) -> None:
    """Decide the queued commands, oldest first, while the workflow is not running."""
    s = t.state
    while s.queued and s.status != "running":
        queued = s.queued.pop(0)
        cmd = WorkflowCommandReceived.model_validate(queued["command"])
        _answer(t, cmd, _decide(wf, t, cmd), [queued["address"], *queued["also"]])


def _queue(t: Transition, cmd: WorkflowCommandReceived, address: Address) -> None:
    s = t.state
    entry = {"command": cmd.model_dump(mode="json"), "address": address, "also": []}
    size = len(json.dumps([*s.queued, entry], separators=(",", ":")))
    if len(s.queued) >= MAX_QUEUED or size > QUEUED_BYTES:
        t.answers.append((address, Ack.rejected(
            f"workflow {s.workflow!r} is between two states and already holds "
            f"{len(s.queued)} command(s) for its next one; try again shortly",
            retryable=1, **_detail(s.workflow, cmd.command))))
        return
    s.queued.append(entry)


def _decide(wf: WorkflowDef, t: Transition, cmd: WorkflowCommandReceived) -> Ack:
    """The workflow's answer to ``cmd`` in its current (not running, or ``retry``) state;
    resumes it when accepted."""
    s = t.state
    where = f"workflow {s.workflow!r}"
    if cmd.command == "retry":
        if s.status != "failed":
            return Ack.rejected(f"{where} is {s.status}, not failed; only a failed workflow "
                                "can be retried", **_detail(s.workflow, cmd.command))
        s.last_error = s.last_error_sealed = s.sealed_by = None
        resume(wf, t)
        return Ack.accepted(s.seq, **_detail(s.workflow, cmd.command))
    if s.status == "paused":
        name = wf.answers(s, cmd) if wf.answers is not None else cmd.command
        if name != s.waiting_for:
            return Ack.rejected(f"{where} is waiting for {s.waiting_for!r}, not "
                                f"{cmd.command!r}", **_detail(s.workflow, cmd.command))
        reason = wf.refuse(s, cmd) if wf.refuse is not None else None
        if reason is not None:
            return Ack.rejected(reason, **_detail(s.workflow, name))
        s.commands[name] = {"by": cmd.by, **cmd.payload}
        resume(wf, t)
        return Ack.accepted(s.seq, **_detail(s.workflow, name))
    return Ack.rejected(f"{where} is not waiting for a command: it has {s.status}",
                        **_detail(s.workflow, cmd.command))


def _answer(t: Transition, cmd: WorkflowCommandReceived, ack: Ack,
            addresses: list[Address]) -> None:
    s = t.state
    if not ack.detail.get("retryable"):  # a retryable refusal may be sent again
        remember(s.decided, cmd.command_id, {"outcome": ack.outcome, "seq": ack.seq,
                                             "detail": ack.detail}, MAX_DECIDED)
    t.answers += [(address, ack) for address in addresses]


def _again(decided: dict[str, Any]) -> Ack:
    """A decided command sent again: accepted ones are ``duplicate``, refused ones refused."""
    if decided["outcome"] == "rejected":
        return Ack("rejected", None, dict(decided["detail"]))
    return Ack("duplicate", decided.get("seq"), dict(decided["detail"]))


def _detail(workflow: str, command: str) -> dict[str, Any]:
    return {"workflow": workflow, "command": command}
