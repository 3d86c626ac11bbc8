"""A rank's event table (Arrow) as the pandas DataFrame the detectors read.

``pa.Table.to_pandas`` with nullable ints gives the same frame, but it pays a fixed cost per
column (its pandas metadata, block consolidation, an extension type's ``__from_arrow__``) that
dominates a small table: 7 ms for a 3,500-event rank against 3 ms here, a tenth of the per-rank
map of a run of thousands of such ranks (benchmarks/bench_scale.py). The columns are built
from their buffers instead: dictionaries as Categoricals over their codes, int64 as Int64 (the
validity bitmap its mask), strings as objects. A table with any other type or a column in
several chunks is left to pyarrow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from sptrace.load.arrow import present, to_numpy


def events_frame(table: pa.Table) -> pd.DataFrame:
    """``table`` as a DataFrame: dictionary columns categorical, int64 nullable (Int64)."""
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        if column.num_chunks != 1:
            return _by_pyarrow(table)
        arr = column.chunk(0)
        kind = arr.type
        if arr.null_count == len(arr) and (empty := _all_missing(kind, len(arr))) is not None:
            columns[name] = empty  # (half a rank's columns are fields its events never have)
        elif pa.types.is_dictionary(kind) and pa.types.is_string(kind.value_type):
            codes = to_numpy(arr.indices, fill=-1).astype(np.int32, copy=False)
            dtype = categorical_dtype(tuple(arr.dictionary.to_pylist()))
            columns[name] = pd.Categorical.from_codes(codes, dtype=dtype, validate=False)
        elif kind == pa.int64():
            values = np.array(to_numpy(arr, fill=0))  # (a writable copy: the frame's own)
            columns[name] = pd.arrays.IntegerArray(values, ~present(arr))
        elif pa.types.is_string(kind):
            columns[name] = arr.to_numpy(zero_copy_only=False)
        else:
            return _by_pyarrow(table)
    return pd.DataFrame(columns, copy=False)


_NO_CATEGORIES = pd.CategoricalDtype(pd.Index([], dtype=object))

_DTYPES: dict[tuple[str, ...], pd.CategoricalDtype] = {}
"""Categorical dtypes by their categories: the ranks of a run repeat the same few dictionaries
(categories, phases, threads, often the names; the work lane's modules), and pandas checks a
dtype's categories each time it makes one (a tenth of a millisecond for a rank's few hundred
names)."""


def categorical_dtype(categories: tuple[str, ...]) -> pd.CategoricalDtype:
    """The categorical dtype of these categories (unordered, object), made once."""
    dtype = _DTYPES.get(categories)
    if dtype is None:
        if len(_DTYPES) >= 256:
            _DTYPES.clear()
        dtype = _DTYPES[categories] = pd.CategoricalDtype(pd.Index(categories, dtype=object))
    return dtype


def _all_missing(kind: pa.DataType, n: int) -> object | None:
    """A column of ``n`` missing values of ``kind``, made without reading its buffers (None: a
    type this frame does not build)."""
    if pa.types.is_dictionary(kind) and pa.types.is_string(kind.value_type):
        return pd.Categorical.from_codes(np.full(n, -1, dtype=np.int32), dtype=_NO_CATEGORIES, validate=False)
    if kind == pa.int64():
        return pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))
    if pa.types.is_string(kind):
        return np.full(n, None, dtype=object)
    return None


def _by_pyarrow(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
