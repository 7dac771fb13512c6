"""Voice's worker (Faust agents): one frame (``consumers.frame``: the single writer of every
aggregate, the worker context) and the products registered on it — ``conversations``,
``assistant``, ``staff`` — over the agent engine (``consumers.engine``, the one owner of the
model client) and the workflow runtime (``consumers.workflows``). Every consumer reads records
through ``consumers.intake``, which sends any record it cannot decode to ``<topic>.dlq`` and
goes on.

Public names: ``consumers.app.create_worker``, ``run_worker``, ``declare_changelogs``.
"""
