"""JSON sanitisation of what tools and models produce (the persisted chain, effect payloads)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from uuid import UUID

import numpy as np
from pydantic import BaseModel

from consumers.engine import sanitize_json


class Color(Enum):
    RED = "red"


class P(BaseModel):
    x: float


@dataclass
class D:
    when: date
    n: np.int32


def test_odd_values_become_plain_json():
    value = {
        "np_int": np.int64(7), "np_float": np.float32(1.5), "np_nan": np.float64("nan"),
        "np_bool": np.bool_(True), "array": np.array([[1, 2], [3, 4]]),
        "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "ok": 2.5,
        "dt": datetime(2024, 5, 1, 12, 0, tzinfo=UTC), "d": date(2024, 5, 1), "t": time(8, 30),
        "td": timedelta(minutes=2), "dec": Decimal("1.25"), "bytes": b"\xff\x00",
        "set": {3, 1, 2}, "tuple": (1, "a"), "enum": Color.RED,
        "uuid": UUID("12345678-1234-5678-1234-567812345678"), "model": P(x=math.nan),
        "dc": D(date(2020, 1, 1), np.int32(4)), "np_dt": np.datetime64("2024-01-02"),
        1: "int key", None: "none key",
    }
    out = sanitize_json(value)
    text = json.dumps(out, allow_nan=False)  # would raise on NaN/Infinity or odd types
    assert out["np_int"] == 7 and type(out["np_int"]) is int
    assert out["np_float"] == 1.5 and out["np_bool"] is True
    assert out["np_nan"] is None and out["nan"] is None and out["inf"] is None
    assert out["-inf"] is None and out["ok"] == 2.5
    assert out["array"] == [[1, 2], [3, 4]]
    assert out["dt"] == "2024-05-01T12:00:00+00:00" and out["d"] == "2024-05-01"
    assert out["t"] == "08:30:00" and out["td"] == 120.0 and out["dec"] == 1.25
    assert out["bytes"] == "/wA=" and out["set"] == [1, 2, 3] and out["tuple"] == [1, "a"]
    assert out["enum"] == "red" and out["uuid"] == "12345678-1234-5678-1234-567812345678"
    assert out["model"] == {"x": None} and out["dc"] == {"when": "2020-01-01", "n": 4}
    assert out["np_dt"].startswith("2024-01-02")
    assert out["1"] == "int key" and out["None"] == "none key"
    assert json.loads(text) == out
