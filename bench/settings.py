"""Settings of the benchmark harness (``VOICE_BENCH_*``), read where they are used, never at
import (docs/benchmarks.md lists them)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class BenchSettings(BaseSettings):
    """``VOICE_BENCH_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="VOICE_BENCH_", extra="ignore",
                                      env_ignore_empty=True)

    workers: int = Field(default=1, ge=1)
    """Worker processes of the benchmark stack (one per core is the sensible most)."""

    keep_state: bool = False
    """Keep the stack's state folder (logs, keys, Faust's data) after the run."""

    post_rate: float = Field(default=25.0, gt=0)
    """POSTs a second of ``edge.post_message``: the issue's row names half the sustained rate,
    and one worker sustains 45–57 turns/s on a quiet 2-core machine — on a slower one (its own
    ``turn.sustained``), set half of what it sustains, or the figure is a queue's."""

    scale_turns: int = Field(default=1500, ge=1)
    """Turns each stack of ``scale.one_worker`` / ``scale.workers`` measures (after 200 of
    warm-up): at 300 (until the twenty-eighth pass of issue 14) a run was ~6 s, and its
    figure moved with every blip of the machine."""

    sustained_turns: int = Field(default=600, ge=1)
    """Turns ``turn.sustained`` measures (after its warm-up), over its 32 conversations: 600
    is ~20 turns a conversation; 4000 (~125) shows what a conversation's length costs."""
