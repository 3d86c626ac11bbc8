"""The event table's DataFrame (sptrace.load.frame) is the one pyarrow builds, built faster."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from sptrace.load.frame import events_frame


def _table() -> pa.Table:
    names = pa.array(["aten::mm", None, "aten::mm", "nccl:all_gather"]).dictionary_encode()
    return pa.table(
        {
            "name": names,
            "ts_ns": pa.array([5, None, 7, 2**40], pa.int64()),
            "dur_ns": pa.array([1, 2, 3, 4], pa.int64()),
            "input_dims": pa.array(["[[2, 3]]", None, "", "[]"]),
        }
    )


def _by_pyarrow(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)


def test_same_frame_as_pyarrow_with_nulls_in_every_type() -> None:
    table = _table()
    frame = events_frame(table)
    pd.testing.assert_frame_equal(frame, _by_pyarrow(table))
    assert str(frame["ts_ns"].dtype) == "Int64" and frame["ts_ns"].isna().tolist() == [False, True, False, False]
    assert frame["name"].cat.categories.tolist() == ["aten::mm", "nccl:all_gather"]
    assert frame["name"].isna().sum() == 1 and frame["input_dims"].tolist() == ["[[2, 3]]", None, "", "[]"]


def test_frame_owns_its_ints() -> None:
    table = _table()
    frame = events_frame(table)
    frame.loc[0, "dur_ns"] = 99  # (a view of Arrow's read-only buffer would raise)
    assert table["dur_ns"][0].as_py() == 1


def test_sliced_and_chunked_tables() -> None:
    table = _table()
    pd.testing.assert_frame_equal(events_frame(table.slice(1, 3)), _by_pyarrow(table.slice(1, 3)))
    chunked = pa.concat_tables([table, table])
    pd.testing.assert_frame_equal(events_frame(chunked), _by_pyarrow(chunked))
    floats = table.append_column("x", pa.array([0.5, None, 1.0, 2.0]))
    pd.testing.assert_frame_equal(events_frame(floats), _by_pyarrow(floats))


def test_ranks_share_equal_dictionaries_and_keep_their_own() -> None:
    """Categorical dtypes are reused across tables with the same dictionary (the ranks of one
    run), never across different ones."""
    first, second = events_frame(_table()), events_frame(_table())
    assert first["name"].cat.categories is second["name"].cat.categories  # (checked once, held once)
    other = _table().set_column(0, "name", pa.array(["aten::mm", "aten::bmm", None, "aten::mm"]).dictionary_encode())
    third = events_frame(other)
    assert third["name"].cat.categories.tolist() == ["aten::mm", "aten::bmm"]
    assert third["name"].tolist()[:2] == ["aten::mm", "aten::bmm"] and first["name"].tolist()[0] == "aten::mm"
    pd.testing.assert_frame_equal(third, _by_pyarrow(other))
