"""The conversation product on the worker: its sequencer, its transcript index, its turn workflow.

``Conversations().register(ctx)`` is all the worker needs: the sequencer becomes the writer of
conversation commands (keeping where each transcript is on the log, starting each opened
turn's workflow and writing each started conversation's entry in the index by owner,
``voice.owners``: decisions 0015, 0016); what it records feeds the transcript table of
conversations begun before the writer kept positions, which starts their turns (told by the
writer: no worker consumes ``voice.conversations``); and the ``conversation-turn`` workflow
runs the concern-extraction agent through the context's agent runner.
"""

from __future__ import annotations

from typing import Any

from consumers.conversations.catalog import FollowedIssues, IssueIndex, IssueSource
from consumers.conversations.concern import (
    ConcernReply,
    concern_spec,
    run_concern_extraction,
)
from consumers.conversations.deltas import ReplyStream
from consumers.conversations.sequencer import ConversationSequencer
from consumers.conversations.turns import ConcernAgent, Turns
from consumers.engine import AgentSpec, CancelToken
from consumers.frame.context import WorkerContext
from streams.topics import CONVERSATIONS, ISSUES


class Conversations:
    """Participants' conversations with the concern-extraction agent."""

    name = "conversations"

    def __init__(self, agent: ConcernAgent | None = None,
                 issues: IssueSource | None = None) -> None:
        """``agent`` replaces the concern agent (tests); ``issues`` is what its tools search
        (by default every issue of the turn's tenant, followed from ``voice.issues``)."""
        self._agent = agent
        self.issues: IssueSource | None = issues
        self.ctx: WorkerContext | None = None
        self.turns: Turns | None = None

    def register(self, ctx: WorkerContext) -> None:
        """Add the sequencer, the transcript index and its hook on the log, and the turn
        workflow."""
        self.ctx = ctx
        if self.issues is None:
            index = IssueIndex()
            follower = ctx.follow(ISSUES, index.apply, "issues")
            self.issues = FollowedIssues(index, follower.fresh)
        ctx.aggregate(ConversationSequencer(ctx.settings.turn_deadline_s,
                                            ctx.settings.history_read_bytes))
        self.turns = Turns(ctx.publisher, ctx.table("transcript_index"), ctx.sealer,
                           self._agent or self.concern_agent, ctx.log_reader,
                           ctx.settings.history_read_bytes,
                           ctx.crash)
        ctx.workflow(self.turns.definition)
        # Told by the writer, not consumed back (decision 0016): no worker reads the log.
        ctx.on_recorded(CONVERSATIONS, self.turns.on_conversation_record)

    def spec_for(self, tenant: str | None) -> AgentSpec:
        """The agent of one tenant's turn: its tools search only that tenant's issues."""
        assert self.ctx is not None and self.issues is not None, "register() first"
        return concern_spec(self.ctx.settings, self.issues.for_tenant(tenant))

    async def concern_agent(self, conversation: str, turn: str, attempt: int,
                            history: list[dict[str, Any]], cancel: CancelToken,
                            tenant: str | None = None) -> ConcernReply:
        """One concern-extraction turn of ``tenant`` (its model tokens count against that
        tenant's budget); its effects become records keyed by the turn."""
        assert self.ctx is not None and self.issues is not None, "register() first"
        agents = self.ctx.agents
        sink = ReplyStream(agents.sink(turn, sealed=True, tenant=tenant), self.ctx.publisher,
                           self.ctx.sealer, conversation, turn, tenant)
        return await run_concern_extraction(self.spec_for(tenant),
                                            agents.client_for(tenant, turn), sink,
                                            conversation, turn, attempt, history, cancel)
