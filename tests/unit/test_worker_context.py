"""The worker's frame without a broker: products register themselves, every command type has
exactly one writer, and the table names (the changelog topics holding deployed state) stay."""

from __future__ import annotations

from typing import Any

from consumers.app import products
from consumers.assistant.sequencer import AssistantSequencer
from consumers.conversations.sequencer import ConversationSequencer
from consumers.staff.inbox import InboxWriter
from consumers.staff.issues import IssueWriter
from schemas.assistant import ASSISTANT_COMMANDS
from schemas.conversation import SendMessage, StartConversation
from schemas.staff import ISSUE_COMMANDS, DeliverNotification
from schemas.workflow import WorkflowCommandReceived
from streams.settings import VoiceSettings

SETTINGS = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", topic_prefix="t.")


def test_every_command_type_is_routed_to_the_aggregate_that_owns_it(make_worker: Any) -> None:
    w = make_worker(SETTINGS)
    owner = {t: type(agg) for t, (agg, _) in w.writer._owners.items()}
    assert owner[StartConversation] is owner[SendMessage] is ConversationSequencer
    assert all(owner[t] is IssueWriter for t in ISSUE_COMMANDS)
    assert all(owner[t] is AssistantSequencer for t in ASSISTANT_COMMANDS)
    assert owner[DeliverNotification] is InboxWriter
    assert WorkflowCommandReceived in w.writer._handlers
    assert [p.name for p in w.products] == [p.name for p in products()]


def test_table_names_and_agents_are_stable(make_worker: Any) -> None:
    w = make_worker(SETTINGS)
    assert sorted(w.app.tables) == [
        "assistant_conversations", "assistant_index", "conversations",
        "staff_deliveries", "staff_inboxes", "staff_issues", "staff_review_queues",
        "transcript_index", "workflows"]
    assert "voice_commands_agent" in w.app.agents  # one consumer of voice.commands


def test_a_concern_agent_can_be_passed_through_the_factory(make_worker: Any) -> None:
    async def agent(*args: object) -> None:
        raise AssertionError("not called here")

    w = make_worker(SETTINGS, agent=agent)
    conversations = w.products[0]
    assert conversations.turns.agent is agent  # type: ignore[attr-defined]


def test_the_janitor_looks_after_the_turns_of_both_conversation_kinds(make_worker: Any
                                                                       ) -> None:
    w = make_worker(SETTINGS.model_copy(update={"turn_deadline_s": 7.0,
                                                  "assistant_turn_deadline_s": 8.0}))
    watched = {type(x.aggregate): x.aggregate for x in w.janitor.watched}
    assert set(watched) == {ConversationSequencer, AssistantSequencer}
    assert watched[ConversationSequencer].turn_deadline_s == 7.0  # type: ignore[attr-defined]
    assert watched[AssistantSequencer].turn_deadline_s == 8.0  # type: ignore[attr-defined]
