"""The research workflow (id = run id): one step, the research-assistant agent with read-only
tools over the issue, its evidence and the reasoning service.

The workflow's input is the issue and a reference to its evidence as the edge saw it when
staff asked — the span of the issue's log up to the seq the edge had read — and the step reads
that span back (``consumers.frame.logrefs``), keeping the most recent ``MAX_EVIDENCE_READ``
pieces; the tools read only those: a re-run (after a crash, or replayed) reads the same
records. (A copy in the input made one record grow with the evidence, past the record bound.)
Each suggestion keeps the agent's reason and the ids of the records it read — only ids that
appeared in a tool result of this run, so an id the agent made up is not reported as read.
A suggested investigation is submitted to the issue's writer as an investigation in state
``suggested`` (id ``{run}:inv-{n}``, the same on a re-run) until a representative opens it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from consumers.engine import Hint, Ok, Tool, ToolContext, ToolRegistry
from consumers.frame.logrefs import LogReader
from consumers.staff.reasoning import Reading, read_issue
from consumers.staff.steps import Agents, StepDelays, fenced_json
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef
from consumers.workflows.runtime import StepError
from schemas.staff import EvidenceAdded, SuggestInvestigation
from streams.envelope import Envelope
from streams.producer import Publisher
from streams.topics import COMMANDS, ISSUES

KIND = "research"
AGENT = "research-assistant"
SOURCE = "/voice/research"
SECTIONS = ("sources", "questions", "investigations")
IDENTITY = (
    f"[agent: {AGENT}]\n"
    "You are Voice's research assistant. Staff ask you to research one issue raised by "
    "participants. Read the issue, its evidence, the claims the evidence makes (and which "
    "evidence supports or contradicts each) and the gaps (statements with no evidence) with "
    "your tools; they only read. Then suggest sources to look for, questions to ask and "
    "investigations to open. End with a fenced json block: "
    '{"sources": [{"title", "reason", "read": [ids]}], "questions": [...], '
    '"investigations": [...]} where `read` lists the ids of the records you read for it.'
)


class IssueArgs(BaseModel):
    issue: str | None = Field(None, description="The issue id (iss-…); this run's issue if "
                                                "omitted.")


class ClaimArgs(IssueArgs):
    evidence: str | None = Field(None, description="Only the claims of this evidence id.")


def _tools(data: dict[str, Any], reading: Reading) -> ToolRegistry:
    issue = data["issue"]
    evidence = data.get("evidence") or []

    def check(args: IssueArgs) -> Hint | None:
        if args.issue not in (None, issue["issue"]):
            return Hint("unknown_issue", f"this run researches {issue['issue']!r}, not "
                                         f"{args.issue!r}", (issue["issue"],))
        return None

    def get_issue(args: IssueArgs, _ctx: ToolContext) -> Ok | Hint:
        hint = check(args)
        return hint or Ok(rows=({"id": issue["issue"], "title": issue["title"],
                                 "summary": issue.get("summary", "")},),
                          data={"evidence": [{"id": e["evidence"], "title": e["title"]}
                                             for e in evidence],
                                "claims": len(reading.claims), "gaps": len(reading.gaps)})

    def list_evidence(args: IssueArgs, _ctx: ToolContext) -> Ok | Hint:
        hint = check(args)
        return hint or Ok(rows=tuple({"id": e["evidence"], "title": e["title"],
                                      "body": e.get("body"), "url": e.get("url"),
                                      "added_by": e.get("added_by")} for e in evidence))

    def get_claims(args: ClaimArgs, _ctx: ToolContext) -> Ok | Hint:
        hint = check(args)
        return hint or Ok(rows=tuple(c.to_dict() for c in reading.claims
                                     if args.evidence in (None, c.evidence)))

    def get_gaps(args: IssueArgs, _ctx: ToolContext) -> Ok | Hint:
        hint = check(args)
        return hint or Ok(rows=tuple(g.to_dict() for g in reading.gaps))

    # Registration order is the order the model sees them; the issue first.
    return ToolRegistry([
        Tool("get_issue", "The issue: title, summary, and the ids and titles of its evidence.",
             IssueArgs, get_issue),
        Tool("list_evidence", "The issue's evidence: title, body, URL, who added it.",
             IssueArgs, list_evidence),
        Tool("get_claims", "Claims the evidence makes, with the evidence that supports or "
                           "contradicts each.", ClaimArgs, get_claims),
        Tool("get_gaps", "The issue's statements no evidence speaks to.", IssueArgs, get_gaps),
    ])


def _seen_ids(result_messages: list[dict[str, Any]], known: list[str]) -> set[str]:
    """Which known record ids appeared in the tool results the agent received."""
    text = json.dumps([b for m in result_messages if m.get("role") == "user"
                       for b in (m.get("content") or []) if isinstance(b, dict)
                       and b.get("type") == "tool_result"], ensure_ascii=False)
    return {i for i in known if i in text}


def parse_suggestions(answer: str, seen: set[str]) -> dict[str, list[dict[str, Any]]]:
    """The agent's suggestions, each with a title, a reason and the ids it read (``seen`` only)."""
    doc = fenced_json(answer)
    if doc is None:
        raise StepError("the research assistant's answer has no JSON block of suggestions")
    out: dict[str, list[dict[str, Any]]] = {}
    for section in SECTIONS:
        items = []
        for item in doc.get(section) or []:
            if not isinstance(item, dict) or not str(item.get("title") or "").strip():
                continue
            read = [str(i) for i in item.get("read") or [] if str(i) in seen]
            items.append({"title": str(item["title"]).strip(),
                          "reason": str(item.get("reason") or "").strip(),
                          "read": list(dict.fromkeys(read))})
        out[section] = items
    return out


MAX_EVIDENCE_READ = 200
"""Evidence a run reads (the most recent pieces as of the request)."""


class Research:
    """The research workflow's definition and its one step."""

    def __init__(self, out: Publisher, agents: Agents, delays: StepDelays,
                 log: LogReader) -> None:
        self.out = out
        self.agents = agents
        self.delays = delays
        self.log = log
        self.definition = WorkflowDef(KIND, (StepDef("research", self.research_step),))

    async def evidence(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        """The evidence the input names, read back from the issue's log (the latest
        ``MAX_EVIDENCE_READ``); an input of before references carries it."""
        ref = data.get("evidence") or []
        if isinstance(ref, list):
            return ref
        if ref.get("partition") is None:
            raise StepError("the run's input names no partition of the issue's log",
                            retryable=False)
        records = await self.log.scan(ISSUES, int(ref["partition"]), data["issue"]["issue"],
                                      int(ref.get("opened") or 0), int(ref["through"]))
        found = [r.record for r in records if isinstance(r.record, EvidenceAdded)]
        return [{"evidence": e.evidence, "title": e.title, "body": e.body, "url": e.url,
                 "added_by": e.added_by, "at": e.at} for e in found[-MAX_EVIDENCE_READ:]]

    async def research_step(self, ctx: StepContext) -> dict[str, Any]:
        """Run the agent over the input's issue; record suggestions and investigations."""
        data = {**ctx.input, "evidence": await self.evidence(ctx.input)}
        issue = data["issue"]
        reading = read_issue(issue, data.get("evidence") or [])
        tools = _tools(data, reading)
        spec = self.agents.spec(AGENT, IDENTITY, tools, max_agentic_turns=12)
        message = (f"Research issue {issue['issue']}: “{issue['title']}”. "
                   f"It has {len(data.get('evidence') or [])} piece(s) of evidence.")
        result = await self.agents.run(spec, ctx.workflow, ctx.workflow, message, ctx.attempt,
                                       tenant=data.get("tenant"))
        await self.delays.midpoint("research")
        known = [issue["issue"], *(e["evidence"] for e in data.get("evidence") or []),
                 *(c.id for c in reading.claims), *(g.id for g in reading.gaps)]
        suggestions = parse_suggestions(result.final_text,
                                        _seen_ids(result.messages_appended, known))
        investigations = []
        for n, item in enumerate(suggestions["investigations"], start=1):
            investigation = f"{ctx.workflow}:inv-{n}"
            item["investigation"] = investigation
            investigations.append((COMMANDS, Envelope(
                record=SuggestInvestigation(issue=issue["issue"], investigation=investigation,
                                            run=ctx.workflow, title=item["title"],
                                            reason=item["reason"], read=item["read"]),
                key=issue["issue"], source=SOURCE, subject=issue["issue"],
                tenant=data.get("tenant"), correlation=ctx.workflow,
                id=f"{investigation}:suggest")))
        await self.out.send_all(investigations)
        return {"issue": issue["issue"], "suggestions": suggestions,
                "investigations": [x["investigation"] for x in suggestions["investigations"]]}
