"""The loop guard and the failed-approach hint.

Hard guard: the same tool with the same arguments giving the same result ``threshold`` times in
a row means the model is looping (often on a call that *succeeds*, e.g. re-displaying a map), so
the next identical call is refused with ``Err(kind="loop_guard")`` and not executed. Narration
keys (``reasoning``, ``explanation``, …) are stripped before hashing because the model rewords
them every call while the operative arguments stay identical.

Soft hint: repeated failures of the same call append "consider a different approach" to the
result the model sees. It never stops the turn; the model decides.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from consumers.engine.envelopes import Err, Ok, ToolEnvelope, render
from consumers.engine.sanitize import sanitize_json

NARRATION_KEYS = frozenset({"reasoning", "explanation", "thought", "rationale", "justification"})
SOFT_HINT = ("This call has failed {n} times with these arguments; consider a different "
             "approach (other arguments, another tool, or asking the user).")


def args_hash(args: Any) -> str:
    """Hash of a call's arguments without narration keys (canonical JSON, sha256)."""
    if isinstance(args, dict):
        args = {k: v for k, v in args.items() if k not in NARRATION_KEYS}
    raw = json.dumps(sanitize_json(args), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def result_signature(env: ToolEnvelope) -> str:
    return hashlib.sha256(f"{env.kind}|{render(env)}".encode()).hexdigest()[:32]


class LoopGuard:
    """Per-turn memory of tool calls: refuses loops, counts failed approaches."""

    def __init__(self, threshold: int = 3, failure_threshold: int = 2) -> None:
        self.threshold = threshold
        self.failure_threshold = failure_threshold
        self._recent: list[tuple[str, str, str]] = []
        self._failures: Counter[tuple[str, str]] = Counter()

    def check(self, tool: str, args: Any) -> Err | None:
        """``Err(loop_guard)`` when this call would repeat a ``threshold``-long identical run."""
        h = args_hash(args)
        tail = self._recent[-self.threshold:]
        if (self.threshold > 0 and len(tail) == self.threshold
                and all((t, a) == (tool, h) for t, a, _ in tail)
                and len({sig for _, _, sig in tail}) == 1):
            return Err(f"refused: {tool!r} was called {self.threshold} times in a row with the "
                       "same arguments and gave the same result each time; use that result or "
                       "try something different", "loop_guard")
        return None

    def record(self, tool: str, args: Any, env: ToolEnvelope) -> None:
        """Remember an executed call (refused calls are not recorded)."""
        h = args_hash(args)
        self._recent.append((tool, h, result_signature(env)))
        if isinstance(env, Ok):
            self._failures.pop((tool, h), None)
        else:
            self._failures[(tool, h)] += 1

    def soft_hint(self, tool: str, args: Any) -> str | None:
        """The "consider a different approach" note once the same call failed repeatedly."""
        n = self._failures.get((tool, args_hash(args)), 0)
        return SOFT_HINT.format(n=n) if n >= self.failure_threshold else None
