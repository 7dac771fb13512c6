"""The frame every product of the edge is built on, and nothing product-specific.

- ``projection``: per-aggregate views fed by the tail (seq dedupe, kept events, resume,
  ``CursorTooOld``, wait/notify);
- ``sse``: the one SSE loop and where a stream resumes;
- ``commands``: ``CommandsDep``, the one way a route records anything;
- ``deps``: settings, principal and roles, the caller's own resource, views catching up;
- ``tail``: the edge's one consumer of the log; ``auth``: JWT principals;
- ``quotas``: a principal's quotas as route dependencies (429 with ``Retry-After``);
- ``model_registry``: a requested model must be one of ``VOICE_MODELS`` (422
  ``MODEL_NOT_FOUND``).

It never imports a product package (``api.conversations``, ``api.assistant``, ``api.staff``).
"""
