"""The one read-only SQL check, used by ``voice sql`` (telemetry) and the assistant's
``query_dataset`` tool alike.

A ``readonly=1`` session refuses writes, DDL and changed settings, but not everything that
reaches outside the store: in chDB it still runs the scalar ``file('/etc/…')``, lets
``DESCRIBE url('http://…')`` open a connection, runs ``SELECT 1; SELECT 2`` as two statements,
and ``INTO OUTFILE`` writes a file. So this check is a barrier of its own, not only an early
message: one statement, a read keyword first, no ``INTO OUTFILE``, no ``FORMAT`` (callers render
results themselves), no ``SETTINGS``, and no function that reads files, URLs, other servers or
processes (``file``, ``url``, ``s3``, ``remote``, …), however written: any case, quoted
(`` `file`(…) ``), or with a comment before its parenthesis.

The statement is lexed the way ClickHouse lexes it (``--``, ``# `` and nested ``/* */``
comments, ``'…'`` strings, ``"…"``/`` `…` `` names, ``$tag$…$tag$`` heredocs), so a keyword
inside a literal never counts and a quote inside a comment never hides code. Where the two
lexers could disagree (a ``$`` that is not a heredoc), the statement is refused: it must never
be that this check reads less code than the engine runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SELECTS = ("SELECT", "WITH")
"""Queries that return rows of data (the assistant's tools)."""
READS = (*SELECTS, "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")
"""Every read statement (``voice sql``)."""

OUTSIDE_FUNCTIONS = (
    "file", "fileCluster", "url", "urlCluster", "remote", "remoteSecure", "cluster",
    "clusterAllReplicas", "mysql", "postgresql", "sqlite", "mongodb", "redis", "odbc", "jdbc",
    "input", "executable", "gcs", "oss", "cosn", "arrowFlight", "ytsaurus", "catboostEvaluate",
)
"""Functions (table or scalar) that read files, URLs, other servers or processes."""
OUTSIDE_FAMILIES = ("s3", "hdfs", "azureBlobStorage", "iceberg", "deltaLake", "hudi", "paimon")
"""Name prefixes of such families (``s3Cluster``, ``icebergLocal``, ``deltaLakeAzure``, …)."""

_OUTSIDE = re.compile(
    r"(?<![\w$])(" + "|".join(OUTSIDE_FUNCTIONS) + r"|(?:" + "|".join(OUTSIDE_FAMILIES)
    + r")\w*)\s*\(", re.I)


class SqlRefused(ValueError):
    """The SQL is not a single read-only statement; the message says why."""


@dataclass(frozen=True)
class _Lexed:
    code: str
    """Comments blanked, strings as ``'_'``, quoted names as ``"_"``: keywords only."""
    calls: str
    """The same, but quoted names as their bare text, so ``"file"(…)`` is seen as a call."""
    end: int
    """Index in the source just past the last character of code (comments trail it)."""
    semicolons: tuple[int, ...]
    """Indexes in the source of every ``;`` outside literals and comments."""
    stray_dollar: bool
    """A ``$`` outside literals that is not a ``$tag$…$tag$`` heredoc."""


def _quoted_end(sql: str, i: int) -> int:
    """Index just past the literal or quoted name opened at ``i`` (``\\`` escapes, doubling)."""
    q, j, n = sql[i], i + 1, len(sql)
    while j < n:
        if sql[j] == "\\":
            j += 2
        elif sql[j] == q:
            if j + 1 < n and sql[j + 1] == q:
                j += 2
            else:
                return j + 1
        else:
            j += 1
    return n  # unterminated: the engine refuses it; nothing after it is code


def _comment_end(sql: str, i: int) -> int | None:
    """Index just past the comment starting at ``i``, or None when none starts there."""
    n = len(sql)
    if sql.startswith("--", i) or (sql[i] == "#" and i + 1 < n and sql[i + 1] in " !"):
        j = sql.find("\n", i)
        return n if j < 0 else j
    if sql.startswith("/*", i):  # ClickHouse nests block comments, as the SQL standard does
        depth, j = 1, i + 2
        while j < n and depth:
            if sql.startswith("/*", j):
                depth, j = depth + 1, j + 2
            elif sql.startswith("*/", j):
                depth, j = depth - 1, j + 2
            else:
                j += 1
        return j
    return None


_HEREDOC_TAG = re.compile(r"\$\w*\$")


def _heredoc_end(sql: str, i: int) -> int | None:
    """Index just past the ``$tag$…$tag$`` starting at ``i``, or None when none starts there
    (a ``$`` inside a word, as in ``a$b``, never opens one)."""
    tag = _HEREDOC_TAG.match(sql, i)
    if tag is None or (i > 0 and (sql[i - 1].isalnum() or sql[i - 1] in "_$")):
        return None
    close = sql.find(tag.group(0), tag.end())
    return None if close < 0 else close + len(tag.group(0))


def _lex(sql: str) -> _Lexed:
    code: list[str] = []
    calls: list[str] = []
    semicolons: list[int] = []
    i, n, end, stray = 0, len(sql), 0, False
    while i < n:
        c = sql[i]
        stop = _comment_end(sql, i)
        if stop is not None:
            code.append(" ")
            calls.append(" ")
            i = stop
            continue
        if c in "'\"`":
            j = _quoted_end(sql, i)
            if c == "'":
                code.append("'_'")
                calls.append("'_'")
            else:
                code.append('"_"')
                calls.append(" " + re.sub(r"\W", "_", sql[i + 1:j - 1]) + " ")
            i = end = j
            continue
        if c == "$":
            heredoc = _heredoc_end(sql, i)
            if heredoc is not None:
                code.append("'_'")
                calls.append("'_'")
                i = end = heredoc
                continue
            stray = True
        if c == ";":
            semicolons.append(i)
        if not c.isspace():
            end = i + 1
        code.append(c)
        calls.append(c)
        i += 1
    return _Lexed("".join(code), "".join(calls), end, tuple(semicolons), stray)


def check_read_only(sql: str, allowed: tuple[str, ...] = READS) -> str:
    """The statement to run (blanks, a trailing ``;`` and trailing comments removed), or
    ``SqlRefused`` naming what is refused."""
    lexed = _lex(sql)
    text = sql[:lexed.end].strip()
    code = lexed.code.strip()
    if code.endswith(";"):  # the statement's own terminator, not a second statement
        text = sql[:lexed.semicolons[-1]].strip()
        code = code[:-1].strip()
    if not code:
        raise SqlRefused("the query is empty")
    if ";" in code:
        raise SqlRefused("only one statement may run; remove the ';' between statements")
    if lexed.stray_dollar:
        raise SqlRefused("'$' may appear only in a string or a $$…$$ heredoc")
    first = re.match(r"\(*\s*([A-Za-z]+)", code)
    keyword = first.group(1).upper() if first else code[:20]
    if keyword not in allowed:
        raise SqlRefused(f"only read statements run here ({', '.join(allowed)}); "
                         f"{keyword!r} is refused")
    if re.search(r"\bINTO\s+OUTFILE\b", code, re.I):
        raise SqlRefused("INTO OUTFILE is refused: queries only read")
    if re.search(r"\bSETTINGS\b", code, re.I):
        raise SqlRefused("a SETTINGS clause is refused: queries run with the store's settings "
                         '(quote a column named settings: "settings")')
    if m := _OUTSIDE.search(lexed.calls):
        raise SqlRefused(f"{m.group(1)}() is refused: queries read only the store's tables, "
                         "never files, URLs, other servers or processes")
    if re.search(r"\bFORMAT\s+[A-Za-z]\w*\s*$", code, re.I):
        raise SqlRefused("a FORMAT clause is not allowed; results come back as rows")
    return text
