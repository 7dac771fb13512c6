"""A small durable workflow engine: state machines keyed by workflow id whose lifecycle is
records on ``voice.workflows`` and whose state is a changelog-backed Faust table.

``engine`` holds the pure transitions (no I/O); ``runtime`` runs steps as tasks inside the
worker and turns transitions into records. Workflows: ``consumers.conversations.turns``
(conversation-turn).
"""
