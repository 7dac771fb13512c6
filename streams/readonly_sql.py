"""The one read-only SQL check, used by ``voice sql`` (telemetry) and the assistant's
``query_dataset`` tool alike.

The engines are the real barrier (a ``readonly=1`` session refuses writes, DDL, table functions
and changed settings). This check only gives a clear answer first and covers what readonly does
not: one statement, a read keyword first, no ``INTO OUTFILE`` (which writes a file even in
readonly mode), no ``FORMAT`` clause (callers render results themselves). Comments, string
literals and quoted names are masked, so keywords inside them never count.
"""

from __future__ import annotations

import re

SELECTS = ("SELECT", "WITH")
"""Queries that return rows of data (the assistant's tools)."""
READS = (*SELECTS, "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")
"""Every read statement (``voice sql``)."""


class SqlRefused(ValueError):
    """The SQL is not a single read-only statement; the message says why."""


_LEXEME = re.compile(r"""
    (?P<comment>--[^\n]*|/\*.*?(?:\*/|$))
  | (?P<string>'(?:[^'\\]|\\.|'')*(?:'|$))
  | (?P<quoted>"(?:[^"\\]|\\.|"")*(?:"|$)|`(?:[^`\\]|\\.|``)*(?:`|$))
""", re.S | re.X)


def _masked(sql: str) -> str:
    """``sql`` with comments blanked and literals/quoted names replaced by placeholders."""
    def sub(m: re.Match[str]) -> str:
        if m.group("comment"):
            return " "
        return "'_'" if m.group("string") else '"_"'
    return _LEXEME.sub(sub, sql)


def check_read_only(sql: str, allowed: tuple[str, ...] = READS) -> str:
    """The statement to run (blanks and a trailing ``;`` removed), or ``SqlRefused``."""
    text = sql.strip()
    masked = _masked(text).strip()
    if masked.endswith(";"):
        masked = masked[:-1].rstrip()
        text = text[:text.rstrip().rfind(";")].rstrip()
    if not masked:
        raise SqlRefused("the query is empty")
    if ";" in masked:
        raise SqlRefused("only one statement may run; remove the ';' between statements")
    first = re.match(r"\(*\s*([A-Za-z]+)", masked)
    keyword = first.group(1).upper() if first else masked[:20]
    if keyword not in allowed:
        raise SqlRefused(f"only read statements run here ({', '.join(allowed)}); "
                         f"{keyword!r} is refused")
    if re.search(r"\bINTO\s+OUTFILE\b", masked, re.I):
        raise SqlRefused("INTO OUTFILE is refused: queries only read")
    if re.search(r"\bFORMAT\s+[A-Za-z]\w*\s*$", masked, re.I):
        raise SqlRefused("a FORMAT clause is not allowed; results come back as rows")
    return text
