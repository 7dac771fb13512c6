"""The assistant's read-only tools over the datasets attached to a turn.

``describe_dataset`` (columns, types, row count, sample values), ``query_dataset`` (one read-only
ClickHouse query over the table ``data`` in the SQL sandbox) and ``display_map`` (a singleton
``map_display`` card of GeoJSON points, merged per ``display_id`` and shown at the end of the
reply by the engine). A tool only sees the datasets its turn attached: any other id is a Hint.
Every answer is an envelope: a refused or failing query is ``Err``, an unknown column or table
a ``Hint`` naming the nearest names.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from pydantic import BaseModel, Field

from consumers.assistant.datasets import DatasetSource, DatasetUnavailable, LoadedDataset
from consumers.assistant.sql import (
    check_sql,
    correction_for,
    nearest,
    parse_engine_error,
)
from consumers.assistant.sqlbox import QueryResult, SandboxError, SandboxTimeout, SqlBox
from consumers.engine import Card, Err, Hint, HintSignal, Ok, Tool, ToolContext, ToolRegistry
from schemas.assistant import DatasetRef
from streams.readonly_sql import SqlRefused

SAMPLES = 5
LAT_NAMES = ("lat", "latitude", "lat_dd", "lat_deg", "y")
LON_NAMES = ("lon", "lng", "long", "longitude", "lon_dd", "lon_deg", "x")
DATASET_TOOLS = ("describe_dataset", "query_dataset", "display_map")
QUERY_CAPABILITY = "converse"
"""What the asking principal must be able to do for ``query_dataset`` to run its SQL."""


class TurnDatasets:
    """The datasets one turn may read (those its request attached), opened on first use."""

    def __init__(self, refs: list[DatasetRef], source: DatasetSource, owner: str,
                 namespace: str | None = None) -> None:
        self.refs = {r.dataset_id: r for r in refs}
        self.source = source
        self.owner = owner
        self.namespace = namespace
        self._loaded: dict[str, LoadedDataset] = {}
        self._lock = threading.Lock()

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self.refs)

    def get(self, dataset_id: str) -> LoadedDataset:
        """The dataset; ``HintSignal`` for one this turn did not attach, ``DatasetUnavailable``
        when it cannot be read (or belongs to someone else)."""
        ref = self.refs.get(dataset_id.strip().lower())
        if ref is None:
            raise HintSignal("unknown_dataset",
                             f"dataset {dataset_id!r} is not attached to this conversation turn"
                             + ("; use one of the alternatives" if self.refs else
                                "; ask the user to attach a CSV"),
                             self.ids)
        with self._lock:
            if ref.dataset_id in self._loaded:
                return self._loaded[ref.dataset_id]
        ds = self.source.load(ref)
        if ds.owner != self.owner:
            raise DatasetUnavailable(f"dataset {dataset_id!r} is not available")
        if ds.namespace != self.namespace:  # the edge attaches none such; a forged ref
            raise DatasetUnavailable(f"dataset {dataset_id!r} is not in this turn's namespace "
                                     f"{self.namespace!r}")
        with self._lock:
            self._loaded[ref.dataset_id] = ds
        return ds


class DescribeDataset(BaseModel):
    dataset_id: str = Field(description="The dataset's id (the hex after 'ID:').")


class QueryDataset(BaseModel):
    dataset_id: str = Field(description="The dataset's id (the hex after 'ID:').")
    sql: str = Field(min_length=1, description="One read-only ClickHouse SELECT (or WITH) "
                                               "query over the table `data`.")


class DisplayMap(BaseModel):
    dataset_id: str = Field(description="The dataset's id (the hex after 'ID:').")
    sql: str = Field(default="SELECT * FROM data",
                     description="The rows to map: a read-only query over the table `data`.")
    title: str | None = Field(default=None, description="The map's title.")
    lat_column: str | None = Field(default=None, description="Latitude column (found by name "
                                                             "when omitted).")
    lon_column: str | None = Field(default=None, description="Longitude column (found by name "
                                                             "when omitted).")
    display_id: str = Field(default="map", description="Calls with the same display_id add "
                                                       "to one map.")


def base_type(ch_type: str) -> str:
    """``Nullable(Float64)`` → ``Float64``; other types as they are."""
    inner = ch_type
    for wrapper in ("Nullable(", "LowCardinality("):
        if inner.startswith(wrapper) and inner.endswith(")"):
            inner = inner[len(wrapper):-1]
    return inner


def coordinate_column(names: list[str], wanted: tuple[str, ...]) -> str | None:
    """The column that looks like latitude (or longitude), by name."""
    lowered = {n.lower(): n for n in names}
    for w in wanted:
        if w in lowered:
            return lowered[w]
    prefix = wanted[0][:3]
    return next((n for n in names if n.lower().startswith(prefix)), None)


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def map_features(rows: list[dict[str, Any]], lat: str, lon: str
                 ) -> tuple[list[dict[str, Any]], int]:
    """GeoJSON point features of the rows with valid coordinates, and how many were skipped."""
    features, skipped = [], 0
    for row in rows:
        la, lo = _number(row.get(lat)), _number(row.get(lon))
        if la is None or lo is None or not (-90 <= la <= 90 and -180 <= lo <= 180):
            skipped += 1
            continue
        features.append({"type": "Feature",
                         "geometry": {"type": "Point", "coordinates": [lo, la]},
                         "properties": {k: v for k, v in row.items() if k not in (lat, lon)}})
    return features, skipped


class DatasetTools:
    """The three tools over one turn's datasets and the worker's SQL sandbox."""

    def __init__(self, datasets: TurnDatasets, box: SqlBox, max_rows: int = 1000,
                 max_features: int = 1000) -> None:
        self.datasets = datasets
        self.box = box
        self.max_rows = max_rows
        self.max_features = max_features

    def _dataset(self, dataset_id: str) -> LoadedDataset | Err:
        try:
            return self.datasets.get(dataset_id)
        except DatasetUnavailable as exc:
            return Err(str(exc), "dataset_unavailable")

    def _run(self, ds: LoadedDataset, sql: str, max_rows: int) -> QueryResult | Hint | Err:
        try:
            query = check_sql(sql)
        except SqlRefused as exc:
            return Err(str(exc), "read_only")
        try:
            return self.box.query(ds.dataset_id, ds.csv_text, query, max_rows)
        except SandboxTimeout as exc:
            return Err(str(exc), "timeout")
        except SandboxError as exc:
            error = parse_engine_error(exc.text)
            fix = correction_for(error, list(ds.columns))
            if fix is not None:
                return Hint(fix.kind, fix.message, fix.alternatives)
            if error.name == "READONLY":
                return Err("refused: queries only read the table `data` (no writes, no table "
                           "functions, no settings)", "read_only")
            return Err(f"the query failed: {error.message} ({error.name})", "query_failed")

    def describe(self, args: DescribeDataset, ctx: ToolContext) -> Ok | Err:  # noqa: ARG002
        """Columns with their types and sample values, and the row count."""
        ds = self._dataset(args.dataset_id)
        if isinstance(ds, Err):
            return ds
        # The engine's own types (what SQL sees), from the metadata of an empty result.
        described = self._run(ds, "SELECT * FROM data LIMIT 0", 0)
        types = ({n: base_type(t) for n, t in described.columns}
                 if isinstance(described, QueryResult) else {})
        records = ds.records()
        columns = []
        for name in ds.columns:
            samples: list[str] = []
            empty = 0
            for rec in records:
                value = (rec.get(name) or "").strip()
                if not value:
                    empty += 1
                elif value not in samples and len(samples) < SAMPLES:
                    samples.append(value)
            columns.append({"name": name, "type": types.get(name, "String"),
                            "sample_values": samples, "empty": empty})
        return Ok(data={"dataset_id": ds.dataset_id, "name": ds.name, "table": "data",
                        "row_count": ds.rows, "column_count": len(ds.columns),
                        "columns": columns})

    def query(self, args: QueryDataset, ctx: ToolContext) -> Ok | Hint | Err:  # noqa: ARG002
        """The rows of one read-only query (at most ``max_rows``)."""
        ds = self._dataset(args.dataset_id)
        if isinstance(ds, Err):
            return ds
        res = self._run(ds, args.sql, self.max_rows)
        if not isinstance(res, QueryResult):
            return res
        warnings = ((f"the query returned {res.total} rows; only the first {self.max_rows} "
                     "are included",) if res.total > len(res.rows) else ())
        return Ok(rows=tuple(res.rows), warnings=warnings,
                  data={"dataset_id": ds.dataset_id, "row_count": res.total,
                        "columns": [{"name": n, "type": base_type(t)} for n, t in res.columns]})

    def display_map(self, args: DisplayMap, ctx: ToolContext) -> Ok | Hint | Err:  # noqa: ARG002
        """A ``map_display`` card of the query's rows with coordinates."""
        ds = self._dataset(args.dataset_id)
        if isinstance(ds, Err):
            return ds
        res = self._run(ds, args.sql, self.max_features)
        if not isinstance(res, QueryResult):
            return res
        names = [n for n, _ in res.columns]
        lat = args.lat_column or coordinate_column(names, LAT_NAMES)
        lon = args.lon_column or coordinate_column(names, LON_NAMES)
        for role, col in (("latitude", lat), ("longitude", lon)):
            if col is None or col not in names:
                near = nearest(col, names) if col else []
                return Hint("no_coordinates",
                            f"no {role} column {col!r} in the query's result"
                            if col else f"no {role} column found in the query's result; name "
                                        f"it with {role[:3]}_column",
                            tuple(near or names))
        assert lat is not None and lon is not None
        features, skipped = map_features(res.rows, lat, lon)
        warnings = []
        if skipped:
            warnings.append(f"{skipped} row(s) without valid coordinates were left off the map")
        if res.total > len(res.rows):
            warnings.append(f"the query returned {res.total} rows; the map shows the first "
                            f"{len(res.rows)}")
        title = args.title or ds.name
        card = Card("map_display", {
            "title": title, "type": "FeatureCollection", "features": features,
            "layers": [{"title": title, "dataset_id": ds.dataset_id, "sql": args.sql,
                        "lat_column": lat, "lon_column": lon, "features": len(features)}],
        }, display_id=args.display_id, singleton=True)
        return Ok(data={"display_id": args.display_id, "title": title,
                        "features": len(features), "skipped": skipped},
                  warnings=tuple(warnings), effects=(card,))

    def tools(self) -> tuple[Tool, ...]:
        """The three tools. ``query_dataset`` runs the caller's own SQL, so it needs the
        asking principal's ``converse`` capability (``QUERY_CAPABILITY``), as the edge put it
        in the chat command; the engine refuses the call otherwise."""
        return (
            Tool("describe_dataset", "Columns (name, type, sample values) and row count of an "
                 "attached dataset.", DescribeDataset, self.describe),
            Tool("query_dataset", "Run one read-only ClickHouse SQL query (SELECT or WITH) "
                 "over an attached dataset, the table `data`.", QueryDataset, self.query,
                 requires=QUERY_CAPABILITY),
            Tool("display_map", "Show rows with latitude/longitude columns as points on a map "
                 "(one map per display_id, shown with the reply).", DisplayMap,
                 self.display_map),
        )

    def registry(self) -> ToolRegistry:
        """The agent's allow-listed, read-only tools (without ``plan``: see ``turn_tools``)."""
        return ToolRegistry(self.tools(), allow=DATASET_TOOLS)
