"""``python -m bench [--only NAME[,NAME]] [--records N]``: run the benchmarks, print one JSON.

Starts a throwaway local broker (``deploy.kafka_local.LocalKafka`` in a temporary folder, on a
free port) unless ``VOICE_KAFKA_BOOTSTRAP`` names a cluster, in which case the run's topics are
created there and deleted at the end. stdout carries exactly one JSON object::

    {"machine": {...}, "run": {...}, "baseline": {name: {...}},
     "figures": {name: {..., "baseline": name, "compare": {metric: {figure, baseline, ratio}}}}}

Progress and logs go to stderr. Exit status 1 when any benchmark failed (the JSON says which).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import confluent_kafka

import bench.chain as bench_chain  # registers the turn's record flow on bare Kafka
import bench.engine  # noqa: F401  (registers the engine figures)
import bench.fanout  # noqa: F401  (registers the streams-per-edge figures)
import bench.ingest  # noqa: F401  (registers the telemetry and replay figures)
import bench.kafka_baseline as kafka_baseline  # registers the benchmarks
import bench.keys  # noqa: F401  (registers the key service figures)
import bench.push  # noqa: F401  (registers the in-process push figures)
import bench.scale  # noqa: F401  (registers the scale-out and edge start figures)
import bench.streaming  # noqa: F401  (registers the reply streaming figure)
import bench.turns  # noqa: F401  (registers the turn figures; they run first, see FIRST)
import bench.workflows  # noqa: F401  (registers the workflow engine figure)
import bench.writer  # noqa: F401  (registers the single writer's figures)
from bench import stack as bench_stack
from bench.harness import REGISTRY, Context, run, select
from streams.settings import load_settings

if TYPE_CHECKING:
    from bench.broker_requests import BrokerRequests
    from deploy.kafka_local import LocalKafka

FIRST = ("edge.post_message", "turn.overhead", "turn.sustained")
"""The whole-stack figures run first among the figures, before anything else loads the machine
(the in-process chDB engine of the telemetry figures stays resident once opened)."""
_ordered = sorted(REGISTRY.items(), key=lambda item: item[0] not in FIRST)  # stable
REGISTRY.clear()
REGISTRY.update(_ordered)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", metavar="NAME[,NAME]",
                   help="run only these benchmarks (a figure brings its baseline); see --list")
    p.add_argument("--records", type=int, default=5000, metavar="N",
                   help="records per latency benchmark (default 5000; at least 2000 for figures)")
    p.add_argument("--throughput-records", type=int, default=100_000, metavar="N",
                   help="records per throughput run (default 100000)")
    p.add_argument("--runs", type=int, default=3, metavar="R",
                   help="throughput runs; the median is reported (default 3)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = p.parse_args(argv)
    if args.records < 1 or args.throughput_records < 1 or args.runs < 1:
        p.error("--records, --throughput-records and --runs must be positive")
    return args


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _memory_gb() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def _git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=Path(__file__).resolve().parent)
        if out.returncode == 0:
            return out.stdout.strip() or None
    return None


def _java_version() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=10)
        return out.stderr.splitlines()[0].strip()
    return None


def _request_reader(broker: LocalKafka | None) -> BrokerRequests | None:
    """A reader of the local broker's request counts (``bench.broker_requests``), or None
    (no local broker, or no JDK to run the reader: the figures then give no counts)."""
    if broker is None or broker.jmx_port is None:
        return None
    from bench.broker_requests import BrokerRequests
    from deploy.kafka_local import check_java

    try:
        return BrokerRequests.start(check_java(), broker.jmx_port)
    except Exception as exc:
        print(f"[bench] no request counts of the broker: {exc}", file=sys.stderr, flush=True)
        return None


def machine(broker: str) -> dict[str, Any]:
    from deploy.kafka_local import KAFKA_VERSION

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    local = broker == "local"
    return {
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "cpu": _cpu_model(),
        "memory_gb": _memory_gb(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "confluent_kafka": getattr(confluent_kafka, "__version__", None)
        or str(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
        "kafka": KAFKA_VERSION if local else None,
        "broker": (f"local single-node KRaft (Apache Kafka {KAFKA_VERSION}, {_java_version()}),"
                   " same machine") if local else "existing cluster (VOICE_KAFKA_BOOTSTRAP)",
        "git_commit": _git_commit(),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        for b in REGISTRY.values():
            kind = "baseline" if b.is_baseline else f"figure vs {b.baseline}"
            print(f"{b.name:28} {kind:36} {b.doc}")
        return 0
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    try:
        chosen = select(only)
    except KeyError as exc:
        print(f"bench: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.records < 2000:
        print(f"bench: warning: --records {args.records} < 2000; percentiles are not the "
              "reported figures", file=sys.stderr)

    real_stdout = sys.stdout
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    broker = None
    tmp: tempfile.TemporaryDirectory[str] | None = None
    ctx: Context | None = None
    # Everything but the final JSON goes to stderr, whatever prints it.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            settings = load_settings()
            if settings.kafka_bootstrap:
                bootstrap = settings.kafka_bootstrap
                where = "external"
                print(f"[bench] using the cluster at {bootstrap}", file=sys.stderr)
            else:
                from deploy.kafka_local import LocalKafka, free_port

                tmp = tempfile.TemporaryDirectory(prefix="voice-bench-")
                broker = LocalKafka(data_dir=Path(tmp.name), port=free_port(),
                                    jmx_port=free_port())
                print("[bench] starting a local broker …", file=sys.stderr, flush=True)
                bootstrap = broker.start()
                where = "local"
                print(f"[bench] broker up at {bootstrap} in {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr, flush=True)
                settings = load_settings(kafka_bootstrap=bootstrap)
            ctx = Context(settings=settings, bootstrap=bootstrap, records=args.records,
                          throughput_records=args.throughput_records, runs=args.runs,
                          broker_pid=broker.process.pid if broker and broker.process else None,
                          broker_requests=_request_reader(broker),
                          external=where == "external")
            load_before = os.getloadavg()
            try:
                baselines, figures, errors = run(ctx, chosen)
            finally:
                bench_chain.close_chains()
                bench_stack.close_all()  # before the broker goes
            load_after = os.getloadavg()
            if where == "external":
                ctx.delete_topics()
        finally:
            if ctx is not None and ctx.broker_requests is not None:
                ctx.broker_requests.close()
            if broker is not None:
                print("[bench] stopping the broker", file=sys.stderr, flush=True)
                broker.stop()
            if tmp is not None:
                tmp.cleanup()

    out = {
        "machine": machine(where),
        "run": {
            "started_at": started.isoformat(timespec="seconds"),
            "duration_s": round(time.perf_counter() - t0, 1),
            "benchmarks": [b.name for b in chosen],
            "records": args.records,
            "throughput_records": args.throughput_records,
            "throughput_runs": args.runs,
            "producer_config": kafka_baseline.producer_settings(),
            "ratio": "figure / baseline, both measured in this run",
            "errors": errors,
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in load_after],
                             "note": "1/5/15-minute load of the whole machine: above the "
                                     "core count, other work shared the cores"},
        },
        "baseline": baselines,
        "figures": figures,
    }
    json.dump(out, real_stdout, indent=2)
    real_stdout.write("\n")
    real_stdout.flush()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
