"""W3C trace context for every Voice process: one place that sets up OpenTelemetry, reads a
``traceparent`` off a record or a request, and says which span is current.

A trace starts at the edge (continuing the caller's ``traceparent`` when it sends one), travels
in the ``traceparent`` header of every record produced inside a span (``streams.envelope``
writes it), and is continued by the consumer that reads the record (``consumers.frame``), down
to the engine's model and tool calls. The telemetry sink fills its ``trace_id``/``span_id``
columns from the same header.

``configure`` is called once per process by ``deploy`` (never at import). With an exporter —
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set — it installs
the SDK's tracer provider, and spans are exported (OTLP over HTTP, batched, off the event
loop). Without one it installs ``IdsOnly``: every span still gets its ids, continues its
parent's trace and reaches the records' ``traceparent`` exactly as the SDK's would, but records
nothing (no attributes, status or timing kept for an exporter nobody set): a span costs less
than half the SDK's, ~0.4 ms of a worker's CPU a turn (docs/benchmarks.md, tenth pass).
``OTEL_SDK_DISABLED=true`` leaves the API's no-op provider: an incoming ``traceparent`` is still
passed along unchanged, but no new spans are made. Tests ``install`` a provider of their own
(e.g. with the SDK's ``InMemorySpanExporter``).

It must never raise into a caller because of a malformed header: a ``traceparent`` the W3C
propagator cannot parse is ignored (a fresh trace starts), as the specification says.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    NoOpTracer,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:  # the SDK is loaded by ``configure`` only: a library use needs the API
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACE_HEADERS = (TRACEPARENT, TRACESTATE)
"""The W3C trace-context headers, as HTTP headers and as Kafka record headers."""

INSTRUMENTATION = "voice"

_PROPAGATOR = TraceContextTextMapPropagator()
_PLAIN_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
"""A version-00 ``traceparent`` and nothing more: the one Voice's own producers write."""
_tracer: Tracer | None = None

HeaderPairs = Sequence[tuple[str, bytes | str | None]]


def configure(service_name: str, exporter: SpanExporter | None = None
              ) -> TracerProvider | IdsOnly | None:
    """Install this process's tracer provider (call once, at process start).

    ``service_name`` is the default of ``OTEL_SERVICE_NAME``. ``exporter`` overrides the OTLP
    exporter the environment asks for; with neither, spans get ids and are not recorded
    (``IdsOnly``). None when ``OTEL_SDK_DISABLED`` is true."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME")
                                or service_name})
    exporter = exporter or otlp_exporter()
    provider: TracerProvider | IdsOnly
    if exporter is None:
        provider = IdsOnly(resource)
    else:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider)
    trace.set_tracer_provider(provider)  # for libraries that trace through the global API
    return provider


def otlp_exporter() -> SpanExporter | None:
    """The OTLP/HTTP exporter the environment asks for, or None without an endpoint."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None  # the cheap path: spans are made (ids for the records), never exported
    # Imported here: a process without an endpoint never loads protobuf and requests.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # reads the endpoint, headers and timeout from OTEL_*


class IdsOnlyTracer(NoOpTracer):
    """Spans with ids and nothing recorded: a child of a valid parent continues its trace, its
    sampled and random-id flags and its state (as the SDK's tracer with its default
    parent-based sampler has them), a span without one starts a sampled trace with a random
    id; each gets a span id of its own. What a record's ``traceparent`` says is what it says
    under the SDK's provider."""

    def __init__(self) -> None:
        # The SDK's own generator (a library use of this module never loads the SDK).
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        self.ids = RandomIdGenerator()

    def start_span(self, name: str, context: otel_context.Context | None = None,  # noqa: ARG002
                   *args: object, **kwargs: object) -> Span:
        parent = trace.get_current_span(context).get_span_context()
        span_id = self.ids.generate_span_id()
        if not parent.is_valid:  # a new trace: sampled, its id random (W3C level 2)
            return NonRecordingSpan(SpanContext(self.ids.generate_trace_id(), span_id,
                                                is_remote=False, trace_flags=_NEW_TRACE))
        flags = TraceFlags.SAMPLED if parent.trace_flags.sampled else TraceFlags.DEFAULT
        if parent.trace_flags.random_trace_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        return NonRecordingSpan(SpanContext(parent.trace_id, span_id, is_remote=False,
                                            trace_flags=TraceFlags(flags),
                                            trace_state=parent.trace_state))


class IdsOnly(trace.TracerProvider):
    """The tracer provider of a process that exports no spans (``IdsOnlyTracer``)."""

    def __init__(self, resource: object) -> None:
        self.resource = resource
        self._tracer = IdsOnlyTracer()

    def get_tracer(self, *args: object, **kwargs: object) -> Tracer:  # noqa: ARG002
        return self._tracer


_NEW_TRACE = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)


def install(provider: trace.TracerProvider | None) -> None:
    """Make ``provider`` the one Voice's spans come from (None: the global API's)."""
    global _tracer
    _tracer = provider.get_tracer(INSTRUMENTATION) if provider is not None else None


def tracer() -> Tracer:
    """The tracer of Voice's spans."""
    return _tracer if _tracer is not None else trace.get_tracer(INSTRUMENTATION)


def _carrier(headers: HeaderPairs | Mapping[str, str] | None) -> dict[str, str]:
    items = headers.items() if isinstance(headers, Mapping) else (headers or ())
    out: dict[str, str] = {}
    for name, value in items:
        lower = name.lower()
        if lower in TRACE_HEADERS and value is not None:
            out[lower] = value.decode("latin-1") if isinstance(value, bytes) else value
    return out


def extract(headers: HeaderPairs | Mapping[str, str] | None) -> otel_context.Context:
    """The context the trace headers among ``headers`` carry (an empty one without them).

    A plain version-00 ``traceparent`` with no ``tracestate`` (what every record Voice
    produces carries) is read here, as the W3C propagator reads it; anything else goes to the
    propagator. A worker reads one with every record it consumes."""
    carrier = _carrier(headers)
    value = carrier.get(TRACEPARENT)
    match = _PLAIN_TRACEPARENT.fullmatch(value) if value and len(carrier) == 1 else None
    if match is None:
        return _PROPAGATOR.extract(carrier, context=otel_context.Context())
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return otel_context.Context()
    return trace.set_span_in_context(NonRecordingSpan(SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(match[3], 16)))),
        otel_context.Context())


def carried(headers: HeaderPairs | Mapping[str, str] | None) -> otel_context.Context | None:
    """The context of the valid ``traceparent`` among ``headers``; None without one."""
    context = extract(headers)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def inject() -> list[tuple[str, bytes]]:
    """The trace headers of the current span, as Kafka record headers ([] outside a trace)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return [(name, carrier[name].encode()) for name in TRACE_HEADERS if name in carrier]


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current span, or None outside a trace."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get(TRACEPARENT)


def ids_of(traceparent: str | None) -> tuple[str | None, str | None]:
    """(trace id, span id) in lowercase hex of a ``traceparent``; (None, None) if not valid."""
    if not traceparent:
        return None, None
    ctx = _PROPAGATOR.extract({TRACEPARENT: traceparent}, context=otel_context.Context())
    sc = trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid:
        return None, None
    return trace.format_trace_id(sc.trace_id), trace.format_span_id(sc.span_id)


Attributes = Mapping[str, str | int | float | bool]


@contextmanager
def span(name: str, kind: SpanKind = SpanKind.INTERNAL, attributes: Attributes | None = None,
         context: otel_context.Context | None = None) -> Iterator[Span]:
    """A span current for the block (a child of the current one, or of ``context``).

    An exception out of the block marks it in error with ``error.type`` = the exception's
    class, and is not recorded as an event: an exception's message may quote someone's
    words (``streams.free_text``), and a span must never carry them.

    Under ``IdsOnly`` (no exporter) the span records nothing: it is made and made current
    here, as ``start_as_current_span`` would, without its two nested generators (a worker
    makes one for every record it consumes)."""
    chosen = tracer()
    if type(chosen) is IdsOnlyTracer:
        current = chosen.start_span(name, context)
        token = otel_context.attach(trace.set_span_in_context(current))
        try:
            yield current
        finally:
            otel_context.detach(token)
        return
    with chosen.start_as_current_span(name, context=context, kind=kind,
                                        attributes=attributes, record_exception=False,
                                        set_status_on_exception=False) as current:
        try:
            yield current
        except BaseException as exc:
            failed(current, type(exc).__qualname__)
            raise


@contextmanager
def continued(name: str, headers: HeaderPairs | Mapping[str, str] | None,
              kind: SpanKind = SpanKind.CONSUMER, attributes: Attributes | None = None
              ) -> Iterator[Span]:
    """A span that continues the trace ``headers`` carry (a new trace without one), current
    for the block: what is produced inside carries its ``traceparent``."""
    with span(name, kind, attributes, extract(headers)) as current:
        yield current


def failed(target: Span, error_type: str) -> None:
    """Mark ``target`` as ended in error (``error.type``, OTel semantic conventions); the
    first reason given stands."""
    if not target.is_recording():
        return
    status = getattr(target, "status", None)  # the SDK's spans have one, the API's not
    if status is not None and status.status_code == StatusCode.ERROR:
        return
    target.set_attribute("error.type", error_type)
    target.set_status(Status(StatusCode.ERROR))
