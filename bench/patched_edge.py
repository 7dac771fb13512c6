"""``python -m bench.patched_edge --port N``: ``voice edge`` with what-if patches, for measuring a
suggested change to production code before anyone makes it. Never used by ``voice up``.

``VOICE_BENCH_EDGE_PATCHES`` names the patches (comma-separated):

* ``inline_deps`` — FastAPI runs every plain ``def`` dependency in a thread pool
  (``fastapi.dependencies.utils.run_in_threadpool``). ``api/frame/deps.py`` has six of them on the
  message route (settings, producer, tail, views, sealer, principal), none of which blocks, so
  each request pays six thread hops. The patch calls the dependencies defined in ``api.frame.deps``
  inline instead, which is what making them ``async def`` would do.
"""

from __future__ import annotations

import sys
from typing import Any


def _patch_inline_deps() -> None:
    import fastapi.dependencies.utils as fdu

    original = fdu.run_in_threadpool

    async def run(call: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(call, "__module__", "") == "api.frame.deps" or \
                getattr(call, "__qualname__", "").startswith("require_role"):
            return call(*args, **kwargs)
        return await original(call, *args, **kwargs)

    fdu.run_in_threadpool = run


def main() -> None:
    from bench.settings import BenchSettings, patch_names

    patches = patch_names(BenchSettings().edge_patches)
    unknown = patches - {"inline_deps"}
    if unknown:
        raise SystemExit(f"unknown patches: {sorted(unknown)}")
    if "inline_deps" in patches:
        _patch_inline_deps()
    import uvicorn

    from api.app import create_app
    from deploy.cli import _settings

    port = int(sys.argv[sys.argv.index("--port") + 1])
    settings = _settings()
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning",
                timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
