"""What an aggregate is: its state, a pure ``decide`` and the ``Decision`` it returns.

An aggregate (a conversation, an assistant chat, an issue, an inbox) is written by one writer
per key. Everything it must write itself is here; everything else — decode, dedupe by command
id, envelopes, produce, table, acknowledgement, dead letters — is ``consumers.frame.writer``'s,
once for all of them.

``decide`` must stay pure: no I/O, no clock but the command's time, no randomness but ids
derived from the command. That is what lets a command redelivered after a crash yield identical
records (same ids, same seqs), which is what makes at-least-once safe.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import orjson

from schemas.base import Record
from streams.envelope import Envelope
from streams.topics import TopicSpec

Outcome = Literal["accepted", "duplicate", "rejected"]

MAX_REMEMBERED = 1024
"""Command ids (and idempotency keys) an aggregate remembers for dedupe; the oldest go first."""


class SeqState(Protocol):
    """A state the writer can sequence: ``seq`` is the seq of the last record appended;
    ``tenant`` the tenant of the command that made it (the writer sets it, and refuses a
    command of another tenant: every aggregate belongs to one tenant)."""

    seq: int
    tenant: str | None


@dataclass(kw_only=True)
class AggregateState:
    """The base of every aggregate's state: its seq and tenant, and the dict a Faust table
    keeps (deep copies both ways, ``plain_copy``, so a state never shares structure with the
    table's value)."""

    seq: int = 0
    """The seq of the last record appended (the writer gives records the next ones)."""
    tenant: str | None = None
    """The tenant it belongs to, from the command that made it (set by the writer)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Any:
        return None if d is None else cls(**plain_copy(d))

    def to_dict(self) -> dict[str, Any]:
        return plain_fields(self)


def plain_copy(value: Any, dataclasses_as_dicts: bool = False) -> Any:
    """A deep copy of a table value: dicts, lists and tuples of strings, numbers, booleans and
    None copied by hand, anything else by ``copy.deepcopy`` (a dataclass as its dict with
    ``dataclasses_as_dicts``, as ``asdict`` makes it).

    ``copy.deepcopy`` (and ``dataclasses.asdict``, which deep-copies every leaf) spent 4–7
    times as long on a conversation's state, copied four times per command
    (``docs/benchmarks.md``, "Records per turn").
    """
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is dict:
        return {k: plain_copy(v, dataclasses_as_dicts) for k, v in value.items()}
    if kind is list:
        return [plain_copy(v, dataclasses_as_dicts) for v in value]
    if kind is tuple:
        return tuple(plain_copy(v, dataclasses_as_dicts) for v in value)
    if dataclasses_as_dicts and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain_fields(value)
    return copy.deepcopy(value)


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON table value, through orjson: the value the table's changelog gives
    back after a recovery (Faust's codec is orjson too), so a tuple comes back a list and a
    dataclass a dict, as they would from the changelog. ~4 times as fast as ``plain_copy`` on
    a turn's workflow state (78 → 14–26 µs with a 150-entry history reference: docs/benchmarks.md,
    issue 14, twenty-first pass). A value orjson refuses (a key that is not a string, an
    integer past 64 bits) is copied by ``plain_copy``."""
    try:
        return orjson.loads(orjson.dumps(value))
    except (orjson.JSONEncodeError, TypeError):
        return plain_copy(value)


def plain_fields(obj: Any) -> dict[str, Any]:
    """A dataclass instance as ``asdict`` makes it (a fresh dict, dataclasses in it as dicts)."""
    return {f.name: plain_copy(getattr(obj, f.name), True) for f in dataclasses.fields(obj)}


S = TypeVar("S", bound=SeqState)


@dataclass(frozen=True)
class Ack:
    """How a command is answered (``CommandAcknowledged`` on ``voice.acks``)."""

    outcome: Outcome
    seq: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def accepted(cls, seq: int | None, **detail: Any) -> Ack:
        return cls("accepted", seq, detail)

    @classmethod
    def rejected(cls, reason: str, **detail: Any) -> Ack:
        return cls("rejected", None, {"reason": reason, **detail})

    @classmethod
    def again(cls, remembered: dict[str, Any]) -> Ack:
        """The answer to a command seen before: what it got then, as a duplicate."""
        rest = dict(remembered)
        return cls("duplicate", rest.pop("seq", None), rest)

    def memo(self) -> dict[str, Any]:
        """What a state remembers of this answer, so ``again`` can repeat it."""
        return {"seq": self.seq, **self.detail}


@dataclass(frozen=True)
class Decision(Generic[S]):
    """What ``decide`` returns: the new state, the records it appended, and the answer.

    ``records`` were appended in order and ``state.seq`` already counts them, so the last one
    holds ``state.seq``. ``ack`` is ``None`` for a command nobody waits on (nothing is produced
    to ``voice.acks``). A state of ``None`` leaves the table as it was.
    """

    state: S | None
    records: tuple[Record, ...] = ()
    ack: Ack | None = None

    @property
    def remembered(self) -> bool:
        """Whether the writer remembers the command id (so a redelivery is not re-applied):
        when it changed something. A refused command is simply refused again."""
        return bool(self.records) or (self.ack is not None and self.ack.outcome == "accepted")


def append(state: SeqState, *records: Record) -> tuple[Record, ...]:
    """Count ``records`` into ``state.seq`` (the writer gives them those seqs; a record that
    folds others, ``Record.seqs`` > 1, takes one seq for each)."""
    state.seq += seqs_of(records)
    return records


def seqs_of(records: tuple[Record, ...]) -> int:
    """How many seqs ``records`` hold."""
    return sum(r.seqs for r in records)


def remember(memory: dict[str, Any], key: str, value: Any, limit: int = MAX_REMEMBERED) -> None:
    """Insert into an insertion-ordered, bounded memory (the oldest entries go first)."""
    memory.pop(key, None)
    memory[key] = value
    while len(memory) > limit:
        memory.pop(next(iter(memory)))


class Aggregate(Generic[S]):
    """One aggregate kind: subclass it, set the class attributes, write ``decide``.

    The defaults remember each applied command's answer in ``state.commands`` (bounded) and
    name records ``{command id}-{seq}``; override ``remembered``/``remember``/``record_id``
    where the aggregate's identity is another (the inbox's notification ids).
    """

    name: ClassVar[str]
    """The Faust table holding its states (one per key)."""
    log: ClassVar[TopicSpec]
    """The topic its records are appended to (key = the aggregate id)."""
    source: ClassVar[str]
    """``ce_source`` of its records and acknowledgements."""
    commands: ClassVar[tuple[type[Record], ...]]
    """The command record types it owns on ``voice.commands``."""
    state: ClassVar[type[AggregateState]]
    """Its state's type."""
    what: ClassVar[str] = "aggregate"
    """What a caller calls one (``no such {what}``: the edge's 404 for a missing one, and for
    one of another tenant, which must look the same)."""

    def load(self, raw: dict[str, Any] | None) -> S | None:
        return self.state.from_dict(raw)  # type: ignore[no-any-return]

    def dump(self, state: S) -> dict[str, Any]:
        return state.to_dict()  # type: ignore[attr-defined, no-any-return]

    def decide(self, state: S | None, cmd: Envelope) -> Decision[S]:
        raise NotImplementedError

    def acknowledges(self, cmd: Envelope) -> bool:  # noqa: ARG002
        """Whether a redelivered ``cmd`` is answered again (someone waits on its answer)."""
        return True

    def remembered(self, state: S | None, cmd: Envelope) -> dict[str, Any] | None:
        """The memo of ``cmd`` if it was applied before, else ``None``."""
        if state is None:
            return None
        memo: dict[str, Any] | None = state.commands.get(cmd.id)  # type: ignore[attr-defined]
        return memo

    def remember(self, state: S, cmd: Envelope, memo: dict[str, Any]) -> None:
        remember(state.commands, cmd.id, memo)  # type: ignore[attr-defined]

    def record_id(self, cmd: Envelope, seq: int, record: Record) -> str:  # noqa: ARG002
        return f"{cmd.id}-{seq}"

    def placed(self, state: S, records: Sequence[tuple[Envelope, int, int]]) -> None:
        """Where the broker put the decided records — (envelope, partition, offset) each, in
        order — told after it took them and before ``state`` is written, for a state that
        keeps positions of its own log. Nothing by default."""

    def follow_ups(self, state: S, records: Sequence[tuple[Envelope, int, int]]
                   ) -> list[tuple[TopicSpec, Envelope]]:
        """What the placed ``records`` start on other topics — (topic, envelope) each, an id
        derived from the record that starts it — produced after them and before ``state`` is
        written: a crash in between decides the command again, so the same follow-ups are
        produced again and none is lost (a reader tells the same id twice). None by default."""
        return []
