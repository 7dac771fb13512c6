"""Workflow engine overhead (issue: staff workflows), model at zero latency.

Sequential turns through the whole stack; from each conversation-turn workflow's records on
``voice.workflows`` (their Kafka CreateTime), two hops of the engine itself:

- ``start_to_step``: ``WorkflowStarted`` recorded → the engine's ``StepStarted`` (a workflow
  record consumed, applied, its step started) — only on logs from before issue 14's third
  pass: a first step now starts with ``WorkflowStarted`` itself, no record marks it;
- ``outcome_to_next``: the step's ``StepOutcome`` recorded → the engine's next lifecycle record
  (``StepSucceeded``, or ``LastStepSucceeded`` for a turn's one step): a step record → the next
  transition — only on logs from before issue 14's forty-second pass: a turn's outcome is now
  applied in the step's own task, with no record of its own (``in_place`` counts them).

``step_overhead`` is their sum per workflow (each where it is recorded), beside the raw Kafka
round trip.
"""

from __future__ import annotations

import asyncio

from bench.harness import Context, Result, benchmark, latency_summary
from bench.stack import stack
from bench.turns import TEXT, _client, _conversation, _headers, _post, _wait_turns
from streams.envelope import decode
from streams.reading import read_topic
from streams.topics import WORKFLOWS, topic_name

TURNS = 200


@benchmark("workflow.step_overhead", baseline="kafka.round_trip", compare=("p50_ms", "p99_ms"))
def step_overhead(ctx: Context) -> Result:
    """Engine overhead per step transition (record → next step started), sequential turns."""
    s = stack(ctx)
    h = _headers(ctx, "bench-workflow")

    async def main() -> list[str]:
        turns: list[str] = []
        async with _client() as client:
            conv = await _conversation(client, s.edge_url, h)
            for i in range(TURNS):
                r = await _post(client, s.edge_url, conv, h, f"{TEXT} ({i})")
                r.raise_for_status()
                turn = r.json()["turn"]
                if await _wait_turns(client, s.edge_url, h, [(conv, turn)]):
                    raise RuntimeError(f"turn {turn} did not end")
                turns.append(turn)
        return turns

    wanted = set(asyncio.run(main()))
    times: dict[str, dict[str, float]] = {}
    for msg in read_topic(s.settings, topic_name(s.settings, WORKFLOWS)):
        if msg.key().decode() not in wanted:
            continue
        env = decode(msg.key(), msg.value(), msg.headers())
        name = type(env.record).__name__
        times.setdefault(env.key, {}).setdefault(name, msg.timestamp()[1] / 1000)
    start, outcome, total = [], [], []
    in_place = 0
    for t in times.values():
        succeeded = t.get("StepSucceeded", t.get("LastStepSucceeded"))
        if succeeded is None or not {"StepStarted", "StepOutcome"} & t.keys():
            continue
        a = t["StepStarted"] - t["WorkflowStarted"] if "StepStarted" in t else 0.0
        b = succeeded - t["StepOutcome"] if "StepOutcome" in t else 0.0
        if "StepStarted" in t:
            start.append(a)
        if "StepOutcome" in t:
            outcome.append(b)
        else:
            in_place += 1
        total.append(a + b)
    summary = latency_summary(total)
    return {**summary, "workflows": len(times), "in_place": in_place,
            "start_to_step": latency_summary(start) if start else None,
            "outcome_to_next": latency_summary(outcome) if outcome else None}
