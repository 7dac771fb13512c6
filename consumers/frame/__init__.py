"""One frame for every aggregate and product of the worker.

An aggregate is its state, a pure ``decide`` and its records (``aggregate``); one ``Writer``
runs all of them in one written order (``writer``). A product registers its aggregates,
workflows and consumers on a typed ``WorkerContext`` (``context``).

Public names: ``Ack``, ``Aggregate``, ``AggregateState``, ``Decision``, ``append``, ``remember``,
``MAX_REMEMBERED`` (and, from the submodules, ``Writer``, ``apply``, ``outputs``, ``Raw``,
``WorkerContext``, ``Product``, ``RecordOnceLog``: the aggregate that records each item once).
"""

from consumers.frame.aggregate import (
    MAX_REMEMBERED,
    Ack,
    Aggregate,
    AggregateState,
    Decision,
    append,
    remember,
)

__all__ = ["MAX_REMEMBERED", "Ack", "Aggregate", "AggregateState", "Decision", "append",
           "remember"]
