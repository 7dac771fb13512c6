"""The uniform tool contract: every tool result is one envelope, ``Ok | Hint | Err``.

``Ok`` carries rows, a schema *measured* from those rows (never declared: a declared schema is
the silent-failure mode this contract exists to kill), free-form data, advisory warnings and
effects (cards, plan updates). ``Hint`` is a recoverable correction with alternatives; ``Err``
is a real failure. Hint and Err carry no effects: constructing one with effects raises
``ContractViolation``, so a tool cannot side-effect on a path that reports failure.

``render`` is the one text block the model sees for an envelope, identical for every tool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal

from consumers.engine.sanitize import sanitize_json

PREVIEW_ROWS = 50
"""Rows the model sees in a rendered ``Ok``; ``row_count`` says how many there were."""


class ContractViolation(Exception):
    """An envelope that breaks the contract (e.g. a Hint or Err with effects)."""


@dataclass(frozen=True)
class Card:
    """An artifact for the display. ``singleton`` cards (a map, a cited answer) are merged per
    ``(card_type, display_id)`` and emitted once at the end of the turn instead of inline."""

    card_type: str
    card_data: dict[str, Any]
    display_id: str | None = None
    singleton: bool = False


@dataclass(frozen=True)
class PlanStep:
    title: str
    done: bool = False


@dataclass(frozen=True)
class PlanUpdate:
    """The agent's current plan; at the end of a turn unfinished steps become a warning."""

    steps: tuple[PlanStep, ...]


ToolEffect = Card | PlanUpdate


@dataclass(frozen=True)
class Column:
    name: str
    type: str


def measure_schema(rows: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> tuple[Column, ...]:
    """Column names (first-seen order) and types inferred from every row's values."""
    seen: dict[str, set[str]] = {}
    for row in rows:
        for name, value in row.items():
            kinds = seen.setdefault(str(name), set())
            if value is not None:
                kinds.add(_type_name(value))
    return tuple(Column(name, _merge(kinds)) for name, kinds in seen.items())


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, datetime):
        return "datetime"
    if isinstance(value, date):
        return "date"
    if isinstance(value, (dict, list, tuple)):
        return "json"
    if hasattr(value, "item"):  # numpy scalar
        return _type_name(value.item())
    return type(value).__name__


def _merge(kinds: set[str]) -> str:
    if not kinds:
        return "null"
    if kinds == {"int", "float"}:
        return "float"
    return next(iter(kinds)) if len(kinds) == 1 else "mixed"


@dataclass(frozen=True)
class Ok:
    """Success. ``schema`` is measured from ``rows`` when the envelope is built."""

    rows: tuple[dict[str, Any], ...] = ()
    data: Any = None
    warnings: tuple[str, ...] = ()
    effects: tuple[ToolEffect, ...] = ()
    schema: tuple[Column, ...] = field(init=False)
    kind: Literal["ok"] = field(default="ok", init=False)

    def __post_init__(self) -> None:
        rows = tuple(self.rows)
        if not all(isinstance(r, dict) for r in rows):
            raise ContractViolation("Ok.rows must be dicts (one per row)")
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "warnings", tuple(self.warnings))
        object.__setattr__(self, "effects", tuple(self.effects))
        object.__setattr__(self, "schema", measure_schema(rows))
        for effect in self.effects:
            if not isinstance(effect, (Card, PlanUpdate)):
                raise ContractViolation(f"unknown tool effect {effect!r}")

    def with_recorded_schema(self, schema: tuple[Column, ...]) -> Ok:
        """A copy carrying the schema measured when it was recorded (replay): rows that went
        through JSON (dates became text) would otherwise measure differently."""
        copy = Ok(self.rows, self.data, self.warnings, self.effects)
        object.__setattr__(copy, "schema", tuple(schema))
        return copy


@dataclass(frozen=True)
class Hint:
    """A recoverable correction (unknown identifier, missing filter, ambiguous match)."""

    hint_kind: str
    message: str
    alternatives: tuple[str, ...] = ()
    effects: tuple[Any, ...] = ()
    kind: Literal["hint"] = field(default="hint", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "alternatives", tuple(self.alternatives))
        if self.effects:
            raise ContractViolation(f"Hint {self.hint_kind!r} must carry no effects")


@dataclass(frozen=True)
class Err:
    """A real failure (a bug, an outage, a timeout, a cancellation, a refusal)."""

    message: str
    err_kind: str = "error"
    effects: tuple[Any, ...] = ()
    kind: Literal["err"] = field(default="err", init=False)

    def __post_init__(self) -> None:
        if self.effects:
            raise ContractViolation(f"Err {self.err_kind!r} must carry no effects")


ToolEnvelope = Ok | Hint | Err


class HintSignal(Exception):  # noqa: N818 - control flow, deliberately not named *Error
    """Raised by a tool to answer with a ``Hint`` (before it has side-effected anything)."""

    def __init__(self, hint_kind: str, message: str, alternatives: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.hint = Hint(hint_kind, message, tuple(alternatives))


def envelope_to_dict(env: ToolEnvelope) -> dict[str, Any]:
    """The full envelope as JSON values (what a ToolCallEffect records and replay serves)."""
    if isinstance(env, Ok):
        return sanitize_json({
            "kind": "ok", "rows": list(env.rows), "data": env.data,
            "warnings": list(env.warnings),
            "schema": [{"name": c.name, "type": c.type} for c in env.schema],
            "effects": [_effect_dict(e) for e in env.effects],
        })
    if isinstance(env, Hint):
        return {"kind": "hint", "hint_kind": env.hint_kind, "message": env.message,
                "alternatives": list(env.alternatives)}
    return {"kind": "err", "err_kind": env.err_kind, "message": env.message}


def envelope_from_dict(doc: dict[str, Any]) -> ToolEnvelope:
    """Inverse of ``envelope_to_dict``; the recorded (once measured) schema is kept."""
    kind = doc.get("kind")
    if kind == "ok":
        effects = tuple(_effect_from(e) for e in doc.get("effects") or ())
        ok = Ok(rows=tuple(doc.get("rows") or ()), data=doc.get("data"),
                warnings=tuple(doc.get("warnings") or ()), effects=effects)
        if "schema" in doc:
            ok = ok.with_recorded_schema(tuple(Column(c["name"], c["type"])
                                               for c in doc["schema"]))
        return ok
    if kind == "hint":
        return Hint(doc["hint_kind"], doc["message"], tuple(doc.get("alternatives") or ()))
    if kind == "err":
        return Err(doc["message"], doc.get("err_kind", "error"))
    raise ContractViolation(f"not an envelope: kind {kind!r}")


def _effect_dict(effect: ToolEffect) -> dict[str, Any]:
    if isinstance(effect, Card):
        return {"effect": "card", "card_type": effect.card_type, "card_data": effect.card_data,
                "display_id": effect.display_id, "singleton": effect.singleton}
    return {"effect": "plan", "steps": [{"title": s.title, "done": s.done} for s in effect.steps]}


def _effect_from(doc: dict[str, Any]) -> ToolEffect:
    if doc.get("effect") == "card":
        return Card(doc["card_type"], doc.get("card_data") or {}, doc.get("display_id"),
                    bool(doc.get("singleton")))
    return PlanUpdate(tuple(PlanStep(s["title"], bool(s.get("done"))) for s in doc["steps"]))


def render(env: ToolEnvelope) -> str:
    """The text block the model sees: canonical JSON, the same shape for every tool."""
    if isinstance(env, Ok):
        doc: dict[str, Any] = {"ok": True}
        if env.rows:
            doc["row_count"] = len(env.rows)
            doc["schema"] = [{"name": c.name, "type": c.type} for c in env.schema]
            doc["rows"] = list(env.rows[:PREVIEW_ROWS])
            if len(env.rows) > PREVIEW_ROWS:
                doc["rows_truncated"] = f"first {PREVIEW_ROWS} of {len(env.rows)} rows shown"
        if env.data is not None:
            doc["data"] = env.data
        if env.warnings:
            doc["warnings"] = list(env.warnings)
    elif isinstance(env, Hint):
        doc = {"hint": env.hint_kind, "message": env.message}
        if env.alternatives:
            doc["alternatives"] = list(env.alternatives)
    else:
        doc = {"error": env.err_kind, "message": env.message}
    # Canonical (sorted keys): the same envelope always reads the same, also after a round
    # trip through a sealed record, whose JSON is canonical too; replay depends on it.
    return json.dumps(sanitize_json(doc), ensure_ascii=False, allow_nan=False, sort_keys=True)
