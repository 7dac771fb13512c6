"""Turning whatever a tool or a model produced into plain JSON values.

The persisted tool-call chain and every effect payload must survive ``json.dumps`` with
``allow_nan=False``: numpy scalars and arrays, datetimes, decimals, NaN/Infinity, bytes and sets
show up in real tool output. This module never raises on an odd value; the last resort is
``str(value)``.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any
from uuid import UUID

from pydantic import BaseModel


def sanitize_json(value: Any) -> Any:
    """A JSON-safe copy of ``value``: NaN/±Infinity → None, bytes → base64, dates → ISO text."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {_key(k): sanitize_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [sanitize_json(v) for v in items]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return sanitize_json(float(value))
    if isinstance(value, Enum):
        return sanitize_json(value.value)
    if isinstance(value, (UUID, PurePath)):
        return str(value)
    if isinstance(value, BaseModel):
        return sanitize_json(value.model_dump(mode="python"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sanitize_json({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if type(value).__module__.split(".")[0] in ("numpy", "pandas"):
        return _numpy(value)
    return str(value)


def _numpy(value: Any) -> Any:
    # Without importing numpy: scalars have .item(), arrays .tolist(), pandas NaT/NA are odd.
    if hasattr(value, "tolist") and getattr(value, "ndim", 0):
        return sanitize_json(value.tolist())
    if hasattr(value, "item"):
        try:
            return sanitize_json(value.item())
        except (TypeError, ValueError):
            return str(value)
    if hasattr(value, "isoformat"):
        try:
            return value.isoformat()
        except (TypeError, ValueError):
            return None
    return None if str(value) in ("NaT", "<NA>", "nan") else str(value)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    cleaned = sanitize_json(key)
    return cleaned if isinstance(cleaned, str) else str(cleaned)
