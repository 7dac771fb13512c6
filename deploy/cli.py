"""The ``voice`` command: thin subcommands that call the packages."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import typer

from streams.capabilities import ROLES
from streams.settings import InsecureBind, VoiceSettings, check_bind, load_settings
from streams.tracing import configure as configure_tracing

app = typer.Typer(help="Voice: a Kafka-native runtime for LLM agent conversations.",
                  no_args_is_help=True, add_completion=False)
topics_app = typer.Typer(help="Create and list Voice's topics.", no_args_is_help=True)
schemas_app = typer.Typer(help="Record schemas.", no_args_is_help=True)
kafka_app = typer.Typer(help="The local Kafka broker (from the Maven cache).",
                        no_args_is_help=True)
app.add_typer(topics_app, name="topics")
app.add_typer(schemas_app, name="schemas")
replay_app = typer.Typer(help="Replay a conversation or workflow from the log.",
                         no_args_is_help=True)
app.add_typer(kafka_app, name="kafka")
app.add_typer(replay_app, name="replay")
owners_app = typer.Typer(help="The index of conversations by owner (decision 0015).",
                         no_args_is_help=True)
app.add_typer(owners_app, name="owners")
keys_app = typer.Typer(help="The data keys on the cluster (docs/keys.md).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


def _settings(need_broker: bool = True) -> VoiceSettings:
    """Settings, with the bootstrap taken from a running `voice up` when not configured."""
    try:
        settings = load_settings()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return _with_broker(settings) if need_broker else settings


@app.callback()
def _global(state: Path = typer.Option(
        None, "--state", envvar="VOICE_STATE_DIR", show_default=False,
        help="The state folder of the `voice up` to talk to (default: VOICE_STATE_DIR, else "
             "$XDG_STATE_HOME/voice or ~/.local/state/voice), from any folder.")) -> None:
    if state is not None:  # every later load_settings() reads it
        os.environ["VOICE_STATE_DIR"] = str(state.expanduser().absolute())


def _with_broker(settings: VoiceSettings) -> VoiceSettings:
    """``settings`` with a bootstrap: configured, or a running `voice up`'s; else exit 2
    naming where it looked."""
    if settings.kafka_bootstrap:
        return settings
    from deploy.supervisor import bootstrap_file

    path = bootstrap_file(settings)
    how = ("Set VOICE_KAFKA_BOOTSTRAP=host:port for a cluster, or start one with `voice up`; "
           "a `voice up` run with another state folder is found with --state DIR or "
           "VOICE_STATE_DIR.")
    if not path.exists():
        typer.echo(f"No Kafka: VOICE_KAFKA_BOOTSTRAP is not set and no `voice up` is running "
                   f"with state folder {settings.state_dir} (looked for {path}). {how}",
                   err=True)
        raise typer.Exit(2)
    bootstrap = path.read_text().strip()
    if not _answers(bootstrap):
        typer.echo(f"No Kafka: the broker `voice up` recorded in {path} ({bootstrap}) does not "
                   f"answer; is that `voice up` still running? {how}", err=True)
        raise typer.Exit(2)
    return settings.model_copy(update={"kafka_bootstrap": bootstrap})


def _answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """Whether the first ``host:port`` of ``bootstrap`` accepts a TCP connection."""
    import socket

    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)),
                                      timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def _refuse_insecure_bind(settings: VoiceSettings, host: str, process: str) -> None:
    """Exit 2, saying what to set, before ``process`` listens on a non-loopback ``host`` with
    a built-in dev secret (``streams.settings.check_bind``); runs before any connection."""
    try:
        check_bind(settings, host, process)
    except InsecureBind as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


@app.command()
def up() -> None:
    """Run the whole stack in the foreground (local broker, simulator, worker, edge)."""
    from deploy.kafka_local import LocalKafkaError
    from deploy.supervisor import up as run_up

    settings = _settings(need_broker=False)
    _refuse_insecure_bind(settings, settings.edge_host, "voice up")  # before the broker starts
    try:
        raise typer.Exit(run_up(settings))
    except LocalKafkaError as exc:
        typer.echo(f"voice up: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def worker(loglevel: str = typer.Option("warning", help="Faust log level.")) -> None:
    """Run one worker (sequencer, turn worker, workflow steps); run N for N-way parallelism."""
    from consumers.app import run_worker

    configure_tracing("voice-worker")
    sys.argv = [sys.argv[0]]  # Faust parses argv itself
    run_worker(_settings(), loglevel=loglevel)


@app.command()
def edge(host: str = typer.Option(None), port: int = typer.Option(None)) -> None:
    """Run one edge (HTTP API); N edges can serve the same cluster."""
    settings = _settings(need_broker=False)
    bind = host or settings.edge_host
    _refuse_insecure_bind(settings, bind, "voice edge")  # before anything loads or connects
    settings = _with_broker(settings)

    import uvicorn

    from api.app import create_app
    from deploy.edge_server import server_options
    from streams.heap import settle_heap

    configure_tracing("voice-edge")
    edge_app = create_app(settings, bind_host=bind, idle_collections=True)
    settle_heap()  # loaded: out of every later full collection
    uvicorn.run(edge_app, host=bind, port=port or settings.edge_port,
                log_level="warning", timeout_graceful_shutdown=5, **server_options(settings))


@app.command()
def simulator(port: int = typer.Option(None, help="Default VOICE_SIMULATOR_PORT or 8100.")) -> None:
    """Run the local model simulator that speaks the Anthropic Messages API."""
    from deploy.simulator import SimulatorSettings, run_simulator

    settings = SimulatorSettings()
    run_simulator(settings.host, port or settings.port)


@app.command()
def telemetry() -> None:
    """Run one telemetry sink: every topic into ClickHouse, in batches (and `voice sql`)."""
    from telemetry.sink import run_sink

    raise typer.Exit(run_sink(_settings()))


@app.command()
def sql(
    query: str = typer.Argument(..., help="A read-only statement: SELECT, WITH, SHOW, DESCRIBE."),
    fmt: str = typer.Option("table", "--format", help="table|json|csv"),
    token: str = typer.Option(
        None, "--token", envvar="VOICE_TOKEN", show_default=False,
        help="A token granting telemetry.query (analyst, operator) for a running sink's "
             "endpoint; dev/test with the built-in secret mint one."),
) -> None:
    """Run a read-only query against the telemetry store and print the result."""
    from telemetry.query import run_sql

    if fmt not in ("table", "json", "csv"):
        raise typer.BadParameter(f"--format {fmt!r} is not one of table, json, csv")
    try:
        typer.echo(run_sql(_settings(need_broker=False), query, fmt,  # type: ignore[arg-type]
                           token=token))
    except Exception as exc:  # refused, failed, or no store: say which, exit 1
        typer.echo(f"voice sql: {exc}", err=True)
        raise typer.Exit(1) from None


@topics_app.command("create")
def topics_create() -> None:
    """Create every registered topic that is missing (idempotent)."""
    from streams.topics import create_topics

    for name, outcome in create_topics(_settings()).items():
        typer.echo(f"{outcome:8} {name}")


@topics_app.command("list")
def topics_list() -> None:
    """The registered topics as the cluster has them."""
    from streams.topics import describe_topics

    for row in describe_topics(_settings()):
        parts = row["partitions"] if row["partitions"] is not None else "MISSING"
        typer.echo(f"{row['topic']:32} partitions={parts!s:8} {row['doc']}")


@app.command()
def tail(
    topic: str = typer.Argument(..., help="Topic name, e.g. voice.conversations (prefix added)."),
    from_beginning: bool = typer.Option(False, "--from-beginning", help="Start at the oldest."),
    max_records: int = typer.Option(0, "--max", help="Stop after N records (0: run forever)."),
    idle_exit: float = typer.Option(0.0, "--idle-exit", help="Stop after N idle seconds."),
) -> None:
    """Decode records live: time, key, ce_type, seq, payload (sealed content shown as sealed)."""
    from deploy.tailing import tail_topic

    settings = _settings()
    name = topic if topic.startswith(settings.topic_prefix) else settings.topic_prefix + topic
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for line in tail_topic(settings, name, from_beginning, max_records, idle_exit):
            typer.echo(line)
    except KeyboardInterrupt:
        pass


@app.command()
def token(
    sub: str = typer.Option(..., "--sub", help="Subject (user id)."),
    role: str = typer.Option("participant", "--role", help="|".join(ROLES)),
    tenant: str = typer.Option("default", "--tenant"),
    ttl: int = typer.Option(None, "--ttl", min=1, help="Seconds until it expires (default "
                            "and maximum: VOICE_JWT_MAX_LIFETIME_S)."),
    member: list[str] = typer.Option([], "--member", help="Another membership, TENANT=ROLE "
                                     "(repeatable); pick it per request with X-Tenant-ID."),
) -> None:
    """Mint a dev JWT for local use (signed with VOICE_JWT_SECRET, with the deployment's
    audience and issuer)."""
    from streams.tokens import mint_token

    memberships: dict[str, str] = {}
    for m in member:
        t, sep, r = m.partition("=")
        if not sep or not t or not r:
            raise typer.BadParameter(f"--member {m!r}: expected TENANT=ROLE")
        memberships[t] = r
    try:
        typer.echo(mint_token(_settings(need_broker=False), sub, role, tenant, ttl,
                              memberships=memberships or None))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@schemas_app.command("export")
def schemas_export(folder: Path = typer.Argument(..., help="Folder to write into.")) -> None:
    """Write the JSON Schema of every record type (one file per ce_type)."""
    from schemas import export_json_schemas

    for path in export_json_schemas(folder):
        typer.echo(str(path))


@keys_app.command("rotate")
def keys_rotate() -> None:
    """Re-wrap every live data key under a new KEK version and retire the older versions."""
    from streams.keyservice import key_store_for
    from streams.sealing import SealingError

    settings = _settings()
    try:
        store = key_store_for(settings)
    except SealingError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    try:
        done = store.rotate()
    except SealingError as exc:
        typer.echo(f"rotation failed: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        store.close()
    typer.echo(f"KEK version {done.kek_version} current; retired {done.retired}; "
               f"{done.rewrapped} key(s) re-wrapped, {done.tombstones} erased id(s) "
               "tombstoned again")


@owners_app.command("backfill")
def owners_backfill() -> None:
    """Write the index entry of every conversation on the log (those started before the
    worker wrote them); running it again changes nothing."""
    from deploy.owners import backfill

    try:
        done = backfill(_settings())
    except (LookupError, TimeoutError) as exc:
        typer.echo(f"backfill failed: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{done.indexed} conversation(s) indexed from {done.read} record(s) of the "
               f"conversation log; {done.skipped} undecodable skipped")


RerunOpt = typer.Option(False, "--rerun", help="Re-run the turn(s) from the recorded model "
                        "responses and tool results; exit 1 on any divergence.")


@replay_app.command("conversation")
def replay_conversation(conversation: str = typer.Argument(..., help="cnv-…"),
                        rerun: bool = RerunOpt) -> None:
    """Print, in order, every event the conversation's SSE clients saw."""
    from deploy.replay import replay_conversation as replay
    from deploy.replay import turns_of

    settings = _settings()
    for block in replay(settings, conversation):
        typer.echo(block)
    if rerun:
        _rerun(settings, turns_of(settings, conversation))


@replay_app.command("assistant")
def replay_assistant(chat: str = typer.Argument(..., help="The assistant chat's id"),
                     rerun: bool = RerunOpt) -> None:
    """Print, in order, the assistant chat's records (display events as its SSE clients
    saw them); with --rerun, re-run each of its turns from the log."""
    from deploy.replay import records
    from deploy.rerun_assistant import replay_assistant as replay
    from deploy.rerun_assistant import turns_of_chat
    from streams.sealing import sealer_for
    from streams.topics import ASSISTANT

    settings = _settings()
    envs = records(settings, ASSISTANT, chat)
    sealer = sealer_for(settings)
    try:
        for block in replay(envs, chat, sealer):
            typer.echo(block)
    finally:
        sealer.close()
    if rerun:
        _rerun(settings, turns_of_chat(envs))


@replay_app.command("workflow")
def replay_workflow(workflow: str = typer.Argument(..., help="e.g. cnv-…:turn-3, a research "
                                                  "run-…, a contribution, iss-…:dev-1"),
                    rerun: bool = RerunOpt,
                    export: Path = typer.Option(None, "--export", help="Also write the "
                                                "workflow's records and keys to FILE "
                                                "(tests/histories/).")
                    ) -> None:
    """Print a workflow's lifecycle and its agent's records, in order; with --rerun, re-run
    it (participant or assistant turn, research, disclosure review, update delivery)."""
    from deploy.replay import replay_workflow as replay

    settings = _settings()
    if export is not None:
        from deploy.histories import export_history

        typer.echo(f"exported to {export_history(settings, workflow, export)}", err=True)
    for line in replay(settings, workflow):
        typer.echo(line)
    if rerun:
        _rerun(settings, [workflow])


def _rerun(settings: VoiceSettings, workflows: list[str]) -> None:
    import asyncio

    from rich.progress import Progress

    from deploy.replay import rerun_workflow
    from streams.sealing import KeyErased, KeyNotFound

    diverged = erased = 0
    with Progress(transient=True, console=__import__("rich.console").console.Console(
            stderr=True)) as progress:
        task = progress.add_task("re-running", total=len(workflows))
        for wf in workflows:
            try:
                found = asyncio.run(rerun_workflow(settings, wf))
            except (KeyErased, KeyNotFound):  # erased: its key (or its tombstone) is all left
                typer.echo(f"cannot re-run {wf}: its conversation was erased (its key is gone)")
                erased += 1
            else:
                for line in found:
                    typer.echo(f"DIVERGENCE {wf}: {line}")
                diverged += bool(found)
            progress.advance(task)
    not_run = f"; {erased} not re-run (erased)" if erased else ""
    typer.echo(f"re-ran {len(workflows) - erased} turn(s): {diverged} diverged{not_run}")
    raise typer.Exit(1 if diverged or erased else 0)


@kafka_app.command("fetch")
def kafka_fetch() -> None:
    """Fetch the Kafka jars from Maven Central into the cache (once)."""
    from deploy.kafka_local import LocalKafkaError, ensure_jars

    try:
        typer.echo(f"Kafka jars in {ensure_jars()}")
    except LocalKafkaError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


def main() -> None:
    app()


if __name__ == "__main__":
    main()
