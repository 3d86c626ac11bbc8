"""The native decoder (sptrace/load/_kineto.c) gives the msgspec decoder's table, or declines.

Oracle: the msgspec path (SPTRACE_DECODER=msgspec), which tests/load/test_arrow.py and
test_fuzz.py hold to json's own reading. Every input below is read both ways: the tables, their
schemas and the metadata are equal, or both say the same error. A decline (None) is never
wrong, only slower; the tests also check that what Kineto writes is not declined."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sptrace.load import decode
from sptrace.vocab.errors import TraceError

NOT_BUILT = "the native decoder is not built (sptrace was installed without a C compiler): msgspec reads traces alone"


@pytest.fixture(autouse=True)
def native():
    if decode._kineto is None:
        if os.environ.get("SPTRACE_REQUIRE_NATIVE"):  # CI: the extension must have been built
            pytest.fail(NOT_BUILT)
        pytest.skip(NOT_BUILT)


def read(path: Path, decoder: str):
    """(metadata, table) or the error's text, through one decoder."""
    old = os.environ.get("SPTRACE_DECODER")
    os.environ["SPTRACE_DECODER"] = decoder
    try:
        return decode.decode_trace(path)
    except TraceError as exc:
        return str(exc)
    finally:
        if old is None:
            del os.environ["SPTRACE_DECODER"]
        else:
            os.environ["SPTRACE_DECODER"] = old


def assert_same(path: Path) -> bool:
    """Both decoders agree on ``path``; returns whether the native one took it."""
    expected, got = read(path, "msgspec"), read(path, "native")
    if isinstance(expected, str) or isinstance(got, str):
        assert got == expected
    else:
        assert got[0] == expected[0]
        assert got[1].schema == expected[1].schema
        for name in expected[1].column_names:  # column by column, for a readable failure
            assert got[1][name].equals(expected[1][name]), name
    try:
        return decode.decode_native(path, decode.read_bytes(path)) is not None
    except TraceError:  # read, and found wanting as the msgspec path finds it (e.g. an event without ts)
        return True


def kineto_trace() -> dict:
    """What current Kineto writes, in its own key order: ph first, the process named "Spans",
    a GPU stream as "stream 7", flows, memory instants, record_param_comms args, escapes and
    non-ASCII in names, M events with and without labels."""
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 12, "tid": 12, "ts": 1700000000123.456, "dur": 20.5,
         "args": {"External id": 3, "Record function id": 0, "Sequence number": 7, "Fwd thread id": 0,
                  "Input Dims": [[8, 4], [4, 2]], "Input type": ["float", "float"],
                  "Concrete Inputs": ["", ""], "Ev Idx": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 12, "tid": 12, "ts": 1700000000200.001,
         "dur": 3, "args": {"External id": 4, "Collective name": "allgather", "dtype": "Float",
                            "In msg nelems": 32, "Out msg nelems": 256, "Group size": 8,
                            "In split size": "[]", "Out split size": "[]", "Process Group Name": "0",
                            "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1, 2, 3]",
                            "Rank": 1, "Seq": 5}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
         "pid": 0, "tid": "stream 7", "ts": 1700000000300, "dur": 12.25,
         "args": {"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 99, "grid": [1, 1, 1],
                  "est. achieved occupancy %": 0, "external id": 4}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 12, "tid": 12,
         "ts": 1700000000210.5, "dur": 4, "args": {"cbid": 211, "correlation": 99, "external id": 4}},
        {"ph": "X", "cat": "python_function", "name": "nn.Module: Block_0 \"q\\u00e9\" \u00e9\u4e2d",
         "pid": 12, "tid": 12, "ts": 1700000000100, "dur": 300,
         "args": {"Python parent id": 1, "Python id": 2, "Python thread": 0}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 12, "tid": 12, "ts": 1700000000201,
         "s": "t", "args": {"Total Reserved": 2097152, "Total Allocated": 1024, "Bytes": 1024, "Addr": 139900,
                            "Device Type": 1, "Device Id": 0}},
        {"ph": "s", "id": 99, "pid": 12, "tid": 12, "ts": 1700000000210.5, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 99, "pid": 0, "tid": "stream 7", "ts": 1700000000300, "cat": "ac2g", "name": "ac2g",
         "bp": "e"},
        {"name": "process_name", "ph": "M", "ts": 1700000000000, "pid": "Spans", "tid": 0,
         "args": {"name": "Spans"}},
        {"name": "thread_name", "ph": "M", "ts": 1700000000000, "pid": 12, "tid": 12,
         "args": {"name": "thread 12 (python)"}},
        {"name": "process_labels", "ph": "M", "ts": 1700000000000, "pid": 0, "tid": 0,
         "args": {"labels": "GPU 0"}},
        {"ph": "X", "cat": "Trace", "ts": 1700000000000, "dur": 500, "pid": "Spans", "tid": "PyTorch Profiler",
         "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
    ]  # fmt: skip
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
        "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 8},
        "record_shapes": 1,
        "traceEvents": ev,
        "traceName": "rank1.pt.trace.json",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1700000000000000000,
    }


def test_what_kineto_writes_is_read_natively(tmp_path):
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps(kineto_trace(), indent=2))
    assert assert_same(path)
    _, table = decode.decode_trace(path)
    assert table.num_rows == 12
    assert table["tid"].to_pylist()[2] == 7  # "stream 7"
    assert table["ts_ns"].to_pylist()[0] == 1_700_000_000_123_456  # ns, exactly
    assert table["external_id"].to_pylist()[:4] == [3, 4, 4, 4]  # "external id" of old kernels


def test_run_gzip_and_compact_json(tmp_path):
    import gzip

    path = tmp_path / "rank1.json.gz"
    path.write_bytes(gzip.compress(json.dumps(kineto_trace(), separators=(",", ":")).encode()))
    assert assert_same(path)


DECLINED = {
    "an exponent": {"ph": "X", "name": "a", "ts": 1.5e-7, "dur": 1},  # (json writes 1.5e-07)
    "four significant decimals": {"ph": "X", "name": "a", "ts": 1.2345, "dur": 1},
    "a phase msgspec's union lacks": {"ph": "B", "name": "a", "ts": 1},
    "a float pid": {"ph": "X", "name": "a", "ts": 1, "pid": 1.0},
    "a bool tid": {"ph": "X", "name": "a", "ts": 1, "tid": True},
    "an int beyond 64 bits": {"ph": "X", "name": "a", "ts": 1, "args": {"External id": 2**64}},
    "a string where an int goes": {"ph": "X", "name": "a", "ts": 1, "args": {"correlation": "7"}},
    "a null name": {"ph": "X", "name": None, "ts": 1},
    "args that are no object": {"ph": "X", "name": "a", "ts": 1, "args": [1]},
    "a time in a string": {"ph": "X", "name": "a", "ts": "1"},
    "a time no clock holds": {"ph": "X", "name": "a", "ts": 10**17},
    "a fraction a double cannot hold exactly": {"ph": "X", "name": "a", "ts": 2**43 + 0.5},
    "an int a double cannot hold": {"ph": "X", "name": "a", "ts": 2**53 + 1},
    "metadata args that are no object": {"ph": "M", "name": "thread_name", "ts": 1, "args": "x"},
}


@pytest.mark.parametrize("what", sorted(DECLINED))
def test_declines_what_only_msgspec_reads_exactly(tmp_path, what):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "ok", "ts": 0, "dur": 1}, DECLINED[what]]}))
    assert not assert_same(path)


@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [{"ph": "X", "ph": "X", "name": "a", "ts": 1}]}',  # a repeated key
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "args": {"Seq": 1, "Seq": 2}}]}',
        '{"traceEvents": [{"ph": "X", "n\\u0061me": "a", "ts": 1}]}',  # an escaped key
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}], "traceEvents": []}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1,}]}',  # invalid JSON: every reader says so
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 01}]}',
        '{"traceEvents": [{"ph": "X", "name": "a\x01", "ts": 1}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}]} x',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}]',
        '{"traceEvents": [{"ph": "X", "name": "\\x", "ts": 1}]}',
        '{"traceEvents": []}',
        '{"traceEvents": null}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}], "distributedInfo": {"rank": 1e999}}',
        '{"traceEvents": [{"ph": "M", "name": "a", "ts": 1, "args": {"name": 1e999}}]}',
        "[1, 2]",
    ],
)
def test_declines_odd_and_broken_documents(tmp_path, text):
    path = tmp_path / "odd.json"
    path.write_text(text)
    assert not assert_same(path)


def test_invalid_utf8_is_declined(tmp_path):
    path = tmp_path / "odd.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "a\xff", "ts": 1}]}')
    assert not assert_same(path)


# ---- any mix of fields and types -------------------------------------------------------------

times = st.one_of(
    st.integers(-(10**12), 10**15),
    st.integers(0, 10**12).map(lambda us: us + 0.125),
    st.sampled_from([2**43 - 1 + 0.5, 2**43 + 0.5, 2**43 + 1, 2**53 - 1, 2**53, 2**53 + 2, 1.7e15 + 0.25]),
    st.decimals(-(10**9), 10**12, places=3, allow_nan=False, allow_infinity=False).map(float),
    st.none(),
    st.sampled_from([1.5e3, 1.0001, "12", 2**70, -0.5]),
)
ids = st.one_of(
    st.integers(-(2**63) + 1, 2**63 - 1),
    st.none(),
    st.sampled_from(["Spans", "stream 7", " 12 ", "-3", "stream", "", 2.0, True, 2**64]),
)
texts = st.one_of(st.text(max_size=8), st.none(), st.sampled_from(["", 'a"b\\c', "\u00e9\U0001f600", 5]))
raws = st.one_of(
    st.none(),
    st.text(max_size=6),
    st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=3),
    st.sampled_from(["[]", "[0, 1]", {"a": [1]}, 3, 1.5, True]),
)
X_KEYS = {
    "External id": ids, "external id": ids, "correlation": ids, "Sequence number": ids, "Ev Idx": ids,
    "stream": ids, "Python id": ids, "Seq": ids, "Input Dims": raws, "Input type": raws,
    "Concrete Inputs": raws, "In split size": raws, "Process Group Name": raws, "Process Group Ranks": raws,
    "Collective name": texts, "dtype": texts, "Process Group Description": texts,
    "Addr": ids, "unknown": raws, "grid": raws,
}  # fmt: skip
I_KEYS = {"Addr": ids, "Bytes": ids, "Total Allocated": ids, "Device Id": ids, "Ev Idx": ids, "External id": ids}
META = st.one_of(
    st.none(),
    st.fixed_dictionaries({}, optional={"name": texts, "labels": texts, "sort_index": st.integers(0, 9)}),
)


@st.composite
def events(draw):
    ph = draw(st.sampled_from(["X", "X", "X", "i", "s", "f", "M"]))
    fields = {"name": st.one_of(st.sampled_from(["aten::mm", "[memory]", "ac2g", "thread_name",
                                                                     ""]), texts),
              "cat": st.one_of(st.sampled_from(["cpu_op", "kernel", "Operator", "async", None]), texts),
              "dur": times, "pid": ids, "tid": ids, "id": ids, "bp": texts}  # fmt: skip
    event = draw(st.fixed_dictionaries({"ph": st.just(ph), "ts": times}, optional=fields))
    if ph in ("X", "i") and draw(st.booleans()):
        keys = X_KEYS if ph == "X" else I_KEYS
        event["args"] = draw(st.fixed_dictionaries({}, optional=keys))
    elif ph == "M":
        event["args"] = draw(META)
    order = draw(st.permutations(sorted(event)))  # ph is not always first
    return {key: event[key] for key in order}


@settings(
    # make test draws 40 new event lists per run, CI (.ci/run) 120
    max_examples=int(os.environ.get("SPTRACE_NATIVE_EXAMPLES", "40")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(events(), min_size=1, max_size=30), st.booleans(), st.sampled_from([None, 2, 0]))
@example([{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": "Spans"}], True, None)
@example([{"ph": "s", "name": "a", "ts": 1, "bp": ""}, {"ph": "f", "ts": 2, "bp": "e"}], False, None)
def test_any_events_read_alike(tmp_path, evs, with_metadata, indent):
    doc = {"traceEvents": evs}
    if with_metadata:
        doc = {"schemaVersion": 1, **doc, "distributedInfo": {"rank": 0, "world_size": 2}, "other": [1, {"a": None}]}
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(doc, indent=indent, ensure_ascii=indent == 2))
    assert_same(path)


def test_real_traces_are_read_natively(corpus):
    """Every trace of the corpus (NCCL and gloo, old and new Kineto, HTA's and TraceLens's test
    data): the same table, and none declined."""
    paths = sorted(p for p in corpus.rglob("*") if p.name.endswith((".json", ".json.gz")))
    assert paths
    taken = [assert_same(p) for p in paths]
    assert all(taken), [p.name for p, ok in zip(paths, taken) if not ok]


def test_our_own_runs_are_read_natively(profiled):
    """The demo's gloo traces (instrumented, with memory and python frames)."""
    paths = sorted(profiled("megatron").glob("rank*.json.gz"))
    assert len(paths) == 8
    assert all(assert_same(p) for p in paths)


def test_every_path_groups_rows_by_phase(tmp_path):
    """A time the msgspec path must read as text sends the trace down its tolerant path (and the
    native decoder declines it): rows still come grouped by phase, in file order within each."""
    events = [
        {"ph": "i", "name": "[memory]", "ts": 1, "args": {"Bytes": 1}},
        {"ph": "X", "name": "a", "ts": 2**43 + 0.5, "dur": 1},
        {"ph": "M", "name": "thread_name", "ts": 0, "pid": 1, "tid": 1, "args": {"name": "main"}},
        {"ph": "X", "name": "b", "ts": 3, "dur": 1},
        {"ph": "i", "name": "[memory]", "ts": 4, "args": {"Bytes": -1}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert not assert_same(path)
    _, table = decode.decode_trace(path)
    assert table["ph"].to_pylist() == ["X", "X", "i", "i", "M"]
    assert table["name"].to_pylist() == ["a", "b", "[memory]", "[memory]", "thread_name"]
    assert table["ts_ns"].to_pylist()[0] == (2**43) * 1000 + 500
    assert table["mem_bytes"].to_pylist() == [None, None, 1, -1, None]
