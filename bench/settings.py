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

    worker_patches: str = ""
    """Retired (its patches are production code now); a run that sets it stops with a note."""

    edge_patches: str = ""
    """What-if patches of the stack's edge, comma-separated (``bench.patched_edge``)."""


def patch_names(raw: str) -> set[str]:
    """The names in a comma-separated patch list."""
    return {p.strip() for p in raw.split(",") if p.strip()}
