"""Voice's Kafka consumers (Faust agents): the conversation sequencer, the turn worker, the
workflow engine's step runner. Each reads records through ``consumers.intake``, which sends any
record it cannot decode to ``<topic>.dlq`` and goes on.

Public names: ``create_worker_app``, ``sequence``, ``ConversationState``.
"""
