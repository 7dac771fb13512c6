"""The disclosure-review workflow (id = contribution id).

Steps: ``flag`` (the deterministic detectors, then the privacy-flagging agent) → ``review``
(pauses for a reviewer) → ``second_review`` (when anything was flagged and the first reviewer
did not reject: pauses for a *different* reviewer; the same one again leaves it paused) →
``publish`` (redactions applied, the contribution's state recorded).

The contribution's text is opened only inside ``flag`` and ``publish`` and is sealed
everywhere else, flags included (an agent's reason may quote the text). Every step writes the
contribution's whole current state to the compacted ``voice.contributions``, rebuilt from the
workflow's input and earlier outputs, so a re-run writes the same record again.

A review is decided by the workflow, which answers it (``consumers.workflows.commands``):
``answers`` says which review it would be, ``refuse`` holds the four-eyes rule.

Outcome: rejected if any reviewer rejects; else the union of the redactions asked for (a
``redact`` without spans redacts every flagged span); ``approve`` asks for none.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from consumers.staff.detectors import Flag, detect, merge_flags, redact
from consumers.staff.steps import Agents, StepDelays, fenced_json
from consumers.workflows.engine import Pause, StepContext, StepDef, WorkflowDef, WorkflowState
from consumers.workflows.runtime import Erased
from schemas.base import Sealed
from schemas.staff import ContributionRecorded, ReviewSummary
from schemas.workflow import WorkflowCommandReceived
from streams.envelope import Envelope
from streams.producer import Publisher
from streams.sealing import KeyErased, Sealer
from streams.topics import CONTRIBUTIONS

KIND = "disclosure-review"
AGENT = "privacy-flagging"
SOURCE = "/voice/disclosure-review"
IDENTITY = (
    f"[agent: {AGENT}]\n"
    "You are Voice's privacy reviewer. The user message is a participant's contribution, "
    "verbatim, to be published on a public issue. Find every span that could identify a "
    "private person (names, nicknames, relatives, workplaces, distinctive descriptions). "
    "Answer with a fenced json block {\"flags\": [{\"start\": int, \"end\": int, "
    "\"kind\": str, \"reason\": str}]} with character offsets into the message; an empty "
    "list when nothing needs flagging."
)


def agent_flags(answer: str, text: str) -> list[Flag]:
    """The agent's flags that name a real span of ``text``; anything else is dropped."""
    doc = fenced_json(answer) or {}
    out = []
    for f in doc.get("flags") or []:
        if not isinstance(f, dict):
            continue
        try:
            start, end = int(f["start"]), int(f["end"])
        except (KeyError, TypeError, ValueError):
            continue
        if 0 <= start < end <= len(text) and text[start:end].strip():
            out.append(Flag(start, end, str(f.get("kind") or "personal_data")[:40], "agent",
                            str(f.get("reason") or "flagged by the privacy agent")[:500]))
    return out


def outcome(flags: list[dict[str, Any]], reviews: list[dict[str, Any]]
            ) -> tuple[str, list[tuple[int, int, str]]]:
    """(``published`` | ``rejected``, spans to redact) from the flags and the reviews."""
    if any(r["decision"] == "reject" for r in reviews):
        return "rejected", []
    spans: list[tuple[int, int, str]] = []
    for r in reviews:
        if r["decision"] != "redact":
            continue
        given = r.get("redactions") or []
        chosen = ([(int(s["start"]), int(s["end"]), str(s.get("kind") or "personal_data"))
                   for s in given] if given
                  else [(f["start"], f["end"], f["kind"]) for f in flags])
        spans += [s for s in chosen if s not in spans]
    return "published", spans


REVIEWS = ("review", "second_review")


def answers(state: WorkflowState, cmd: WorkflowCommandReceived) -> str:
    """A review answers whichever review the workflow waits for: the reviewer asks to review
    the contribution, the workflow knows whether theirs would be the first or the second."""
    if cmd.command in REVIEWS and state.waiting_for in REVIEWS:
        return state.waiting_for
    return cmd.command


def refuse(state: WorkflowState, cmd: WorkflowCommandReceived) -> str | None:
    """Four eyes: the first reviewer cannot give the second review too."""
    first = str((state.outputs.get("review") or {}).get("by"))
    if state.waiting_for == "second_review" and str(cmd.by) == first:
        return (f"reviewer {cmd.by!r} gave the first review of {state.workflow!r}; the second "
                "review must come from a different reviewer")
    return None


def _review(cmd: dict[str, Any]) -> dict[str, Any]:
    return {"by": str(cmd["by"]), "decision": cmd.get("decision", "approve"),
            "redactions": list(cmd.get("redactions") or [])}


class Review:
    """The disclosure-review workflow's definition and steps."""

    def __init__(self, out: Publisher, sealer: Sealer, agents: Agents,
                 delays: StepDelays) -> None:
        self.out = out
        self.sealer = sealer
        self.agents = agents
        self.delays = delays
        self.definition = WorkflowDef(KIND, (
            StepDef("flag", self.flag_step), StepDef("review", self.review_step),
            StepDef("second_review", self.second_review_step),
            StepDef("publish", self.publish_step)), answers=answers, refuse=refuse,
            # A failure may quote the contribution: sealed under its key, erased with it.
            sealed_by=lambda i: i["contribution"])

    def _text(self, ctx: StepContext) -> str:
        c = ctx.input["contribution"]
        return self.sealer.open_text(c, "text", Sealed.model_validate(ctx.input["text"]))

    def _flags(self, ctx: StepContext) -> list[dict[str, Any]]:
        out = ctx.outputs.get("flag")
        if not out or not out.get("flags"):
            return []
        opened = self.sealer.open_json(ctx.input["contribution"], "flags",
                                       Sealed.model_validate(out["flags"]))
        return list(opened["flags"])

    async def _record(self, ctx: StepContext, reviews: list[dict[str, Any]],
                      state: str = "in_review", published: str | None = None) -> None:
        """Write the contribution's current state (the whole record, every time)."""
        i = ctx.input
        flag = ctx.outputs.get("flag") or {}
        c = i["contribution"]
        # Erased (its author's right) since the step began? Then the workflow fails here,
        # before a record that would stand after the erasure on the log.
        try:
            self.sealer.check_live(c)
        except KeyErased:
            raise Erased("contribution", c) from None
        rec = ContributionRecorded(
            contribution=c, issue=i["issue"], author=i["author"],
            text=Sealed.model_validate(i["text"]), state=state,  # type: ignore[arg-type]
            flag_count=flag.get("flag_count"), flag_kinds=flag.get("flag_kinds") or [],
            flags=Sealed.model_validate(flag["flags"]) if flag.get("flags") else None,
            reviews=[ReviewSummary(by=r["by"], decision=r["decision"],
                                   redactions=len(r.get("redactions") or []))
                     for r in reviews],
            published_text=(self.sealer.seal(c, "published", published)
                            if published is not None else None),
            submitted_at=i["submitted_at"], updated_at=datetime.now(UTC).isoformat())
        await self.out.send(CONTRIBUTIONS, Envelope(
            record=rec, key=c, source=SOURCE, subject=c, tenant=i.get("tenant"),
            correlation=ctx.workflow, id=f"{ctx.workflow}:{ctx.step}:{ctx.attempt}"))

    async def flag_step(self, ctx: StepContext) -> dict[str, Any]:
        """Detectors, then the agent; the flags are recorded sealed."""
        text = self._text(ctx)
        found = detect(text)
        spec = self.agents.spec(AGENT, IDENTITY, max_agentic_turns=2)
        result = await self.agents.run(spec, ctx.workflow, f"{ctx.workflow}/flag", text,
                                       ctx.attempt, sealed_as=ctx.input["contribution"],
                                       tenant=ctx.input.get("tenant"))
        await self.delays.midpoint("flag")
        flags = merge_flags(found, agent_flags(result.final_text, text))
        sealed = self.sealer.seal_json(ctx.input["contribution"], "flags",
                                       {"flags": [f.to_dict() for f in flags]})
        output = {"flag_count": len(flags), "flag_kinds": sorted({f.kind for f in flags}),
                  "flags": sealed.model_dump()}
        await self._record(_with_output(ctx, "flag", output), [])
        return output

    async def review_step(self, ctx: StepContext) -> dict[str, Any] | Pause:
        cmd = ctx.commands.get("review")
        if cmd is None:
            return Pause("review")
        first = _review(cmd)
        await self.delays.midpoint("review")
        await self._record(ctx, [first])
        return first

    async def second_review_step(self, ctx: StepContext) -> dict[str, Any] | Pause:
        first = ctx.outputs["review"]
        if not ctx.outputs["flag"].get("flag_count") or first["decision"] == "reject":
            return {"skipped": True}
        cmd = ctx.commands.get("second_review")
        if cmd is None or str(cmd["by"]) == first["by"]:
            # Four eyes: the first reviewer cannot also be the second (the edge answers 409;
            # this holds even for a command that raced past it).
            return Pause("second_review")
        second = _review(cmd)
        await self._record(ctx, [first, second])
        return second

    async def publish_step(self, ctx: StepContext) -> dict[str, Any]:
        """Apply the outcome: publish the (redacted) text, or record the rejection."""
        reviews = [ctx.outputs["review"]]
        if not ctx.outputs["second_review"].get("skipped"):
            reviews.append(ctx.outputs["second_review"])
        state, spans = outcome(self._flags(ctx), reviews)
        await self.delays.midpoint("publish")
        published = redact(self._text(ctx), spans) if state == "published" else None
        await self._record(ctx, reviews, state, published)
        return {"state": state, "redacted_spans": len(spans)}


def _with_output(ctx: StepContext, step: str, output: dict[str, Any]) -> StepContext:
    """``ctx`` as the next step will see it (this step's output included)."""
    return StepContext(workflow=ctx.workflow, kind=ctx.kind, step=ctx.step, attempt=ctx.attempt,
                       input=ctx.input, outputs={**ctx.outputs, step: output},
                       commands=ctx.commands)
