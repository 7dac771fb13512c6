"""The ``plan`` tool: the agent writes down its steps and ticks them off as it goes.

It is the production tool behind the engine's plan handling: its answer carries a
``PlanUpdate``, which the dispatcher remembers, ``[CURRENT_STATE]`` shows (``- [x] …``) and the
end-of-turn guardrail checks (a turn that ends with steps not done gets a warning and a
``completion_guardrail`` telemetry fact). Each call replaces the whole plan, so the model always
sends every step with its ``done`` flag. It reads nothing and writes nothing outside the turn.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from consumers.engine.envelopes import Ok, PlanStep, PlanUpdate
from consumers.engine.tools import Tool, ToolContext

PLAN_TOOL = "plan"
MAX_STEPS = 20


class PlanStepIn(BaseModel):
    title: str = Field(min_length=1, max_length=200, description="What the step does.")
    done: bool = Field(default=False, description="Whether the step is finished.")


class PlanInput(BaseModel):
    steps: list[PlanStepIn] = Field(min_length=1, max_length=MAX_STEPS,
                                    description="The whole plan, every step with its done "
                                                "flag (each call replaces the plan).")


def run_plan(args: PlanInput, ctx: ToolContext) -> Ok:  # noqa: ARG001
    """Record the plan; the answer says what is left."""
    steps = tuple(PlanStep(s.title.strip() or s.title, s.done) for s in args.steps)
    left = [s.title for s in steps if not s.done]
    return Ok(data={"steps": len(steps), "done": len(steps) - len(left), "remaining": left},
              effects=(PlanUpdate(steps),))


def plan_tool() -> Tool:
    """The ``plan`` tool (read-only: it only changes the turn's own working memory)."""
    return Tool(PLAN_TOOL, "Write down the plan for this request as short steps, then call "
                "again with every step and its done flag whenever a step is finished. Finish "
                "every step before the final answer.", PlanInput, run_plan)
