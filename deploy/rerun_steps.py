"""Re-running a recorded workflow's steps: research, disclosure review, update delivery.

The workflow's recorded lifecycle is folded with the engine's own pure transitions
(``consumers.workflows``), so each step that succeeded is seen with exactly the context the
runtime gave it (input, earlier outputs, the commands it was resumed with, its attempt). The
real step function then runs again against the history: agents on the engine with their
model and tool results served from the recorded ``voice.agent`` records
(``consumers.engine.rerun``), the aggregate logs the input refers to read from the history,
and everything the step would produce kept in memory. Each step's output is compared with the
recorded one. Nothing here calls a model or a tool, or writes to Kafka.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from consumers.engine import CancelToken, EffectSink, RecordingSink, effects_from_envelopes, rerun
from consumers.engine.runner import AgentRunner
from consumers.engine.types import AgentSpec, TurnInput, TurnResult
from consumers.frame.logrefs import LogReader
from consumers.staff.delivery import Delivery
from consumers.staff.research import Research
from consumers.staff.review import Review
from consumers.staff.steps import Agents, StepDelays
from consumers.workflows import commands, engine
from consumers.workflows.engine import Pause, StepContext, WorkflowDef, WorkflowState
from consumers.workflows.runtime import outcome_transition
from deploy.histories import Recorded, aggregate_of
from schemas.base import Sealed
from schemas.workflow import StepOutcome, WorkflowCommandReceived, WorkflowStarted, step_success
from streams.envelope import Envelope
from streams.sealing import Sealer
from streams.settings import VoiceSettings
from streams.topics import AGENT, WORKFLOWS, TopicSpec


@dataclass(frozen=True)
class RanStep:
    """A step that succeeded: the context it ran with and the output it recorded."""

    index: int
    ctx: StepContext
    output: dict[str, Any]


def succeeded_steps(wf: WorkflowDef, lifecycle: Sequence[Envelope],
                    max_attempts: int) -> list[RanStep]:
    """Fold the recorded lifecycle (start, commands, step outcomes — or, where a step's
    outcome was applied where it ran, its success record — in log order) as the runtime
    does; each succeeded step with its context."""
    state: WorkflowState | None = None
    contexts: dict[tuple[int, int], StepContext] = {}
    out: list[RanStep] = []
    for env in lifecycle:
        rec = _applied_in_place(wf, state, env.record) or env.record
        t: engine.Transition | None = None
        if isinstance(rec, WorkflowStarted) and state is None:
            t = engine.start(wf, rec)
        elif isinstance(rec, WorkflowCommandReceived) and rec.command != "cancel" \
                and state is not None:
            t = engine.Transition(copy.deepcopy(state))
            commands.receive(wf, t, rec, {})
        elif isinstance(rec, StepOutcome) and state is not None:
            while (state.status == "running" and state.step_index == rec.step_index
                   and state.attempt < rec.attempt):  # its worker died: a later attempt ran
                lost = engine.worker_lost(wf, state, max_attempts)
                state = lost.state
                _keep(wf, contexts, lost)
            t = outcome_transition(wf, state, rec, max_attempts)
        if t is None:
            continue
        for e in t.emits:
            done = step_success(e.record)
            if done is not None:
                index = [s.name for s in wf.steps].index(done.step)
                ctx = contexts.get((index, done.attempt))
                if ctx is not None:
                    out.append(RanStep(index, ctx, done.output))
        state = t.state
        _keep(wf, contexts, t)
    return out


def _applied_in_place(wf: WorkflowDef, state: WorkflowState | None, rec: Any
                      ) -> StepOutcome | None:
    """The outcome a step success on the log stands for when none was recorded before it:
    a kind whose outcome is applied where its step ran (``WorkflowDef.outcome_recorded``
    false: a turn's, since issue 14's forty-second pass) has only its lifecycle records. None
    when the success is one the fold has made already (its outcome was recorded)."""
    done = step_success(rec)
    if done is None or state is None or state.status != "running":
        return None
    if wf.step(state.step_index).name != done.step or done.attempt < state.attempt:
        return None
    return StepOutcome(workflow=done.workflow, step=done.step, step_index=state.step_index,
                       attempt=done.attempt, status="succeeded", output=done.output)


def _keep(wf: WorkflowDef, contexts: dict[tuple[int, int], StepContext],
          t: engine.Transition) -> None:
    """The context of the step a transition starts (as ``WorkflowRuntime._run_step`` builds)."""
    if not t.run_step:
        return
    s = copy.deepcopy(t.state)
    contexts[(s.step_index, s.attempt)] = StepContext(
        workflow=s.workflow, kind=s.kind, step=wf.step(s.step_index).name, attempt=s.attempt,
        input=s.input, outputs=s.outputs, commands=s.commands, cancel=CancelToken())


class ReplayRunner(AgentRunner):
    """An ``AgentRunner`` (same specs, from the same settings) whose turns run on the engine
    with the recorded model and tool results of the turn's attempt; collects divergences."""

    def __init__(self, settings: VoiceSettings, agent: Sequence[Envelope],
                 sealer: Sealer) -> None:
        super().__init__(settings, producer=lambda: None)  # type: ignore[arg-type,return-value]
        self.agent, self.replay_sealer = list(agent), sealer
        self.divergences: list[str] = []

    def sink(self, workflow: str, *, sealed: bool = False, tenant: str | None = None,
             causation: str | None = None, source: str = "") -> EffectSink:
        return RecordingSink()

    async def run(self, spec: AgentSpec, turn_input: TurnInput, sink: EffectSink,
                  cancel: CancelToken | None = None, tenant: str | None = None) -> TurnResult:
        prefix = f"{turn_input.turn_id}/a{turn_input.attempt}/"
        recorded = effects_from_envelopes([e for e in self.agent if e.id.startswith(prefix)],
                                          self.replay_sealer)
        result, _sink, found = await rerun(spec, turn_input, recorded)
        self.divergences += [f"agent turn {turn_input.turn_id!r}: {d}" for d in found]
        return result


class HeldPublisher:
    """A ``Publisher`` that keeps what a re-run step would produce (nothing reaches Kafka)."""

    def __init__(self) -> None:
        self.sent: list[tuple[TopicSpec, Envelope]] = []

    async def send(self, spec: TopicSpec, env: Envelope, max_bytes: int | None = None) -> None:
        self.sent.append((spec, env))

    async def send_all(self, items: Sequence[tuple[TopicSpec, Envelope]]) -> None:
        self.sent += list(items)


def _definition(kind: str, out: HeldPublisher, agents: Agents, sealer: Sealer,
                log: LogReader) -> WorkflowDef | None:
    """The registered definition of a staff workflow kind, wired to the replay's ports."""
    delays = StepDelays()
    if kind == "research":
        return Research(out, agents, delays, log).definition  # type: ignore[arg-type]
    if kind == "disclosure-review":
        return Review(out, sealer, agents, delays).definition  # type: ignore[arg-type]
    if kind == "update-delivery":
        return Delivery(out, delays, log).definition  # type: ignore[arg-type]
    return None


STAFF_KINDS = ("research", "disclosure-review", "update-delivery")

SEALED_OUTPUTS: dict[str, dict[str, str]] = {"disclosure-review": {"flags": "flags"}}
"""Output fields sealed under the workflow's aggregate key (field → content id): compared
opened, since sealing the same content twice never gives the same ciphertext."""


def comparable_output(rec: Recorded, inp: dict[str, Any], output: dict[str, Any]) -> Any:
    """A step's output as compared: sealed fields opened (their content, not their bytes)."""
    out = dict(output)
    aggregate = aggregate_of(rec.kind, rec.workflow, inp)
    for name, content_id in SEALED_OUTPUTS.get(rec.kind, {}).items():
        value = out.get(name)
        if aggregate and isinstance(value, dict) and "ciphertext" in value:
            out[name] = rec.sealer.open_json(aggregate, content_id, Sealed.model_validate(value))
    return json.loads(json.dumps(out, sort_keys=True))


def differing(recorded: Any, replayed: Any, path: str = "") -> list[str]:
    """Where two JSON values differ (paths, at most a few)."""
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        return [d for k in sorted(recorded.keys() | replayed.keys())
                for d in differing(recorded.get(k), replayed.get(k), f"{path}.{k}")][:5]
    if isinstance(recorded, list) and isinstance(replayed, list) \
            and len(recorded) == len(replayed):
        return [d for i, (a, b) in enumerate(zip(recorded, replayed, strict=True))
                for d in differing(a, b, f"{path}[{i}]")][:5]
    return [] if recorded == replayed else [path or "."]


async def rerun_steps(settings: VoiceSettings, rec: Recorded,
                      definition: Callable[..., WorkflowDef | None] = _definition) -> list[str]:
    """Re-run each succeeded step of a recorded staff workflow; the divergences."""
    runner = ReplayRunner(settings, rec.of(AGENT), rec.sealer)
    out = HeldPublisher()
    wf = definition(rec.kind, out, Agents(runner), rec.sealer, rec.log)
    if wf is None:
        return [f"workflow {rec.workflow!r} is a {rec.kind!r}: no re-run for that kind"]
    ran = succeeded_steps(wf, rec.of(WORKFLOWS), settings.step_attempts)
    if not ran:
        return [f"workflow {rec.workflow!r} has no successful step to compare with"]
    found: list[str] = []
    for step in ran:
        name = wf.step(step.index).name
        try:
            result = await wf.step(step.index).run(step.ctx)
        except Exception as exc:  # a re-run that fails where the recorded run succeeded
            found.append(f"step {name!r} (attempt {step.ctx.attempt}) raised "
                         f"{type(exc).__name__}: {exc}")
            continue
        if isinstance(result, Pause):
            found.append(f"step {name!r} paused for {result.waiting_for!r}; it had succeeded")
            continue
        want = comparable_output(rec, step.ctx.input, step.output)
        got = comparable_output(rec, step.ctx.input, result)
        if want != got:
            found.append(f"step {name!r}: output differs at {', '.join(differing(want, got))}")
    return [*runner.divergences, *found]


__all__ = ["STAFF_KINDS", "HeldPublisher", "RanStep", "ReplayRunner", "rerun_steps",
           "succeeded_steps"]
