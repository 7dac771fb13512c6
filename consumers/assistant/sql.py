"""Checking a model's SQL before it runs, and reading ClickHouse's errors back as corrections.

The sandbox (``sqlbox``) session is ``readonly=1``, which refuses writes, DDL, table functions
and changes of settings, but still runs the scalar ``file()`` and a second statement. So
``check_sql`` (``streams.readonly_sql``, shared with ``voice sql``) is a barrier in front of it:
one statement, starting with SELECT or WITH, no ``INTO OUTFILE``, ``FORMAT`` or ``SETTINGS``, and
no function that reaches files, URLs, other servers or processes.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from streams.readonly_sql import SELECTS, check_read_only

TABLE = "data"


def check_sql(sql: str) -> str:
    """The model's query to run (a SELECT or WITH), or ``SqlRefused``."""
    return check_read_only(sql, SELECTS)


@dataclass(frozen=True)
class EngineError:
    """A ClickHouse error as the sandbox reports it."""

    code: int
    name: str
    message: str


_ERROR = re.compile(r"Code:\s*(\d+)\.\s*(?:DB::Exception:\s*)?(.*?)(?:\s*\(([A-Z_]+)\))?"
                    r"(?:\s*\(version [^)]*\))?\.?\s*$", re.S)


def parse_engine_error(text: str) -> EngineError:
    """Code, name and message of a ``Code: N. DB::Exception: … (NAME)`` error text."""
    m = _ERROR.search(text.strip())
    if not m:
        return EngineError(0, "UNKNOWN", text.strip())
    return EngineError(int(m.group(1)), m.group(3) or "UNKNOWN", m.group(2).strip())


_UNKNOWN_COLUMN = (re.compile(r"Unknown (?:expression )?(?:or function )?identifier "
                              r"[`'\"]?([^`'\"\s]+)[`'\"]?"),
                   re.compile(r"Missing columns: '([^']+)'"),
                   re.compile(r"Unknown (?:identifier|column)[: ]+[`'\"]?([^`'\"\s]+)"))
_UNKNOWN_TABLE = re.compile(r"(?:Unknown table expression identifier|Table|Database)\s+"
                            r"[`'\"]?([\w.]+)[`'\"]?")


def nearest(name: str, candidates: list[str] | tuple[str, ...], n: int = 3) -> list[str]:
    """The candidates closest to ``name`` (case-insensitive), best first."""
    lowered = {c.lower(): c for c in candidates}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    return [lowered[h] for h in hits]


@dataclass(frozen=True)
class Correction:
    """A recoverable mistake in the query: what to tell the model and what it may use."""

    kind: str
    message: str
    alternatives: tuple[str, ...]


def correction_for(error: EngineError, columns: list[str]) -> Correction | None:
    """A Hint-worthy correction for an unknown column or table, else None (a real failure)."""
    if error.name in ("UNKNOWN_IDENTIFIER",) or error.code == 47:
        name = next((m.group(1) for p in _UNKNOWN_COLUMN if (m := p.search(error.message))),
                    None)
        if name is not None:
            near = nearest(name, columns)
            return Correction("unknown_column",
                              f"there is no column {name!r} in table {TABLE!r}"
                              + (f"; did you mean {', '.join(map(repr, near))}?" if near
                                 else "; see the alternatives for its columns"),
                              tuple(near or columns[:20]))
    if error.name in ("UNKNOWN_TABLE", "UNKNOWN_DATABASE") or error.code in (60, 81):
        m = _UNKNOWN_TABLE.search(error.message)
        name = m.group(1) if m else "?"
        return Correction("unknown_table",
                          f"there is no table {name!r}; the dataset is the table {TABLE!r}",
                          (TABLE,))
    return None
