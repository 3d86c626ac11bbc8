"""GIVEN small hand-written CPU traces: a forward that allocates a tensor, a collective call that
takes or fills it (or none), its free (recorded inside an autograd node, outside one, on the
backend's thread, lost to a reused address, or missing), a backward
WHEN sptrace.detect.allocations decides who holds each allocation alive at the boundary
THEN the holder follows the evidence alone: where the data came from is never who holds the memory
(the backend can hold only the exact tensors of a call), and where the trace cannot tell, it says
undecided rather than guessing; sptrace.instrument's census of who released each buffer a
collective filled decides those."""

from __future__ import annotations

import json

import pytest

import sptrace
from sptrace.detect.allocations import detect_retained
from sptrace.vocab import markers

FULL = 64 * 4  # the tensor under test: 64 float32 elements


def _trace(tmp_path, events):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return sptrace.load_trace(path, cache=False)


def op(name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def mem(ts, addr, nbytes, tid=1):
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": tid, "ts": ts, "s": "t",
            "args": {"Addr": addr, "Bytes": nbytes, "Device Type": 0, "Device Id": -1}}  # fmt: skip


def node(ts, name="MmBackward0", dur=10):
    return op(f"autograd::engine::evaluate_function: {name}", ts, dur)


def forward(call: str | None):
    """A tensor at 0xA000 made at 10 us by ``aten::cat`` (as a list all-gather's pieces are
    joined), or by ``aten::empty`` right before ``call`` (a c10d op) takes or fills it."""
    events = [op("ProfilerStep#1", 0, 1000)]
    if call is None:
        events += [op("aten::cat", 9, 3, **{"Input Dims": [[[4, 8], [4, 8]], []], "Input type": ["TensorList", ""]}),
                   mem(10, 0xA000, FULL)]  # fmt: skip
    elif call == "c10d::allreduce_":  # in place: the tensor the call took
        events += [
            op("aten::mm", 9, 3, **{"Input Dims": [[8, 4], [4, 8]], "Input type": ["float", "float"]}),
            mem(10, 0xA000, FULL),
            op(call, 20, 5, **{"Input Dims": [[[8, 8]]], "Input type": ["TensorList"]}),
        ]
    else:  # c10d::_allgather_base_: the output buffer the model made, filled by the call
        events += [
            op("aten::empty", 9, 3),
            mem(10, 0xA000, FULL),
            op(call, 20, 5, **{"Input Dims": [[16, 4], [4, 4]], "Input type": ["float", "float"]}),
        ]
    return events


@pytest.mark.parametrize(
    "call, free, holder, says",
    [
        (None, "in a node", "autograd", "freed in MmBackward0"),
        (None, "outside nodes", "model", "outside any autograd node"),
        (None, "after backward", "model", "freed after it outside autograd"),
        (None, "never", "model", "no collective call had it"),  # a cat of gathered pieces is the model's
        (None, "reused", "undecided", "address was allocated again"),
        # read and written in place: the sum the model goes on with, as undecided as a filled buffer
        ("c10d::allreduce_", "never", "undecided", "the tensor c10d::allreduce_ summed in place"),
        ("c10d::allreduce_", "reused", "backend", "the backend released it on its own thread"),
        ("c10d::_allgather_base_", "never", "undecided", "look the same in a CPU trace"),
        ("c10d::_allgather_base_", "on the backend's thread", "backend", "freed inside gloo:all_gather"),
        ("c10d::_allgather_base_", "in a node", "autograd", "freed in MmBackward0"),
    ],
)  # fmt: skip
def test_the_holder_follows_the_evidence(tmp_path, call, free, holder, says):
    events = [*forward(call), node(100), op("autograd::engine::evaluate_function: AddBackward0", 120, 10)]
    if free == "in a node":
        events.append(mem(105, 0xA000, -FULL))
    elif free == "outside nodes":
        events.append(mem(115, 0xA000, -FULL))
    elif free == "after backward":
        events.append(mem(200, 0xA000, -FULL))
    elif free == "reused":
        events += [mem(150, 0xA000, FULL)]  # allocated again: the first one's free was never recorded
    elif free == "on the backend's thread":
        events += [{"ph": "X", "cat": "user_annotation", "name": "gloo:all_gather", "pid": 1, "tid": 9, "ts": 110,
                    "dur": 10}, mem(112, 0xA000, -FULL, tid=9)]  # fmt: skip
    r = detect_retained(_trace(tmp_path, events), element_size=4)
    rows = r.tensors[r.tensors["storage_ptr"] == 0xA000]
    assert len(rows) == 1
    row = rows.iloc[0]
    assert row["holder"] == holder and says in row["evidence"], row["evidence"]
    assert row["collective"] == call


@pytest.mark.parametrize("who, holder, says", [("alive", "model", "the model kept it"),
                                               ("backend", "backend", "release it (the census)"),
                                               (None, "undecided", "look the same")])  # fmt: skip
def test_the_census_decides_a_buffer_a_collective_filled(tmp_path, who, holder, says):
    """A buffer c10d::_allgather_base_ filled, whose free the trace does not show: the census
    sptrace.instrument writes when the backward ends says who released it."""
    events = [*forward("c10d::_allgather_base_"), node(100)]
    if who is not None:
        census = markers.ReleasedCensus([(0xB000, 64, "backend"), (0xA000, FULL, who)])
        events.append({"ph": "X", "cat": "user_annotation", "name": census.to_marker(), "pid": 1, "tid": 1,
                       "ts": 111, "dur": 0})  # fmt: skip
    r = detect_retained(_trace(tmp_path, events), element_size=4)
    assert r.has_census is (who is not None)
    row = r.tensors[r.tensors["storage_ptr"] == 0xA000].iloc[0]
    assert row["holder"] == holder and says in row["evidence"], row["evidence"]


def test_a_census_marker_round_trips_and_a_broken_one_is_no_census():
    census = markers.ReleasedCensus([(0x7F00, 4096, "alive"), (0x8000, 8, "backend")])
    back = markers.ReleasedCensus.from_marker(census.to_marker())
    assert back == census and back.who(0x7F00) == "alive" and back.who(0x1) is None
    assert markers.ReleasedCensus.from_marker(markers.RELEASED + "7f00:4096:somebody") is None
    assert markers.ReleasedCensus.from_marker(markers.RELEASED + "zz:1:alive") is None
