"""The SQL sandbox: an embedded ClickHouse (chDB) in a child process that holds one dataset.

Why a child process: chDB allows one embedded engine per process, bound to one data folder, so
an engine in the worker (or in a test process) would clash with any other chDB user there; a
query that hangs can only be stopped by killing its process; and a crash in the engine must not
take the worker down. The child holds one dataset at a time, as the in-memory table
``sandbox.data``, loaded from CSV text sent over the pipe (the plaintext never touches disk),
and answers queries on a session that is ``readonly=1`` (no writes, no DDL, no table functions
such as ``file()`` or ``url()``, no change of settings). One query runs at a time.

Protocol: one JSON object per line each way, on the child's stdin and a private copy of its
stdout (fd 1 itself is pointed at stderr, so nothing the engine prints can corrupt it).

This module imports nothing from Voice: the child runs it as a script.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

MAX_EXECUTION_S = 30


class SandboxError(Exception):
    """The engine refused or failed a load or a query; ``text`` is ClickHouse's own message."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class SandboxTimeout(SandboxError):
    """The query ran longer than its timeout; the child was killed."""


@dataclass(frozen=True)
class QueryResult:
    columns: list[tuple[str, str]]
    """(name, ClickHouse type) in result order."""
    rows: list[dict[str, Any]]
    total: int
    """Rows the query produced (``rows`` holds at most the requested maximum)."""


class SqlBox:
    """The parent's handle on the sandbox child (started lazily, restarted after a failure).

    Thread-safe: tools run in threads; one request is on the pipe at a time.
    """

    def __init__(self, timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._loaded: str | None = None
        self._lock = threading.Lock()

    def query(self, key: str, csv_text: str, sql: str, max_rows: int) -> QueryResult:
        """Run ``sql`` over the dataset ``key`` (loaded from ``csv_text`` unless it is the one
        the child holds); ``SandboxError`` with ClickHouse's message when it fails."""
        with self._lock:
            if self._loaded != key:
                self._loaded = None
                self._call({"op": "load", "csv": csv_text})
                self._loaded = key
            resp = self._call({"op": "query", "sql": sql, "max_rows": max_rows})
        return QueryResult([(c[0], c[1]) for c in resp["columns"]], resp["rows"], resp["total"])

    def close(self) -> None:
        """Stop the child (the next query starts a new one)."""
        with self._lock:
            self._kill()

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL)
            self._loaded = None
        return self._proc

    def _kill(self) -> None:
        proc, self._proc, self._loaded = self._proc, None, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._kill()
            raise SandboxError("the SQL sandbox stopped; try again") from None
        # The first start imports chDB (about a second): the timeout covers the answer only.
        timeout = self.timeout_s + (5.0 if request["op"] == "load" else 0.0)
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            self._kill()
            raise SandboxTimeout(f"the query ran longer than {self.timeout_s:g} s and was "
                                 "stopped")
        line = proc.stdout.readline()
        if not line:
            self._kill()
            raise SandboxError("the SQL sandbox stopped; try again")
        resp = json.loads(line)
        if not resp.get("ok"):
            raise SandboxError(str(resp.get("error") or "unknown error"))
        return resp


# --- the child ---------------------------------------------------------------------------------


def _escaped(text: str) -> str:
    # Query parameters are parsed in ClickHouse's "escaped" format.
    return (text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
            .replace("\r", "\\r"))


def _output(result: Any) -> str:
    data = result.bytes() if hasattr(result, "bytes") else str(result).encode()
    return data.decode("utf-8") if data else ""


def _serve() -> None:  # pragma: no cover - runs in the child process
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    from chdb.session import Session

    admin = Session(":memory:")
    admin.query("CREATE DATABASE IF NOT EXISTS sandbox")
    reader = Session(":memory:")
    reader.query("USE sandbox")
    reader.query(f"SET max_execution_time = {MAX_EXECUTION_S}, "
                 "output_format_json_quote_64bit_integers = 0, "
                 "output_format_json_quote_decimals = 0")
    reader.query("SET readonly = 1")
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if req["op"] == "load":
                admin.query("DROP TABLE IF EXISTS sandbox.data")
                admin.query("CREATE TABLE sandbox.data ENGINE = Memory AS "
                            "SELECT * FROM format(CSVWithNames, {csv:String})",
                            params={"csv": _escaped(req["csv"])})
                resp: dict[str, Any] = {"ok": True}
            else:
                out = _output(reader.query(req["sql"], "JSONCompact"))
                doc = json.loads(out) if out.strip() else {"meta": [], "data": []}
                names = [m["name"] for m in doc["meta"]]
                rows = [dict(zip(names, r, strict=False))
                        for r in doc["data"][:int(req["max_rows"])]]
                resp = {"ok": True, "columns": [[m["name"], m["type"]] for m in doc["meta"]],
                        "rows": rows, "total": len(doc["data"])}
        except Exception as exc:  # every failure is an answer; the child goes on
            resp = {"ok": False, "error": str(exc)}
        proto.write(json.dumps(resp, default=str) + "\n")
        proto.flush()


if __name__ == "__main__":  # pragma: no cover
    _serve()
