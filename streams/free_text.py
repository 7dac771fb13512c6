"""Free text outside the seal: what a record, a dead letter or a log line may say in plain.

A reason or an error message may quote what a participant or a model wrote (the model's own
``COULD_NOT_INTERPRET: …`` words, a validation error echoing a field's value, an exception
carrying a reply). Plaintext like that outlives erasure on every topic, changelog, ClickHouse
row and log. So Voice keeps such text in one of two forms only:

* **sealed** with the data key of the aggregate it belongs to (``seal_text``), beside a plain
  machine-readable code — readable by the aggregate's owner until erasure, then by no one;
* **described** (``describe``): the exception's type and, for a validation error, the fields
  and error types — never the values. An exception's message is kept only when its class says
  it holds Voice's own words (``plain_message = True``: ids, sizes, settings, never content).

This module must never log or return the text it seals.
"""

from __future__ import annotations

import traceback
from typing import Protocol

from pydantic import ValidationError

from schemas.base import Sealed

MAX_TEXT = 4000
"""Characters of a free text kept (sealed); a reason is a sentence, not a transcript."""


class TextSealer(Protocol):
    """What sealing free text needs of ``streams.sealing.Sealer``."""

    def seal(self, conversation: str, content_id: str, plaintext: bytes | str) -> Sealed: ...

    def open_text(self, conversation: str, content_id: str, sealed: Sealed) -> str: ...


def seal_text(sealer: TextSealer, key: str, content_id: str, text: str) -> Sealed:
    """``text`` (cut to ``MAX_TEXT``) sealed under ``key``'s data key for ``content_id``."""
    return sealer.seal(key, content_id, text[:MAX_TEXT])


def open_text(sealer: TextSealer, key: str, content_id: str, sealed: Sealed | None
              ) -> str | None:
    """The sealed text, or None when there is none or it no longer opens (erased, foreign)."""
    if sealed is None:
        return None
    try:
        return sealer.open_text(key, content_id, sealed)
    except Exception:  # KeyErased, KeyNotFound, OpenFailed: the words are gone, by design
        return None


def fields_of(exc: ValidationError) -> str:
    """A validation error as ``loc: type`` per error (at most 5): where and what, no value."""
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['type']}"
             for e in exc.errors()[:5]]
    more = len(exc.errors()) - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def describe(exc: BaseException) -> str:
    """A plain description of ``exc``, safe for a dead letter, a record or a log line."""
    name = type(exc).__name__
    if isinstance(exc, ValidationError):
        return f"{name}: {fields_of(exc)}"
    if getattr(type(exc), "plain_message", False) and str(exc):
        return f"{name}: {exc}"
    return name


def trace_of(exc: BaseException) -> str:
    """Where ``exc`` was raised (its traceback's frames), for a log line: never its message."""
    return "".join(traceback.format_tb(exc.__traceback__)).rstrip()
