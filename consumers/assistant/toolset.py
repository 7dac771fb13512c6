"""Which tools one assistant turn is offered: the ``agentic_mode`` switch.

- ``agentic_mode`` off: the dataset tools; the ``plan`` tool is stripped.
- ``agentic_mode`` on: only the tools on ``AGENTIC_SHORTLIST``, ``plan`` first. The shortlist
  is an explicit allow-list, not "everything plus plan": a tool added to the assistant later
  is not offered to agentic turns until it is put on the list on purpose (a planner-first loop
  runs many steps unattended, so what it may call is chosen, never inherited).

Pure: the tools come in built over the turn's datasets; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from consumers.engine import PLAN_TOOL, Tool, ToolRegistry, plan_tool

AGENTIC_SHORTLIST = (PLAN_TOOL, "describe_dataset", "query_dataset", "display_map")
"""The tools of an agentic turn, in the order the model sees them."""


def turn_tools(tools: Iterable[Tool], agentic: bool) -> ToolRegistry:
    """The registry of one turn: ``tools`` without ``plan``, or the agentic shortlist."""
    offered = {t.name: t for t in (plan_tool(), *tools)}
    if agentic:
        return ToolRegistry([offered[n] for n in AGENTIC_SHORTLIST if n in offered],
                            allow=AGENTIC_SHORTLIST)
    return ToolRegistry([t for name, t in offered.items() if name != PLAN_TOOL])
