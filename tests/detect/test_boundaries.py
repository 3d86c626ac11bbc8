"""Every forward -> backward boundary of a trace, on small hand-written traces whose truth is
written into them: which forward each backward consumes (in order), where each forward's window
ends, and which allocations each boundary keeps. The 8-rank user models
(tests/user_models/test_user_sharding.py) check the same on real gradient accumulation and a
two-step profiler schedule."""

from __future__ import annotations

import json

import sptrace
from sptrace.detect.allocations import detect_retained
from sptrace.detect.boundaries import find_boundaries
from sptrace.detect.index import RankIndex
from sptrace.vocab import markers


def _trace(tmp_path, events):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return sptrace.load_trace(path, cache=False)


def phase(name, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": markers.phase_name(name), "pid": 1, "tid": 1, "ts": ts,
            "dur": dur}  # fmt: skip


def op(ts, seq=None, name="aten::mm", dur=4):
    args = {} if seq is None else {"Sequence number": seq}
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def node(ts, seq, dur=5):
    return {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0", "pid": 1,
            "tid": 1, "ts": ts, "dur": dur, "args": {"Sequence number": seq}}  # fmt: skip


def memory(ts, addr, nbytes, total):
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "s": "t",
        "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": total, "Device Type": 0, "Device Id": -1},
    }


def alloc(ts, free_ts, addr, nbytes=4096):
    return [memory(ts, addr, nbytes, nbytes), memory(free_ts, addr, -nbytes, 0)]


def kept(retention):
    return sorted(
        (int(a) // 1000, mb) for a, mb in zip(retention.tensors["alloc_ns"], retention.tensors["micro_batch"])
    )


def test_one_f_one_b_pairs_backwards_with_forwards_in_order(tmp_path):
    """Markers, a pipeline's order f0 f1 b0 f2 b1: b0 consumes f0 and b1 f1. f1's window ends where
    f2 starts; what b0 allocates inside f1's window (a gradient) is not f1's."""
    events = [phase("forward", 0, 50), phase("forward", 100, 50), phase("backward", 200, 100),
              phase("forward", 350, 30), phase("backward", 400, 100)]  # fmt: skip
    events += alloc(10, 250, 0x100)  # f0's activation, freed in b0
    events += alloc(110, 450, 0x200)  # f1's activation, freed in b1
    events += alloc(210, 900, 0x300)  # allocated in b0, alive to the end: a gradient, no activation
    events += alloc(360, 370, 0x400)  # f2's temporary, dead before any backward
    trace = _trace(tmp_path, events)
    bounds = find_boundaries(RankIndex(trace), 0)
    assert [(b.forward_ns, b.window_end_ns, b.backward_ns, b.micro_batch) for b in bounds] == [
        (0, 100_000, 200_000, 0),
        (100_000, 350_000, 400_000, 1),
    ]
    assert kept(detect_retained(trace)) == [(10, 0), (110, 1)]


def test_accumulation_without_markers_follows_autograds_sequence_numbers(tmp_path):
    """No markers: f0 b0 f1 b1, told apart by forward ops between the backward nodes; each
    backward's nodes carry the Sequence numbers of the forward ops that made them."""
    events = [op(10, seq=1), op(20, seq=2), node(100, seq=2), node(110, seq=1),
              op(200, seq=3), op(210, seq=4), node(300, seq=4), node(310, seq=3)]  # fmt: skip
    events += alloc(12, 105, 0x100)  # micro-batch 0's, freed in its backward
    events += alloc(150, 305, 0x200)  # after b0, before f1's first linked op: micro-batch 1's
    events += alloc(212, 900, 0x300)  # micro-batch 1's, kept past the trace's end
    trace = _trace(tmp_path, events)
    bounds = find_boundaries(RankIndex(trace), 10_000)
    assert [(b.forward_ns, b.backward_ns, b.backward_end_ns, b.micro_batch) for b in bounds] == [
        (10_000, 100_000, 115_000, 0),
        (115_000, 300_000, 315_000, 1),
    ]
    r = detect_retained(trace)
    assert kept(r) == [(12, 0), (150, 1), (212, 1)]
    assert set(r.tensors["boundary"]) == {"micro-batch 0", "micro-batch 1"}


def test_an_old_trace_s_unwrapped_autograd_nodes_are_its_backward(tmp_path):
    """torch <= 1.9 records each autograd node under its own name (``MmBackward``, category
    ``Operator``, on the engine's thread), with no ``evaluate_function`` range around it: the
    same accumulation as above reads the same, and work inside a node is backward."""
    events = [op(10, seq=1), op(20, seq=2), node(100, seq=2), node(110, seq=1),
              op(200, seq=3), op(210, seq=4), node(300, seq=4), node(310, seq=3)]  # fmt: skip
    for e in events:
        e["cat"] = "Operator"
        if e["name"].startswith("autograd::engine::evaluate_function: "):
            e["name"], e["tid"] = "MmBackward", 2
            e["args"]["Fwd thread id"] = 1
    events += alloc(12, 105, 0x100) + alloc(150, 305, 0x200) + alloc(212, 900, 0x300)
    trace = _trace(tmp_path, events)
    idx = RankIndex(trace)
    assert len(idx.backward_nodes) == 4
    assert [(b.forward_ns, b.backward_ns, b.backward_end_ns, b.micro_batch) for b in find_boundaries(idx, 10_000)] == [
        (10_000, 100_000, 115_000, 0),
        (115_000, 300_000, 315_000, 1),
    ]
    assert kept(detect_retained(trace)) == [(12, 0), (150, 1), (212, 1)]
    assert idx.phase_of(101_000, 102_000, 2) == "backward" and idx.phase_of(11_000, 12_000, 1) == "forward"


def test_profiler_steps_name_the_step_and_restart_the_micro_batches(tmp_path):
    events = []
    for step, t0 in ((3, 0), (4, 1000)):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": t0, "dur": 900})  # fmt: skip
        events += [op(t0 + 10, seq=10 * step), node(t0 + 100, seq=10 * step)]
        events += alloc(t0 + 12, t0 + 102, 0x100 + step)
    trace = _trace(tmp_path, events)
    bounds = find_boundaries(RankIndex(trace), 0)
    assert [(b.step, b.micro_batch, b.forward_ns) for b in bounds] == [(3, 0, 0), (4, 0, 1_000_000)]
    r = detect_retained(trace)
    assert sorted(zip(r.tensors["step"], r.tensors["boundary"])) == [(3, "step 3"), (4, "step 4")]


def test_a_backward_whose_forward_ran_before_the_window_is_not_a_boundary(tmp_path):
    events = [phase("backward", 10, 20), phase("forward", 100, 20), phase("backward", 200, 20)]
    assert [(b.forward_ns, b.backward_ns) for b in find_boundaries(RankIndex(_trace(tmp_path, events)), 0)] == [
        (100_000, 200_000)
    ]


def test_accumulation_with_the_backwards_back_to_back(tmp_path):
    """No markers: f0 f1 b0 b1 (both losses kept, then backward in turn). No forward op separates
    b0 from b1; each visits its own forward's ops from the last to the first, so b1 starts at the
    node linked to a later forward op than any b0 visited."""
    events = [op(10, seq=1), op(20, seq=2), op(110, seq=3), op(120, seq=4),
              node(200, seq=2), node(210, seq=1), node(220, seq=4), node(230, seq=3)]  # fmt: skip
    events += alloc(12, 215, 0x100)  # micro-batch 0's, freed in b0
    events += alloc(112, 235, 0x200)  # micro-batch 1's, freed in b1
    trace = _trace(tmp_path, events)
    bounds = find_boundaries(RankIndex(trace), 10_000)
    assert [(b.backward_ns, b.backward_end_ns, b.micro_batch) for b in bounds] == [
        (200_000, 215_000, 0),
        (220_000, 235_000, 1),
    ]
    r = detect_retained(trace)
    assert kept(r) == [(12, 0), (112, 1)]
