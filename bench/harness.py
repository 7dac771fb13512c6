"""The benchmark registry, the statistics helpers, and the figure-beside-baseline rule.

A benchmark is a function ``fn(ctx: Context) -> dict`` registered with ``@benchmark(name)``.
It is either a *baseline* (plain Kafka, no Voice code) or a *figure* (through Voice's code),
which names the baseline it is compared with and the metrics to compare::

    @benchmark("kafka.produce_throughput")
    def raw(ctx): ...

    @benchmark("voice.send_throughput", baseline="kafka.produce_throughput",
               compare=("records_per_s",))
    def voice(ctx): ...

The rule: a figure is only ever reported beside its baseline *from the same run*, with the
ratio figure / baseline for each compared metric. Selecting a figure (``--only``) therefore
also runs its baseline, first.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streams.settings import VoiceSettings

if TYPE_CHECKING:
    from bench.broker_requests import BrokerRequests

Result = dict[str, Any]
BenchFn = Callable[["Context"], Result]


@dataclass(frozen=True)
class Benchmark:
    name: str
    fn: BenchFn
    baseline: str | None = None
    """``None`` for a baseline; else the name of the baseline this figure is compared with."""
    compare: tuple[str, ...] = ()
    """Metrics present in both results whose ratio figure / baseline is reported."""
    doc: str = ""

    @property
    def is_baseline(self) -> bool:
        return self.baseline is None


REGISTRY: dict[str, Benchmark] = {}
WARMUPS: list[Callable[[Context], None]] = []
"""Unmeasured steps run once before any benchmark (e.g. to warm the broker's JIT)."""


def warmup(fn: Callable[[Context], None]) -> Callable[[Context], None]:
    """Register an unmeasured step that runs before the benchmarks."""
    WARMUPS.append(fn)
    return fn


def benchmark(
    name: str, *, baseline: str | None = None, compare: Sequence[str] = ()
) -> Callable[[BenchFn], BenchFn]:
    """Register ``fn`` under ``name``; a figure names its ``baseline`` and what to ``compare``."""

    def register(fn: BenchFn) -> BenchFn:
        if name in REGISTRY:
            raise ValueError(f"benchmark {name!r} is registered twice")
        if baseline is not None and not compare:
            raise ValueError(f"figure {name!r} must say which metrics to compare")
        if baseline is None and compare:
            raise ValueError(f"baseline {name!r} cannot compare against anything")
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        REGISTRY[name] = Benchmark(name, fn, baseline, tuple(compare), doc)
        return fn

    return register


def select(only: Iterable[str] | None) -> list[Benchmark]:
    """The benchmarks to run, in registration order; a chosen figure brings its baseline."""
    if not only:
        return list(REGISTRY.values())
    wanted: set[str] = set()
    for name in only:
        if name not in REGISTRY:
            known = ", ".join(REGISTRY)
            raise KeyError(f"no benchmark named {name!r}; known: {known}")
        wanted.add(name)
        base = REGISTRY[name].baseline
        if base is not None:
            if base not in REGISTRY:
                raise KeyError(f"figure {name!r} names unknown baseline {base!r}")
            wanted.add(base)
    return [b for b in REGISTRY.values() if b.name in wanted]


# --- the run context -------------------------------------------------------------------------


@dataclass
class Context:
    """What every benchmark gets: the broker, the settings, the sizes asked for."""

    settings: VoiceSettings
    bootstrap: str
    records: int = 5000
    """Records per latency benchmark (sequential round trips / acks)."""
    throughput_records: int = 100_000
    """Records per throughput run."""
    runs: int = 3
    """Throughput runs; the median is reported."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    broker_pid: int | None = None
    """The local broker's process id (for CPU accounting), when the run started one."""
    broker_requests: BrokerRequests | None = None
    """The reader of the local broker's request counts, when the run started one and a JDK is
    here to run it."""
    external: bool = False
    """True on an existing cluster (``VOICE_KAFKA_BOOTSTRAP``): leave nothing behind there."""
    created_topics: list[str] = field(default_factory=list)
    _topics: dict[str, str] = field(default_factory=dict)

    def log(self, message: str) -> None:
        """Progress goes to stderr; stdout carries only the JSON."""
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    def topic(self, base: str, partitions: int) -> str:
        """A dedicated topic for this run (created once, with the settings' topic prefix)."""
        key = f"{base}/{partitions}"
        if key in self._topics:
            return self._topics[key]
        from confluent_kafka.admin import AdminClient, NewTopic

        name = f"{self.settings.topic_prefix}voice.bench.{self.run_id}.{base}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=self.settings.replication_factor,
        )
        admin.create_topics([new], operation_timeout=30)[name].result(timeout=60)
        # Wait until the metadata shows every partition with a leader.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            t = admin.list_topics(name, timeout=10).topics.get(name)
            if t is not None and not t.error and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()
            ):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"topic {name} has no leader for all partitions after 30 s")
        self._topics[key] = name
        self.created_topics.append(name)
        return name

    def delete_topics(self) -> None:
        """Remove this run's topics (used on an existing cluster; a temp broker just goes)."""
        if not self.created_topics:
            return
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for name, fut in admin.delete_topics(self.created_topics, operation_timeout=30).items():
            try:
                fut.result(timeout=60)
            except Exception as exc:  # best effort: report, never fail the run over it
                self.log(f"could not delete topic {name}: {exc}")


# --- statistics ------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, linear between ranks."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def latency_summary(samples_s: Sequence[float], digits: int = 3) -> Result:
    """n, p50/p90/p99, mean, min and max in milliseconds, from samples in seconds."""
    ms = sorted(s * 1000.0 for s in samples_s)
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), digits),
        "p90_ms": round(percentile(ms, 90), digits),
        "p99_ms": round(percentile(ms, 99), digits),
        "mean_ms": round(statistics.fmean(ms), digits),
        "min_ms": round(ms[0], digits),
        "max_ms": round(ms[-1], digits),
    }


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def median_run(runs: Sequence[Result], key: str) -> Result:
    """The run whose ``key`` is the median (runs are odd in number, else the lower middle)."""
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


def ratio(figure: float, baseline: float, digits: int = 4) -> float | None:
    """figure / baseline, or ``None`` when the baseline is zero."""
    if not baseline:
        return None
    return round(figure / baseline, digits)


# --- running ---------------------------------------------------------------------------------


def run(ctx: Context, benchmarks: Sequence[Benchmark]) -> tuple[Result, Result, list[str]]:
    """Run baselines, then figures; returns (baseline, figures, errors).

    Each figure gets ``baseline`` (its baseline's name) and ``compare``:
    ``{metric: {"figure": x, "baseline": y, "ratio": x / y}}``, both numbers from this run.
    """
    baselines: Result = {}
    figures: Result = {}
    errors: list[str] = []
    ordered = sorted(benchmarks, key=lambda b: not b.is_baseline)  # stable: baselines first
    for step in WARMUPS:
        t0 = time.perf_counter()
        step(ctx)
        ctx.log(f"warm-up {step.__name__}: {time.perf_counter() - t0:.1f} s (not measured)")
    for b in ordered:
        if b.baseline is not None and "error" in baselines.get(b.baseline, {"error": "not run"}):
            msg = f"{b.name}: skipped, its baseline {b.baseline} did not produce figures"
            figures[b.name] = {"error": msg, "baseline": b.baseline}
            errors.append(msg)
            ctx.log(msg)
            continue
        ctx.log(f"{b.name}: start")
        t0 = time.perf_counter()
        try:
            result = dict(b.fn(ctx))
        except Exception as exc:
            msg = f"{b.name}: {type(exc).__name__}: {exc}"
            errors.append(msg)
            ctx.log(f"{b.name}: FAILED {exc!r}")
            result = {"error": msg}
        result["wall_s"] = round(time.perf_counter() - t0, 2)
        if b.is_baseline:
            baselines[b.name] = result
        elif "error" not in result:
            base = baselines[b.baseline]  # type: ignore[index]
            compare: Result = {}
            for metric in b.compare:
                compare[metric] = {
                    "figure": result[metric],
                    "baseline": base[metric],
                    "ratio": ratio(result[metric], base[metric]),
                }
            figures[b.name] = {**result, "baseline": b.baseline, "compare": compare}
        else:
            figures[b.name] = {**result, "baseline": b.baseline}
        ctx.log(f"{b.name}: done in {result['wall_s']} s")
    return baselines, figures, errors
