"""sptrace.load.arrow builds the same arrays as pyarrow's own converters, without them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sptrace.load.arrow import codes_of, dictionary, from_numpy, rows_where, string_array, to_numpy, value_counts

ints = st.lists(st.one_of(st.none(), st.integers(-(2**63) + 1, 2**63 - 1)), max_size=200)
texts = st.lists(st.one_of(st.none(), st.text(max_size=12)), max_size=200)


@settings(max_examples=60, deadline=None)
@given(ints)
def test_ints_round_trip(values):
    valid = np.array([v is not None for v in values], dtype=bool)
    raw = np.array([0 if v is None else v for v in values], dtype=np.int64)
    arr = from_numpy(raw, valid)
    assert arr.equals(pa.array(values, pa.int64()))
    assert to_numpy(arr, fill=-7).tolist() == [-7 if v is None else v for v in values]
    assert (
        to_numpy(arr.slice(len(values) // 2), fill=-7).tolist()
        == [-7 if v is None else v for v in values][len(values) // 2 :]
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.booleans()), max_size=100), st.integers(0, 9))
def test_booleans_with_offsets(values, offset):
    arr = pa.array(values, pa.bool_()).slice(min(offset, len(values)))
    assert to_numpy(arr).tolist() == [bool(v) for v in values[min(offset, len(values)) :]]


@settings(max_examples=60, deadline=None)
@given(texts)
def test_dictionary_equals_pyarrow(values):
    arr = dictionary(values)
    assert arr.type == pa.dictionary(pa.int32(), pa.string())
    expected = [v.encode("utf-8", "replace").decode() if v is not None else None for v in values]
    assert arr.to_pylist() == expected
    assert len(set(arr.dictionary.to_pylist())) == len(arr.dictionary)  # each string once
    counts = value_counts(pa.chunked_array([arr, arr]))
    assert counts == {t: 2 * expected.count(t) for t in set(expected) if t is not None}
    wanted = {t for t in expected[:3] if t is not None}
    assert codes_of(arr, wanted).tolist() == [v in wanted for v in expected]
    assert rows_where(arr.cast(pa.string()), lambda t: t.startswith("a")).tolist() == [
        v is not None and v.startswith("a") for v in expected
    ]


def test_lone_surrogate_is_replaced_not_an_error():
    assert string_array(["a\ud800b"]).to_pylist() == ["a?b"]


def test_all_null_and_empty():
    assert to_numpy(pa.nulls(3, pa.int64()), fill=5).tolist() == [5, 5, 5]
    assert to_numpy(pa.array([], pa.int64())).tolist() == []
    assert dictionary([]).to_pylist() == []
    assert dictionary([None, None]).null_count == 2
