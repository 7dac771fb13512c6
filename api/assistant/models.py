"""Request and response bodies of the assistant routes (``/api/v1/assistant``), and the CSV
check of an upload (Python's ``csv`` module: a header and at least one row, every row as wide
as the header)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, Field, JsonValue

from api.frame.models import JsonObject, NonBlank, RequestModel
from schemas.assistant import DATASET_ID, NAMESPACE

DatasetId = Annotated[str, Field(pattern=DATASET_ID, description="A dataset id (32 lower-case "
                                                                  "hex digits).")]
MAX_COLUMNS = 500

# --- requests ---------------------------------------------------------------------------------


class InferenceParams(RequestModel):
    """Per-request sampling overrides (recorded with the turn)."""

    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)


class AdvancedOptions(RequestModel):
    data_isolation: bool = Field(default=False, description="Keep this turn to its attached "
                                 "data: no suggested context from earlier turns.")


class ChatRequest(RequestModel):
    """``POST /api/v1/assistant/chat``. Unknown fields are refused (422 names them)."""

    message: NonBlank = Field(description="The user's typed text (non-blank; at most "
                                     "VOICE_MAX_MESSAGE_BYTES UTF-8 bytes).")
    conversation_id: UUID | None = Field(default=None, description="A conversation of the "
                                         "caller's; omitted, a new one is opened.")
    dataset_id: DatasetId | None = Field(default=None, description="An explicit dataset.")
    model_override: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][\w.:-]{0,99}$",
                                       description="The model for this turn, one of "
                                       "VOICE_MODELS (another answers 422 MODEL_NOT_FOUND).")
    file_context: list[Annotated[str, Field(max_length=4000)]] = Field(
        default=[], max_length=20, description="Context strings of attached files; "
        "'ID: <dataset id>' in one attaches that dataset.")
    data_refs: list[DatasetId] = Field(default=[], max_length=20,
                                       description="Datasets to attach, by id.")
    inference_params: InferenceParams | None = None
    focus_context: JsonObject | None = Field(default=None, description="What the user has "
                                             "open full-screen (at most 64 KiB as JSON).")
    selection_state: JsonObject | None = Field(default=None, description="The user's chart "
                                               "and map selections (at most 64 KiB as JSON).")
    agentic_mode: bool = False
    skip_history: bool = Field(default=False, description="Run the turn without the "
                               "conversation's earlier messages.")
    advanced: AdvancedOptions = AdvancedOptions()
    namespace_id: str | None = Field(default=None, pattern=NAMESPACE, description="The "
                                     "namespace the turn works in: it sees only the datasets "
                                     "uploaded into it (omitted: the default namespace).")
    stream: bool = Field(default=True, description="true: a display-event SSE stream; "
                         "false: 202 with the turn to read later.")

# --- responses --------------------------------------------------------------------------------


class DatasetUploaded(BaseModel):
    dataset_id: str
    name: str
    rows: int
    columns: list[str]
    namespace: str | None = None


class ImageUploaded(BaseModel):
    """``201`` for an image: name ``image_id`` in a chat's ``file_context`` (``ID: …``)."""

    image_id: str
    name: str
    media_type: Literal["image/png", "image/jpeg"]
    size_bytes: int
    namespace: str | None = None


class ChatAccepted(BaseModel):
    """``202``: the turn runs; read it at ``…/conversations/{id}/turns/{turn}`` or stream it
    at ``…/conversations/{id}/stream?after={after}``."""

    turn: str
    conversation_id: str
    after: int


class AssistantTurnOut(BaseModel):
    turn: str
    conversation_id: str
    state: Literal["Thinking", "Replied", "Failed", "Cancelled"]
    text: str | None = None
    """The final text, once replied."""
    cards: list[dict[str, JsonValue]] = []
    """Cards shown with the reply (``map_display``, …): ``{card_type, card_data, display_id}``."""
    end_reason: str | None = None
    reason: str | None = None
    """Why it ended so, in words (errors; opened for the conversation's owner)."""
    reason_code: str | None = None
    """Why, as a stable code: the error kinds, or ``step_failed``."""
    cost_usd: float | None = None


class DisplayEventOut(BaseModel):
    """The ``data`` of each ``event: display`` on the assistant streams (``id:`` is the
    conversation's display seq)."""

    id: str
    type: Literal["text_delta", "text_complete", "reasoning", "tool_call", "tool_result",
                  "busy", "idle", "status", "progress", "card", "cost", "error", "warning",
                  "done"]
    channel: str
    scope: str
    message_id: str | None
    verb: str | None
    priority: int
    data: dict[str, JsonValue]
    persistent: bool
    ts: float
    group_id: str | None = None
    parent_id: str | None = None
    display_id: str | None = None
    metadata: dict[str, JsonValue] | None = None


# --- the CSV check ----------------------------------------------------------------------------


class CsvRejected(Exception):
    """The upload is not a usable CSV; the message says why."""


@dataclass(frozen=True)
class CheckedCsv:
    text: str
    columns: list[str]
    rows: int


def check_csv(data: bytes) -> CheckedCsv:
    """The CSV's text, header and row count; ``CsvRejected`` naming the problem."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CsvRejected(f"the file is not UTF-8 text (byte {exc.start})") from None
    if "\x00" in text:
        raise CsvRejected("the file contains NUL bytes; it is not a CSV")
    try:
        records = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    except csv.Error as exc:
        raise CsvRejected(f"the file is not valid CSV: {exc}") from None
    records = [r for r in records if r]  # blank lines carry nothing
    if not records:
        raise CsvRejected("the file is empty: a CSV needs a header and at least one row")
    header = records[0]
    if len(header) > MAX_COLUMNS:
        raise CsvRejected(f"the header has {len(header)} columns; the limit is {MAX_COLUMNS}")
    blank = [i + 1 for i, h in enumerate(header) if not h.strip()]
    if blank:
        raise CsvRejected(f"the header has an empty column name (column {blank[0]})")
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise CsvRejected(f"the header repeats column names: {', '.join(map(repr, dupes))}")
    if len(records) < 2:
        raise CsvRejected("the file has a header but no rows: a CSV needs at least one row")
    for n, row in enumerate(records[1:], start=2):
        if len(row) != len(header):
            raise CsvRejected(f"record {n} has {len(row)} fields; the header has {len(header)}")
    return CheckedCsv(text, header, len(records) - 1)
