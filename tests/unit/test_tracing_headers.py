"""``streams.tracing.extract`` reads a plain ``traceparent`` itself (a worker reads one with
every record): what it finds is what the W3C propagator finds, for any header."""

from __future__ import annotations

import random

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from streams.tracing import carried, extract

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def by_propagator(headers: list[tuple[str, bytes]]) -> trace.SpanContext:
    carrier = {k.lower(): v.decode("latin-1") for k, v in headers}
    ctx = TraceContextTextMapPropagator().extract(carrier, context=otel_context.Context())
    return trace.get_current_span(ctx).get_span_context()


def ours(headers: list[tuple[str, bytes]]) -> trace.SpanContext:
    return trace.get_current_span(extract(headers)).get_span_context()


def variants() -> list[str]:
    out = [VALID, VALID[:-2] + "00", VALID.upper(), "01" + VALID[2:], "ff" + VALID[2:],
           VALID + "-extra", "00-" + "0" * 32 + VALID[35:], VALID[:36] + "0" * 16 + "-01",
           VALID.replace("-", "_"), VALID[:-1], " " + VALID, VALID + " ",
           "00-4bf92f3577b34da6a3ce929d0e0e473_-00f067aa0ba902b7-01", "", "garbage",
           "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]
    rng = random.Random(14)
    for _ in range(300):  # random mutations of a valid one
        chars = list(VALID)
        for _ in range(rng.randint(1, 3)):
            chars[rng.randrange(len(chars))] = rng.choice("0123456789abcdefABCDEF-_ xz")
        out.append("".join(chars))
    return out


@pytest.mark.parametrize("value", variants())
def test_a_traceparent_reads_as_the_propagator_reads_it(value: str) -> None:
    headers = [("traceparent", value.encode())]
    assert ours(headers) == by_propagator(headers)
    assert (carried(headers) is not None) == by_propagator(headers).is_valid


def test_with_a_tracestate_or_other_headers_it_reads_as_the_propagator() -> None:
    headers = [("Traceparent", VALID.encode()), ("tracestate", b"vendor=abc"),
               ("voice_seq", b"3")]
    assert ours(headers) == by_propagator(headers[:2])
    assert ours(headers).trace_state.get("vendor") == "abc"
    assert ours([("voice_seq", b"3")]) == trace.INVALID_SPAN_CONTEXT
    assert ours([]) == trace.INVALID_SPAN_CONTEXT and carried(None) is None
    remote = ours([("traceparent", VALID.encode())])
    assert remote.is_remote and remote.trace_flags.sampled
