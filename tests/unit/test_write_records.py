"""GIVEN a table written as a JSON array a chunk of rows at a time (sptrace.jsonable.write_records:
what ``sptrace collectives --format json`` prints, without a large run's rows held as dicts)
WHEN it has no row, one, or more rows than a chunk, with missing values, newlines in its strings
and lists in its cells
THEN the text is json.dumps(records(frame), indent=1)'s, to the byte, whatever the chunk size."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest

from sptrace.jsonable import records, write_records


def table(n: int) -> pd.DataFrame:
    return pd.DataFrame({
        "rank": np.arange(n), "op": [None if i % 3 else f"all_gather\n{i}" for i in range(n)],
        "ms": np.where(np.arange(n) % 4 == 0, np.nan, np.arange(n) / 7), "ranks": [[0, 1]] * n,
        "bytes": pd.array([None if i % 5 == 0 else i for i in range(n)], dtype="Int64"),
    })  # fmt: skip


@pytest.mark.parametrize("n", [0, 1, 2, 7, 64])
@pytest.mark.parametrize("chunk_rows", [1, 3, 4096])
def test_the_streamed_array_is_json_dumps_text(n, chunk_rows):
    frame = table(n)
    out = io.StringIO()
    write_records(frame, out, chunk_rows)
    assert out.getvalue() == json.dumps(records(frame), indent=1, default=str) + "\n"
    assert len(json.loads(out.getvalue())) == n
