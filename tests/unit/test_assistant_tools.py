"""The assistant's tools over a real SQL sandbox (chDB in a child process): describe, query
(Hints for unknown names, refusal of anything but a read), the map card and its merging."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.assistant.datasets import MemoryDatasets, from_csv
from consumers.assistant.sqlbox import SqlBox
from consumers.assistant.tools import DatasetTools, TurnDatasets, coordinate_column
from consumers.engine import (
    AgentSpec,
    CancelToken,
    Err,
    Hint,
    Ok,
    RecordingSink,
    ToolContext,
    TurnInput,
    run_turn,
)
from consumers.engine.testing import ScriptedModel, text, tool_use
from consumers.engine.tools import execute
from schemas.assistant import DatasetRef

CSV = (Path(__file__).resolve().parents[1] / "fixtures" / "assistant_facilities.csv").read_text()
DS = "ab" * 16
OTHER = "cd" * 16


@pytest.fixture(scope="module")
def box() -> Iterator[SqlBox]:
    b = SqlBox(timeout_s=20)
    yield b
    b.close()


def tools(box: SqlBox, owner: str = "alice", max_rows: int = 1000) -> DatasetTools:
    source = MemoryDatasets([from_csv(DS, "alice", "facilities.csv", CSV),
                             from_csv(OTHER, "bob", "bobs.csv", "a,b\n1,2\n")])
    refs = [DatasetRef(dataset_id=DS, partition=0, offset=0),
            DatasetRef(dataset_id=OTHER, partition=0, offset=1)]
    return DatasetTools(TurnDatasets(refs, source, owner), box, max_rows=max_rows)


async def call(t: DatasetTools, name: str, args: dict) -> Ok | Hint | Err:
    ctx = ToolContext(principal="alice", agent_name="assistant", turn_id="t", tool_use_id="u",
                      tenant="default", capabilities=frozenset({"converse"}))
    return (await execute(t.registry(), name, args, ctx, CancelToken())).envelope


async def test_describe_gives_columns_types_samples_and_row_count(box: SqlBox) -> None:
    env = await call(tools(box), "describe_dataset", {"dataset_id": DS})
    assert isinstance(env, Ok)
    data = env.data
    assert data["row_count"] == 12 and data["name"] == "facilities.csv" and data["table"] == "data"
    cols = {c["name"]: c for c in data["columns"]}
    assert list(cols) == ["name", "state", "lat", "lon", "program"]
    assert cols["lat"]["type"] == "Float64" and cols["state"]["type"] == "String"
    assert cols["state"]["sample_values"][:3] == ["LA", "TX", "MS"]
    assert len(cols["name"]["sample_values"]) == 5


async def test_query_returns_rows_and_their_schema(box: SqlBox) -> None:
    env = await call(tools(box), "query_dataset",
                     {"dataset_id": DS, "sql": "SELECT name, lat FROM data WHERE state = 'LA' "
                                               "ORDER BY name"})
    assert isinstance(env, Ok)
    assert [r["name"] for r in env.rows][0] == "Atchafalaya Drum Reclaimers"
    assert len(env.rows) == 4 and env.data["row_count"] == 4
    assert [(c.name, c.type) for c in env.schema] == [("name", "str"), ("lat", "float")]


async def test_query_caps_rows_with_a_warning(box: SqlBox) -> None:
    env = await call(tools(box, max_rows=3), "query_dataset",
                     {"dataset_id": DS, "sql": "SELECT * FROM data"})
    assert isinstance(env, Ok) and len(env.rows) == 3 and env.data["row_count"] == 12
    assert "only the first 3" in env.warnings[0]


async def test_unknown_column_is_a_hint_with_the_nearest_names(box: SqlBox) -> None:
    env = await call(tools(box), "query_dataset",
                     {"dataset_id": DS, "sql": "SELECT * FROM data WHERE stat = 'LA'"})
    assert isinstance(env, Hint) and env.hint_kind == "unknown_column"
    assert env.alternatives[0] == "state" and "'stat'" in env.message


async def test_unknown_table_is_a_hint_naming_data(box: SqlBox) -> None:
    env = await call(tools(box), "query_dataset",
                     {"dataset_id": DS, "sql": "SELECT * FROM facilities"})
    assert isinstance(env, Hint) and env.hint_kind == "unknown_table"
    assert env.alternatives == ("data",) and "'facilities'" in env.message


@pytest.mark.parametrize("sql", [
    "DROP TABLE data",
    "INSERT INTO data VALUES ('x', 'LA', 1, 2, 'RCRA')",
    "ALTER TABLE data DELETE WHERE 1",
    "SELECT 1; DROP TABLE data",
    "SELECT * FROM data INTO OUTFILE '/tmp/voice-leak.csv'",
    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "SELECT * FROM url('http://127.0.0.1:1/x', 'CSV')",
    "SELECT 1 SETTINGS readonly = 0",
    "SELECT file('/etc/passwd') AS leak",  # the scalar: a readonly session would run it
    "SELECT 1; SELECT 2",  # chDB would run both
])
async def test_anything_but_a_read_is_refused(box: SqlBox, sql: str) -> None:
    env = await call(tools(box), "query_dataset", {"dataset_id": DS, "sql": sql})
    assert isinstance(env, Err) and env.err_kind == "read_only", env
    after = await call(tools(box), "query_dataset", {"dataset_id": DS,
                                                     "sql": "SELECT count() AS n FROM data"})
    assert isinstance(after, Ok) and after.rows[0]["n"] == 12  # the table is intact
    assert not Path("/tmp/voice-leak.csv").exists()


async def test_a_dataset_not_attached_or_not_the_callers_is_refused(box: SqlBox) -> None:
    env = await call(tools(box), "describe_dataset", {"dataset_id": "ef" * 16})
    assert isinstance(env, Hint) and env.hint_kind == "unknown_dataset"
    assert DS in env.alternatives
    env = await call(tools(box), "describe_dataset", {"dataset_id": OTHER})  # bob's
    assert isinstance(env, Err) and env.err_kind == "dataset_unavailable"


async def test_display_map_builds_a_singleton_card_of_the_queried_rows(box: SqlBox) -> None:
    env = await call(tools(box), "display_map", {
        "dataset_id": DS, "sql": "SELECT * FROM data WHERE state = 'LA'",
        "title": "Map of Louisiana"})
    assert isinstance(env, Ok)
    (card,) = env.effects
    assert card.card_type == "map_display" and card.singleton and card.display_id == "map"
    features = card.card_data["features"]
    assert len(features) == 4 and {f["properties"]["state"] for f in features} == {"LA"}
    lon, lat = features[0]["geometry"]["coordinates"]
    assert -94 < lon < -89 and 28 < lat < 34
    assert card.card_data["title"] == "Map of Louisiana"
    json.dumps(card.card_data)  # JSON all the way down


async def test_display_map_without_coordinates_is_a_hint(box: SqlBox) -> None:
    env = await call(tools(box), "display_map",
                     {"dataset_id": DS, "sql": "SELECT name, state FROM data"})
    assert isinstance(env, Hint) and env.hint_kind == "no_coordinates"
    assert set(env.alternatives) == {"name", "state"}


def test_coordinate_columns_are_found_by_name() -> None:
    assert coordinate_column(["Name", "Latitude", "Longitude"], ("lat", "latitude")) == "Latitude"
    assert coordinate_column(["site", "lat_wgs84", "lng"], ("lat",)) == "lat_wgs84"
    assert coordinate_column(["a", "b"], ("lat",)) is None


async def test_map_cards_are_merged_per_display_id_and_shown_at_the_end(box: SqlBox) -> None:
    t = tools(box)
    spec = AgentSpec(name="assistant", identity="[agent: assistant]", tools=t.registry(),
                     model="m")
    model = ScriptedModel([
        [tool_use("display_map", {"dataset_id": DS, "title": "South",
                                  "sql": "SELECT * FROM data WHERE state = 'LA'"})],
        [tool_use("display_map", {"dataset_id": DS, "title": "South",
                                  "sql": "SELECT * FROM data WHERE state = 'TX'"})],
        [tool_use("display_map", {"dataset_id": DS, "display_id": "other",
                                  "sql": "SELECT * FROM data WHERE state = 'MS'"})],
        [text("Here are the maps.")],
    ])
    sink = RecordingSink()
    result = await run_turn(spec, TurnInput("t-1", "map the south"), model, sink)
    assert result.end_reason == "end_turn"
    kinds = [e.type for e in sink.display()]
    cards = sink.display("card")
    assert len(cards) == 2  # one per display_id, merged
    assert kinds.index("text_complete") < kinds.index("card") < kinds.index("done")
    merged = next(c for c in cards if c.display_id == "map").data["card_data"]
    assert {f["properties"]["state"] for f in merged["features"]} == {"LA", "TX"}
    assert len(merged["features"]) == 6 and len(merged["layers"]) == 2
    other = next(c for c in cards if c.display_id == "other").data["card_data"]
    assert {f["properties"]["state"] for f in other["features"]} == {"MS"}
    assert [c["display_id"] for c in result.cards] == ["map", "other"]
