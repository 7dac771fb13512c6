"""The one read-only SQL check (``streams.readonly_sql``): every refused form, the tricks that
try to hide one (case, comments, quoted names, literals), and the holes of a ``readonly=1``
chDB session that make the check a barrier of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.readonly_sql import SELECTS, SqlRefused, check_read_only
from telemetry.store import TelemetrySettings, open_store

ALLOWED = [
    ("SELECT 1", "SELECT 1"),
    ("  with x AS (SELECT 1) SELECT * FROM x;", "with x AS (SELECT 1) SELECT * FROM x"),
    ("SELECT 1; -- done;", "SELECT 1"),  # the terminator and a trailing comment are dropped
    ("SELECT 1 /* trailing */", "SELECT 1"),
    ("-- note\nDESCRIBE voice.events", "-- note\nDESCRIBE voice.events"),
    ("(SELECT 1)", "(SELECT 1)"),
    ("/* c */ select 2", "/* c */ select 2"),
    ("SHOW TABLES FROM voice", "SHOW TABLES FROM voice"),
    ("EXPLAIN SELECT 1", "EXPLAIN SELECT 1"),
    # the words, inside literals, names and comments, are not the clauses
    ("SELECT 'file(1); SETTINGS INTO OUTFILE' AS s", None),
    ('SELECT "settings", `file` FROM t', None),
    ("SELECT 1 -- SETTINGS readonly = 0; file('x')", "SELECT 1"),
    ("SELECT $$ ; file('x') $$ AS s", None),
    ("SELECT $tag$ it's $tag$", None),
    ("SELECT 'it''s', 'a\\'b' FROM t", None),
    # names that only start like a refused function
    ("SELECT URLHierarchy(u), profile, fileName, remote_addr(1), x.file FROM t", None),
    ("SELECT * FROM numbers(3)", None),
]


@pytest.mark.parametrize(("sql", "runs"), ALLOWED)
def test_reads_pass_and_come_back_runnable(sql: str, runs: str | None) -> None:
    assert check_read_only(sql) == (runs if runs is not None else sql)


REFUSED = [
    # not a read
    ("INSERT INTO t VALUES (1)", "'INSERT' is refused"),
    ("DROP TABLE voice.events", "'DROP' is refused"),
    ("OPTIMIZE TABLE voice.events", "'OPTIMIZE' is refused"),
    ("SYSTEM SHUTDOWN", "'SYSTEM' is refused"),
    ("ALTER TABLE x DELETE WHERE 1", "'ALTER' is refused"),
    ("SET readonly = 0", "'SET' is refused"),
    ("/* SELECT */ DROP TABLE t", "'DROP' is refused"),
    ("", "empty"), ("-- only a comment", "empty"), (";", "empty"),
    # more than one statement
    ("SELECT 1; SELECT 2", "one statement"),
    ("SELECT 1;DROP TABLE t;", "one statement"),
    ("SELECT 1 /* ; */; SELECT 2", "one statement"),
    ("SELECT 1;;", "one statement"),
    # INTO OUTFILE, in any case and spacing
    ("SELECT * FROM t INTO OUTFILE '/tmp/x'", "INTO OUTFILE"),
    ("select * from t into\n\toutfile '/tmp/x'", "INTO OUTFILE"),
    ("SELECT * FROM t INTO/**/OUTFILE '/tmp/x'", "INTO OUTFILE"),
    ("SELECT * FROM t InTo -- c\n OuTfIlE '/tmp/x'", "INTO OUTFILE"),
    # SETTINGS
    ("SELECT 1 SETTINGS readonly = 0", "SETTINGS"),
    ("SELECT 1 sEtTiNgS max_threads = 1", "SETTINGS"),
    ("SELECT 1 /* x */SETTINGS/* y */readonly=0", "SETTINGS"),
    ("WITH (SELECT 1 SETTINGS readonly=0) AS x SELECT x", "SETTINGS"),
    # FORMAT
    ("SELECT 1 FORMAT JSON", "FORMAT"),
    ("SELECT 1 format CSV -- trailing", "FORMAT"),
    # functions that reach outside, every way of writing their name
    ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "file() is refused"),
    ("SELECT file('/etc/passwd')", "file() is refused"),  # the scalar: readonly lets it run
    ("SELECT * FROM FILE('/etc/passwd')", "FILE() is refused"),
    ("SELECT * FROM FiLe ('/etc/passwd')", "FiLe() is refused"),
    ("SELECT * FROM file/**/('/etc/passwd')", "file() is refused"),
    ("SELECT * FROM file -- c\n('/etc/passwd')", "file() is refused"),
    ("SELECT * FROM `file`('/etc/passwd')", "file() is refused"),
    ('SELECT "file"(\'/etc/passwd\')', "file() is refused"),
    ("DESCRIBE url('http://169.254.169.254/latest', 'CSV')", "url() is refused"),
    ("SELECT * FROM urlCluster('c', 'http://x')", "urlCluster() is refused"),
    ("SELECT * FROM s3('https://b.s3.amazonaws.com/x')", "s3() is refused"),
    ("SELECT * FROM S3Cluster('c', 'https://x')", "S3Cluster() is refused"),
    ("SELECT * FROM remote('10.0.0.1', system.one)", "remote() is refused"),
    ("SELECT * FROM remoteSecure('10.0.0.1', system.one)", "remoteSecure() is refused"),
    ("SELECT * FROM cluster('c', system.one)", "cluster() is refused"),
    ("SELECT * FROM clusterAllReplicas('c', system.one)", "clusterAllReplicas() is refused"),
    ("SELECT * FROM mysql('h:3306', 'd', 't', 'u', 'p')", "mysql() is refused"),
    ("SELECT * FROM postgresql('h', 'd', 't', 'u', 'p')", "postgresql() is refused"),
    ("SELECT * FROM hdfs('hdfs://h/x')", "hdfs() is refused"),
    ("SELECT * FROM input('x String')", "input() is refused"),
    ("SELECT * FROM executable('x.sh', 'TSV', 'x String')", "executable() is refused"),
    ("SELECT * FROM icebergLocal('/var/x')", "icebergLocal() is refused"),
    ("SELECT * FROM deltaLake('https://x')", "deltaLake() is refused"),
    ("SELECT * FROM azureBlobStorage('x')", "azureBlobStorage() is refused"),
    ("SELECT * FROM sqlite('/x.db', 't')", "sqlite() is refused"),
    ("SELECT * FROM t JOIN url('http://x', 'CSV') USING id", "url() is refused"),
    # quotes inside comments must not hide code: ClickHouse nests /* */ and has "# " comments
    ("SELECT 1 /* /* */ ' */ FROM file('/etc/passwd') -- '", "file() is refused"),
    ("SELECT 1 # '\nFROM file('/etc/passwd') -- '", "file() is refused"),
    ("SELECT 1 #! '\nFROM file('/etc/passwd') -- '", "file() is refused"),
    ("SELECT $$ ' $$ FROM file('/etc/passwd') -- '", "file() is refused"),
    ("SELECT 1 -- '\n; DROP TABLE t", "one statement"),
    # a '$' this check could lex differently from the engine
    ("SELECT a$b FROM t", "'$'"),
    ("SELECT $a b$ x $a b$", "'$'"),
]


@pytest.mark.parametrize(("sql", "why"), REFUSED)
def test_refused_with_a_message_that_names_what(sql: str, why: str) -> None:
    with pytest.raises(SqlRefused) as err:
        check_read_only(sql)
    assert why in str(err.value), str(err.value)


def test_the_assistant_allows_only_queries_that_return_rows() -> None:
    assert check_read_only("WITH 1 AS x SELECT x", SELECTS)
    for sql in ("SHOW TABLES", "DESCRIBE data", "EXPLAIN SELECT 1"):
        with pytest.raises(SqlRefused, match="only read statements"):
            check_read_only(sql, SELECTS)


def test_what_a_readonly_session_lets_through_the_check_refuses(tmp_path: Path) -> None:
    """Why the check is a barrier, not only an early message: a ``readonly=1`` chDB session
    reads a file with the scalar ``file()`` and runs two statements; the check refuses both."""
    secret = tmp_path / "user_files" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("not for the analyst")
    reader = open_store(TelemetrySettings(state_dir=tmp_path, env="test"), readonly=True)
    try:
        sql = f"SELECT file('{secret}')"
        assert reader.query(sql).rows == [("not for the analyst",)]  # the hole (chdb 4.4)
        with pytest.raises(SqlRefused, match=r"file\(\) is refused"):
            check_read_only(sql)
        with pytest.raises(SqlRefused, match="one statement"):
            check_read_only("SELECT 1; SELECT 2")
        # The engine's own refusals stay: the check is in front of them, not instead.
        for sql in ("CREATE TABLE t (a Int8) ENGINE = Memory", "SELECT 1 SETTINGS readonly = 0"):
            with pytest.raises(Exception, match="(?i)readonly"):
                reader.query(sql)
    finally:
        reader.close()
