"""Test-only crash points: where a worker kills itself, so a test can hit each point of a turn.

The faults suite (``tests/faults/test_worker_kill.py``) must SIGKILL a worker at exact points
of a turn — before its step starts, during its model call, after its reply command, between
``WorkflowFailed`` and the turn-over bookkeeping — which no timing from outside can hit
reliably. ``VOICE_TEST_CRASH_AT`` (``VoiceSettings.test_crash_at``) names them:
``point[@match],…``; at the first named point a workflow whose id contains ``match`` (any
workflow when there is none) reaches, the process sends itself ``SIGKILL`` — no cleanup, no
flush, as a dead machine.

Unset (every deployment), ``hit`` is a set lookup that returns: it must never do anything
else.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass

log = logging.getLogger(__name__)

POINTS = ("before_step", "model_call", "after_reply", "before_turn_over", "before_follow_ups",
          "before_state_write")
"""The points the worker names: a turn's, in the order it reaches them; then its writer's,
matched by aggregate id: a command's records on the log, what they start (a turn's workflow,
a conversation's entry in the index by owner) not yet produced; that produced, the
aggregate's state not yet written."""


@dataclass(frozen=True)
class CrashPoints:
    """The crash points one process was started with (none in production)."""

    points: tuple[tuple[str, str], ...] = ()
    """``(point, match)`` pairs; an empty match matches every workflow."""

    @classmethod
    def parse(cls, spec: str) -> CrashPoints:
        """``point[@match],…`` as crash points; an unknown point is refused by name."""
        points = []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            point, _, match = part.partition("@")
            if point not in POINTS:
                raise ValueError(f"VOICE_TEST_CRASH_AT names {point!r}; the points are "
                                 f"{', '.join(POINTS)}")
            points.append((point, match))
        return cls(tuple(points))

    def armed(self, point: str, workflow: str) -> bool:
        """Whether reaching ``point`` in ``workflow`` kills this process."""
        return any(p == point and m in workflow for p, m in self.points)

    def hit(self, point: str, workflow: str) -> None:
        """Kill this process (``SIGKILL``) if ``point`` is armed for ``workflow``."""
        if self.points and self.armed(point, workflow):
            log.warning("test crash point %s reached in %s: SIGKILL", point, workflow)
            os.kill(os.getpid(), signal.SIGKILL)
