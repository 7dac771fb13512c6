"""Voice's record types: one frozen pydantic model per record type, versioned in its CloudEvents
type name, and the registry that maps a ``ce_type`` back to its model.

Public names: ``Record``, ``record_type``, ``registry``, ``model_for``, ``export_json_schemas``,
``Sealed``, and the record models of each domain module.
"""

from schemas import (  # noqa: F401  (registers types)
    agent,
    assistant,
    conversation,
    keys,
    staff,
    system,
    workflow,
)
from schemas.base import Record, Sealed, export_json_schemas, model_for, record_type, registry

__all__ = ["Record", "Sealed", "export_json_schemas", "model_for", "record_type", "registry"]
