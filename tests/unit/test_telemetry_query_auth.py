"""The sink's SQL endpoint as a trust boundary: the real ``QueryServer`` on an ephemeral loopback
port over an embedded chDB store in tmp_path, driven with raw HTTP as a browser, a stranger, a
participant, an analyst and a broken client would drive it.

Proves: no token → 401, a bad one → 401 without echoing it, a role without ``telemetry.query``
→ 403; a cross-site form post (``text/plain`` with an ``Origin``), or anything else a web page can
send, is refused and runs nothing; no CORS header is ever answered; bodies over the limit → 413,
malformed → 400, never a traceback; the server keeps answering after garbage, a huge body, a
stalled or half-closed client, and a flood of them; ``voice sql`` passes a token (given, or
minted in dev/test) and says clearly what to set in prod.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from streams.settings import DEV_JWT_SECRET
from streams.tokens import decode_claims, mint_token
from telemetry.endpoint import MAX_BODY_BYTES, MAX_CONCURRENT, QUERY_PATH, QueryServer
from telemetry.query import QueryFailed, client_token, run_sql
from telemetry.schema import ensure_schema
from telemetry.store import ClickHouseStore, TelemetrySettings, open_store

SECRET = "test-secret-for-the-telemetry-endpoint-0123456789"
MASTER_KEY = base64.b64encode(b"k" * 32).decode()
COUNT = "SELECT count() AS n FROM voice.events"
TIMEOUT_S = 1.5
"""The server's request timeout here (10 s in a deployment), so stalled clients end soon."""


@pytest.fixture
def tsettings(tmp_path: Path) -> TelemetrySettings:
    return TelemetrySettings(state_dir=tmp_path, env="test", jwt_secret=SECRET,
                             telemetry_query_port=0)


class Recorder:
    """The statements the server handed to its store, so a test can see that none ran."""

    def __init__(self, store: ClickHouseStore) -> None:
        self.ran: list[str] = []
        self._query = store.query
        store.query = self.query  # type: ignore[method-assign]

    def query(self, sql: str) -> Any:
        self.ran.append(sql)
        return self._query(sql)


@pytest.fixture
def server(tsettings: TelemetrySettings) -> Iterator[QueryServer]:
    writer = open_store(tsettings)
    ensure_schema(writer)
    srv = QueryServer(tsettings, open_store(tsettings, readonly=True),
                      request_timeout_s=TIMEOUT_S).start()
    srv.recorder = Recorder(srv.store)  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()
        writer.close()


def ran(server: QueryServer) -> list[str]:
    return server.recorder.ran  # type: ignore[attr-defined]


def token(settings: TelemetrySettings, role: str = "analyst", **kw: Any) -> str:
    return mint_token(settings, "ana", role, **kw)


def call(server: QueryServer, body: bytes | str | None = None, *, method: str = "POST",
         path: str = QUERY_PATH, headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One request with exactly these headers (http.client adds Host and Content-Length)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(raw or b"{}")
    finally:
        conn.close()


def ask(server: QueryServer, sql: str, bearer: str | None, **extra: str
        ) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = {"Content-Type": "application/json", **extra}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    return call(server, json.dumps({"sql": sql}), headers=headers)


def raw_exchange(server: QueryServer, data: bytes, half_close: bool = False) -> bytes:
    """Send bytes on a fresh socket and read whatever comes back until the server closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed while we were still sending
            pass
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        return out


def still_answers(server: QueryServer, settings: TelemetrySettings) -> None:
    status, _, doc = ask(server, COUNT, token(settings))
    assert (status, doc["rows"]) == (200, [[0]]), doc


# -- who may ask -------------------------------------------------------------------------------

def test_a_token_with_telemetry_query_is_required(server, tsettings) -> None:
    status, headers, doc = ask(server, COUNT, None)
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert "Bearer" in doc["error"]
    status, _, doc = call(server, json.dumps({"sql": COUNT}), headers={
        "Content-Type": "application/json", "Authorization": f"Basic {token(tsettings)}"})
    assert status == 401
    other = tsettings.model_copy(update={"jwt_secret": SecretStr("another-secret-" * 4)})
    expired = mint_token(tsettings, "ana", "analyst", ttl_s=-120)
    for bad in ("not.a.jwt", token(other), expired, token(tsettings) + "x"):
        status, _, doc = ask(server, COUNT, bad)
        assert status == 401, (bad, doc)
        assert bad not in json.dumps(doc)
    assert ran(server) == []
    for role in ("participant", "staff", "reviewer", "representative"):
        status, _, doc = ask(server, COUNT, token(tsettings, role))
        assert status == 403 and "telemetry.query" in doc["error"], (role, doc)
    assert ran(server) == []
    for role in ("analyst", "operator"):
        status, _, doc = ask(server, COUNT, token(tsettings, role))
        assert (status, doc["columns"], doc["rows"]) == (200, ["n"], [[0]]), (role, doc)
    # The capability of any membership counts: a participant of t1 who is analyst of t2.
    status, _, _ = ask(server, COUNT, token(tsettings, "participant", tenant="t1",
                                            memberships={"t2": "analyst"}))
    assert status == 200


# -- never from a web page ---------------------------------------------------------------------

def test_a_cross_site_form_post_is_refused_and_runs_nothing(server, tsettings) -> None:
    """What a page on any site can make a browser send, with no preflight: a form post."""
    form = {"Content-Type": "text/plain", "Origin": "https://evil.example",
            "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    status, headers, doc = call(server, "SELECT * FROM voice.events", headers=form)
    assert status == 403 and "web page" in doc["error"]
    assert not any(h.startswith("access-control-") for h in headers)
    # Even carrying a valid token and JSON (a page that somehow had one): an Origin refuses it.
    for extra in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                  {"Origin": f"http://127.0.0.1:{server.port}"},
                  {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                  {"Host": "evil.example:8124"}):  # a DNS-rebound page names its own host
        status, headers, doc = ask(server, COUNT, token(tsettings), **extra)
        assert status == 403, (extra, doc)
        assert not any(h.startswith("access-control-") for h in headers)
    # Simple-request content types are refused even from a non-browser with a token.
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        status, _, doc = call(server, f"sql={COUNT}", headers={
            "Content-Type": ctype, "Authorization": f"Bearer {token(tsettings)}"})
        assert status == 415 and "application/json" in doc["error"], ctype
    assert ran(server) == []
    still_answers(server, tsettings)  # a command-line client (Sec-Fetch-Site: none) is fine
    assert ask(server, COUNT, token(tsettings), **{"Sec-Fetch-Site": "none"})[0] == 200


def test_only_post_to_the_one_path_and_no_cors(server, tsettings) -> None:
    auth = {"Authorization": f"Bearer {token(tsettings)}", "Content-Type": "application/json"}
    status, headers, doc = call(server, method="GET", headers=auth)
    assert status == 405 and headers["allow"] == "POST"
    status, headers, _ = call(server, method="OPTIONS", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 405 and not any(h.startswith("access-control-") for h in headers)
    for path in ("/", "/query/x", "/QUERY"):
        status, _, doc = call(server, json.dumps({"sql": COUNT}), path=path, headers=auth)
        assert status == 404 and QUERY_PATH in doc["error"]
    assert ran(server) == []


# -- what it runs ------------------------------------------------------------------------------

@pytest.mark.parametrize(("sql", "why"), [
    ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "file() is refused"),
    ("SELECT file('/etc/passwd')", "file() is refused"),
    ("SELECT * FROM `url`('http://127.0.0.1:1/x', 'CSV')", "url() is refused"),
    ("SELECT 1 SETTINGS readonly = 0", "SETTINGS"),
    ("SELECT 1; DROP TABLE voice.events", "one statement"),
    ("SELECT * FROM voice.events INTO OUTFILE '/tmp/voice-leak'", "INTO OUTFILE"),
    ("SELECT 1 /* /* */ ' */ FROM file('/etc/passwd') -- '", "file() is refused"),
    ("DROP TABLE voice.events", "only read statements"),
])
def test_refused_sql_never_reaches_the_store(server, tsettings, sql, why) -> None:
    status, _, doc = ask(server, sql, token(tsettings))
    assert status == 400 and why in doc["error"], doc
    assert ran(server) == []


# -- bad input never breaks it -----------------------------------------------------------------

def test_malformed_bodies_are_400_and_never_a_traceback(server, tsettings) -> None:
    bearer = {"Authorization": f"Bearer {token(tsettings)}", "Content-Type": "application/json"}
    bodies: list[bytes] = [b"", b"SELECT 1", b"{", b"[]", b'{"sql": 1}', b'{"query": "SELECT 1"}',
                           b'{"sql": "SELECT 1", "format": "json"}', b"\xff\xfe{}",
                           b'{"sql": "SELECT \'\\ud800\'"}', b'{"sql": ""}', b"null"]
    for body in bodies:
        status, _, doc = call(server, body, headers=bearer)
        assert status == 400, (body, doc)
        assert "Traceback" not in doc["error"] and 'File "' not in doc["error"]
    # A statement the engine fails: its message, not a 500.
    status, _, doc = ask(server, "SELECT no_such_column FROM voice.events", token(tsettings))
    assert status == 400 and "no_such_column" in doc["error"]
    assert "Traceback" not in doc["error"]
    still_answers(server, tsettings)


def test_oversized_body_is_413_before_it_is_read_or_the_token_checked(server, tsettings) -> None:
    # Declared, not sent, no token: the server answers at once, reading nothing.
    head = (f"POST {QUERY_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            f"\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n").encode()
    t0 = time.monotonic()
    reply = raw_exchange(server, head)
    assert reply.startswith(b"HTTP/1.0 413") and time.monotonic() - t0 < TIMEOUT_S
    assert str(MAX_BODY_BYTES).encode() in reply
    # Sent whole anyway (the client may see the 413 or a reset, as the rest goes unread).
    reply = raw_exchange(server, head + b"x" * (4 * MAX_BODY_BYTES))
    assert reply == b"" or reply.startswith(b"HTTP/1.0 413")
    no_length = (f"POST {QUERY_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "5\r\nhello\r\n0\r\n\r\n").encode()
    assert raw_exchange(server, no_length).startswith(b"HTTP/1.0 411")
    assert ran(server) == []
    still_answers(server, tsettings)


def test_keeps_answering_after_garbage_stalled_and_half_closed_clients(server, tsettings
                                                                        ) -> None:
    for junk in (b"\x00\xff\xfe garbage\r\n\r\n", b"GET\r\n\r\n", b"POST /query HTTP/9.9\r\n\r\n",
                 b"POST /query HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n",
                 b"POST /" + b"q" * 70_000 + b" HTTP/1.1\r\n\r\n", b"\r\n" * 10):
        reply = raw_exchange(server, junk, half_close=True)
        assert b"Traceback" not in reply
        still_answers(server, tsettings)
    # Half-closed mid-body: the declared length never arrives.
    body = json.dumps({"sql": COUNT}).encode()
    head = (f"POST {QUERY_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token(tsettings)}\r\n"
            f"Content-Length: {len(body) + 100}\r\n\r\n").encode()
    reply = raw_exchange(server, head + body, half_close=True)
    assert reply.startswith(b"HTTP/1.0 400") and b"body ended" in reply
    # Stalled clients: one holding a connection does not block the others…
    stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    stalled[0].sendall(b"POST /query HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never end
    stalled[1].sendall(head)  # body never comes
    still_answers(server, tsettings)
    # … and a flood of them is answered 503 at once, never queued forever.
    stalled += [socket.create_connection(("127.0.0.1", server.port))
                for _ in range(MAX_CONCURRENT + 2)]
    time.sleep(0.1)
    status = raw_exchange(server, b"POST /query HTTP/1.1\r\n\r\n")
    assert status.startswith(b"HTTP/1.0 503"), status[:80]
    time.sleep(TIMEOUT_S + 1)  # past the request timeout: the stalled ones are dropped
    still_answers(server, tsettings)
    for s in stalled:
        s.close()
    assert set(ran(server)) == {COUNT}


# -- voice sql ---------------------------------------------------------------------------------

def test_voice_sql_passes_a_token_and_says_what_to_set_in_prod(server, tsettings) -> None:
    ts = tsettings.model_copy(update={"telemetry_query_port": server.port})
    out = run_sql(ts, COUNT, "json", token=token(tsettings, "operator"))
    assert json.loads(out) == [{"n": 0}]
    with pytest.raises(QueryFailed, match="refused the token.*telemetry.query"):
        run_sql(ts, COUNT, token=token(tsettings, "participant"))
    # prod: nothing is minted; without a token the endpoint's 401 becomes what to set.
    prod = ts.model_copy(update={"env": "prod", "master_key": SecretStr(MASTER_KEY)})
    assert client_token(prod) is None and client_token(prod, " t ") == "t"
    with pytest.raises(QueryFailed, match="set VOICE_TOKEN or pass --token"):
        run_sql(prod, COUNT)
    assert json.loads(run_sql(prod, COUNT, "json", token=token(tsettings))) == [{"n": 0}]
    # dev/test mint an analyst token only with the built-in dev secret.
    assert client_token(ts) is None  # a real secret: not ours to mint with
    dev = ts.model_copy(update={"jwt_secret": SecretStr(DEV_JWT_SECRET)})
    assert decode_claims(dev, client_token(dev) or "").role == "analyst"


def test_the_cli_reads_voice_token(server, tsettings, monkeypatch) -> None:
    from deploy.cli import app

    env = {"VOICE_STATE_DIR": str(tsettings.state_dir), "VOICE_ENV": "prod",
           "VOICE_JWT_SECRET": SECRET, "VOICE_MASTER_KEY": MASTER_KEY,
           "VOICE_TELEMETRY_QUERY_PORT": str(server.port)}
    for name in ("VOICE_TOKEN", "VOICE_CLICKHOUSE_URL"):
        monkeypatch.delenv(name, raising=False)
    runner = CliRunner()
    res = runner.invoke(app, ["sql", COUNT, "--format", "json"], env=env)
    assert res.exit_code == 1 and "VOICE_TOKEN" in res.output, res.output
    res = runner.invoke(app, ["sql", COUNT, "--format", "json"],
                        env={**env, "VOICE_TOKEN": token(tsettings)})
    assert res.exit_code == 0 and json.loads(res.output) == [{"n": 0}], res.output
    res = runner.invoke(app, ["sql", COUNT, "--format", "csv", "--token",
                              token(tsettings, "operator")], env=env)
    assert res.exit_code == 0 and res.output.split() == ["n", "0"], res.output


def test_voice_sql_with_no_sink_opens_the_store_itself_in_prod(tsettings) -> None:
    writer = open_store(tsettings)
    ensure_schema(writer)
    writer.close()
    from deploy.kafka_local import free_port

    prod = tsettings.model_copy(update={"env": "prod", "master_key": SecretStr(MASTER_KEY),
                                        "telemetry_query_port": free_port()})
    assert run_sql(prod, COUNT, "csv").split() == ["n", "0"]
