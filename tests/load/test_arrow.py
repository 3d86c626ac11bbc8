"""sptrace.load.arrow builds the same arrays as pyarrow's own converters, without them."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
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


# ---- the decoder reads an args field only on the categories that carry it -----------------

_ARG_KEYS = {"External id": "external_id", "Python id": "python_id", "stream": "stream", "Ev Idx": "ev_idx"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["cpu_op", "kernel", "python_function", None]),
            st.dictionaries(st.sampled_from(sorted(_ARG_KEYS)), st.integers(0, 2**40), max_size=4),
            st.sampled_from(["", 'x "Python id":1 y', '"stream":']),  # keys inside a string value
        ),
        min_size=1,
        max_size=700,
    )
)
def test_args_on_any_mix_of_categories(tmp_path, events):
    """Each event's int args, and a string arg whose text holds other fields' keys, equal
    json's reading of the same file, however the fields are spread over categories (a field on
    one event of 700, outside the decoder's sample of each category, included)."""
    from sptrace.load.decode import decode_trace

    raw = []
    for i, (cat, args, text) in enumerate(events):
        event = {"ph": "X", "name": f"op{i % 5}", "pid": 1, "tid": 1, "ts": 10 + i, "dur": 1, "args": dict(args)}
        if cat is not None:
            event["cat"] = cat
        if text:
            event["args"]["Collective name"] = text
        raw.append(event)
    path = tmp_path / f"t{len(events)}.json"
    path.write_text(json.dumps({"traceEvents": raw}))
    _, table = decode_trace(path)
    assert table.num_rows == len(raw)
    by_ts = sorted(range(table.num_rows), key=table["ts_ns"].to_pylist().__getitem__)
    for key, column in _ARG_KEYS.items():
        got = table[column].to_pylist()
        assert [got[r] for r in by_ts] == [e["args"].get(key) for e in raw], key
    names = table["coll_name"].to_pylist()
    assert [names[r] for r in by_ts] == [e["args"].get("Collective name") for e in raw]


def test_a_field_on_one_event_outside_the_sample(tmp_path):
    """1,000 kernels sample every 3rd event: a stream on event 1 alone must still be read."""
    from sptrace.load.decode import decode_trace

    raw = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": i, "dur": 1, "args": {"correlation": i}}
        for i in range(1000)
    ]
    raw[1]["args"]["stream"] = 7
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps({"traceEvents": raw}))
    _, table = decode_trace(path)
    assert table["stream"].to_pylist() == [7 if i == 1 else None for i in range(1000)]
    assert table["correlation"].to_pylist() == list(range(1000))
