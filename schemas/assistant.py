"""Records of the assistant chat: uploaded datasets, the chat commands, and each assistant
conversation's log.

Topics: ``voice.datasets`` (compacted, key = dataset id) holds each uploaded CSV, sealed with the
dataset's own data key; ``voice.commands`` carries the commands (key = conversation id);
``voice.assistant`` is each assistant conversation's log (key = conversation id), appended by its
sequencer only, every record with a dense ``voice_seq``, and every display event with a dense
``display_seq`` of its own, which is the SSE ``id:``. Participant content (messages, CSVs,
replies, display data, patterns) is always ``Sealed``; what stays plaintext is structure
(ids, counts, types of events, states).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.base import Record, Sealed, record_type

DATASET_ID = r"^[0-9a-f]{32}$"
NAMESPACE = r"^[A-Za-z0-9_.-]{1,64}$"
"""A namespace name: an identifier the owner picks, kept in plaintext like the ids."""
IMAGE_TYPES = ("image/png", "image/jpeg")
"""Media types an uploaded image may have (the Messages API takes both as ``image`` blocks)."""
ImageType = Literal["image/png", "image/jpeg"]
TurnOutcome = Literal["Replied", "Failed", "Cancelled"]
PatternStage = Literal["provisional", "extracted"]


class DatasetRef(BaseModel):
    """Where a dataset's record sits on ``voice.datasets``: a worker fetches exactly it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset_id: str = Field(pattern=DATASET_ID)
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)


class ChatOptions(BaseModel):
    """The per-request switches of a chat turn, and the asker's capabilities (no content)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_override: str | None = None
    agentic_mode: bool = False
    skip_history: bool = False
    data_isolation: bool = False
    namespace_id: str | None = None
    inference_params: dict[str, float] = {}
    capabilities: tuple[str, ...] = ()
    """What the asking principal may do in the turn's tenant, resolved by the edge from its
    verified token when the request was made (a chat body cannot carry it: ``ChatRequest``
    refuses unknown fields). The turn's tools see these and nothing else (``ToolContext``)."""


class DisplayPayload(BaseModel):
    """One engine display event with its ``data`` sealed (content id ``<event_id>/data``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str
    type: str
    channel: str
    scope: str = "turn"
    message_id: str | None = None
    verb: str | None = None
    priority: int = 0
    persistent: bool = True
    ts: float
    data: Sealed
    group_id: str | None = None
    parent_id: str | None = None
    display_id: str | None = None
    metadata: dict[str, Any] = {}


# --- datasets (topic voice.datasets, compacted, key = dataset id) ----------------------------


@record_type("voice.assistant.dataset_recorded.v1")
class DatasetRecorded(Record):
    """An uploaded CSV. ``meta`` (``{"name", "columns"}``, content id ``meta``) and ``csv``
    (content id ``csv``) are sealed with the data key named by the dataset id."""

    dataset_id: str = Field(pattern=DATASET_ID)
    owner: str = Field(min_length=1)
    rows: int = Field(ge=1)
    """Data rows (the header excluded)."""
    columns: int = Field(ge=1)
    size_bytes: int = Field(ge=1)
    meta: Sealed
    csv: Sealed
    at: str
    namespace: str | None = Field(default=None, pattern=NAMESPACE)
    """The namespace the dataset belongs to (``None``: the default one). A turn sees only the
    datasets of its own namespace (``ChatOptions.namespace_id``)."""


@record_type("voice.assistant.image_recorded.v1")
class ImageRecorded(Record):
    """An uploaded image, beside the datasets on ``voice.datasets`` (key = image id). ``meta``
    (``{"name"}``, content id ``meta``) and ``image`` (the file's bytes, content id ``image``)
    are sealed with the data key named by the image id. A chat names it in ``file_context``
    (``ID: <image id>``) and the turn shows it to the model as an ``image`` content block."""

    image_id: str = Field(pattern=DATASET_ID)
    owner: str = Field(min_length=1)
    media_type: ImageType
    size_bytes: int = Field(ge=1)
    meta: Sealed
    image: Sealed
    at: str
    namespace: str | None = Field(default=None, pattern=NAMESPACE)


@record_type("voice.assistant.dataset_erased.v1")
class DatasetErased(Record):
    """The owner erased the dataset or image ``dataset_id`` (key = that id): its data key was
    destroyed first, so every copy of its content is unreadable; this record says so to every
    edge, and, being the key's latest record, is what compaction keeps."""

    dataset_id: str = Field(pattern=DATASET_ID)


# --- commands (topic voice.commands, key = conversation id) ---------------------------------


@record_type("voice.assistant.chat.v1")
class AssistantChat(Record):
    """A chat message from the edge: opens the conversation when ``create`` and starts a turn.

    ``request`` is the sealed JSON of the turn's request (message, user content, file context,
    focus and selection state, dataset summaries), content id ``message_id``.
    """

    conversation: str
    owner: str = Field(min_length=1)
    create: bool = False
    message_id: str
    request: Sealed
    datasets: list[DatasetRef] = []
    options: ChatOptions = ChatOptions()
    idempotency_key: str | None = None


@record_type("voice.assistant.erase.v1")
class EraseAssistantConversation(Record):
    """The owner asked to erase the conversation; its key is already destroyed."""

    conversation: str


@record_type("voice.assistant.append_display.v1")
class AppendDisplay(Record):
    """A display event of a running turn, sent by the turn's step to the sequencer, which gives
    it the next ``display_seq``. The command id is the engine's effect key (dedupe)."""

    conversation: str
    turn: str
    event: DisplayPayload


# --- the log (topic voice.assistant, key = conversation id) ---------------------------------
# ``AssistantReplyRecorded``, ``AssistantTurnEnded``, ``AssistantPatternRecorded`` and
# ``AssistantHistorySummarised`` are also the commands that ask for them: the sequencer
# appends them as they are.


@record_type("voice.assistant.conversation_started.v1")
class AssistantConversationStarted(Record):
    conversation: str
    owner: str


@record_type("voice.assistant.turn_requested.v1")
class AssistantTurnRequested(Record):
    """Starts the assistant-turn workflow ``turn`` (``{conversation}:turn-{seq}``)."""

    conversation: str
    turn: str
    message_id: str
    request: Sealed
    datasets: list[DatasetRef] = []
    options: ChatOptions = ChatOptions()
    after: int = Field(ge=0)
    """The conversation's ``display_seq`` before this turn: its events come after it."""
    at: str


@record_type("voice.assistant.display_recorded.v1")
class AssistantDisplayRecorded(Record):
    conversation: str
    turn: str
    display_seq: int = Field(ge=1)
    event: DisplayPayload


@record_type("voice.assistant.reply_recorded.v1")
class AssistantReplyRecorded(Record):
    """The turn's persisted reply: ``chain`` is ``{"text", "structured_content"}`` (content id
    ``<reply_id>/chain``), ``cards`` is ``{"cards": [...]}`` (``<reply_id>/cards``); apart so
    history can carry the chain without the cards' payload."""

    conversation: str
    turn: str
    reply_id: str
    chain: Sealed
    cards: Sealed
    cost_usd: float = 0.0
    end_reason: str = "end_turn"


@record_type("voice.assistant.turn_ended.v1")
class AssistantTurnEnded(Record):
    conversation: str
    turn: str
    state: TurnOutcome
    end_reason: str | None = None
    reason: str | None = None
    """Plain text; only records written before reasons were sealed carry it."""
    reason_code: str | None = None
    """Why, as a plain code: the turn's error kinds (``model_error; tool_error``), or
    ``step_failed``."""
    sealed_reason: Sealed | None = None
    """The reason in words, sealed with the conversation's key (content id
    ``{turn}:reason``)."""


@record_type("voice.assistant.pattern_recorded.v1")
class AssistantPatternRecorded(Record):
    """A pattern derived from an ended turn (sealed JSON ``{"text", "keywords"}``, content id
    ``pattern_id``): ``provisional`` at once without a model, then ``extracted`` by one."""

    conversation: str
    turn: str
    pattern_id: str
    stage: PatternStage
    text: Sealed


@record_type("voice.assistant.history_summarised.v1")
class AssistantHistorySummarised(Record):
    """A summary of the conversation through ``through_seq`` (sealed text, content id
    ``summary_id``), made by the compaction model when a turn's history was over its token
    budget and submitted by the turn's step (command id ``summary_id``, so a re-run records it
    once). Later turns read it and only the requests and replies after ``through_seq``; the
    next summary is made from it and those, never from the whole conversation again."""

    conversation: str
    turn: str
    summary_id: str
    through_seq: int = Field(ge=1)
    """The last seq of the conversation the summary covers."""
    text: Sealed


@record_type("voice.assistant.conversation_erased.v1")
class AssistantConversationErased(Record):
    """The conversation was erased (its key destroyed before): nothing is appended after."""

    conversation: str


@record_type("voice.assistant.expire_turn.v1")
class ExpireAssistantTurn(Record):
    """The janitor of the worker owning the conversation found ``turn`` running past its
    deadline: the sequencer ends it ``Failed`` (``DEADLINE_EXCEEDED``) if it still runs, else
    ignores this. Command id ``{turn}:deadline``."""

    conversation: str
    turn: str


ASSISTANT_COMMANDS = (AssistantChat, AppendDisplay, AssistantReplyRecorded, AssistantTurnEnded,
                      AssistantPatternRecorded, AssistantHistorySummarised, ExpireAssistantTurn,
                      EraseAssistantConversation)
"""Record types the assistant sequencer takes off ``voice.commands``."""
