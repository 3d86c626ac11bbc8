"""Small hand-written traces for what retention, attribution and timing must get right:
records without a storage pointer, layers only inside layer containers, transfer time and
exposed communication."""

from __future__ import annotations

import json

import pytest

import sptrace
from sptrace.detect.allocations import detect_retained
from sptrace.detect.collectives import detect_collectives
from sptrace.detect.index import RankIndex
from sptrace.detect.layers import layer_of
from sptrace.detect.timing import detect_timing
from sptrace.vocab import markers


def _trace(tmp_path, events, name="rank0.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return sptrace.load_trace(path, cache=False)


def record(ts, module, shape, ptr):
    rec = markers.SavedTensor(module=module, shape=shape, dtype="float32", nbytes=4 * shape[0] * shape[1],
                              storage_ptr=ptr, storage_nbytes=4 * shape[0] * shape[1], kind="activation")  # fmt: skip
    return {"ph": "X", "cat": "user_annotation", "name": rec.to_marker(), "pid": 1, "tid": 1, "ts": ts, "dur": 1}


def node(ts, name="MmBackward0"):
    return {"ph": "X", "cat": "cpu_op", "name": f"autograd::engine::evaluate_function: {name}", "pid": 1,
            "tid": 2, "ts": ts, "dur": 5}  # fmt: skip


def test_records_without_a_storage_pointer_are_all_kept(tmp_path):
    # tensors without storage (a subclass, a fake tensor) are recorded with ptr 0: each is its own
    events = [record(10 + i, f"layers.{i}.fc", (16, 8), 0) for i in range(3)]
    events += [record(20, "layers.0.fc", (16, 8), 0x1000), record(21, "layers.0.fc2", (16, 8), 0x1000), node(100)]
    retained = detect_retained(_trace(tmp_path, events), element_size=4).tensors
    assert len(retained) == 4  # three without a pointer, and one storage saved twice counted once
    assert sorted(retained["layer"]) == [0, 0, 1, 2]


def test_a_window_without_backward_keeps_nothing_it_can_tell(tmp_path):
    events = [record(10, "layers.0.fc", (16, 8), 0x10)]
    r = detect_retained(_trace(tmp_path, events), element_size=4)
    assert r.boundary_ns is None and r.tensors.empty and r.has_records


@pytest.mark.parametrize(
    "module, layer",
    [("layers.3.mlp.fc1", 3), ("model.decoder.layers.12.self_attn", 12), ("transformer.h.7.attn", 7),
     ("blocks.0", 0), ("norm", None), ("LayerNorm_1", None), ("layers", None), ("encoder.layers.2", 2)],
)  # fmt: skip
def test_a_layer_only_inside_a_layer_container(module, layer):
    assert layer_of(module) == layer


def _frame(pid, parent, name, ts, dur, tid=1):
    return {"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Python id": pid, "Python parent id": parent}}  # fmt: skip


def test_python_stack_layers(tmp_path):
    # Model_0 runs LayerNorm_0, then two MegaMlp layers (composite, called from the same parent),
    # each with its own LayerNorm; and a final LayerNorm_2 that is not a layer
    events = [
        _frame(1, 0, "nn.Module: Model_0", 0, 100),
        _frame(2, 1, "nn.Module: LayerNorm_0", 1, 2),
        _frame(3, 1, "nn.Module: MegaMlp_0", 10, 30),
        _frame(4, 3, "nn.Module: LayerNorm_1", 11, 2),
        _frame(5, 1, "nn.Module: MegaMlp_1", 50, 30),
        _frame(6, 5, "nn.Module: LayerNorm_3", 51, 2),
        _frame(7, 1, "nn.Module: LayerNorm_2", 90, 2),
    ]
    idx = RankIndex(_trace(tmp_path, events))
    assert idx.layer_frames == {"nn.Module: MegaMlp_0": 0, "nn.Module: MegaMlp_1": 1}
    us = 1000  # the index speaks nanoseconds
    assert idx.python_module(11 * us, 12 * us, 1) == "layers.0.LayerNorm_1"
    assert idx.python_module(55 * us, 56 * us, 1) == "layers.1"
    assert idx.python_module(90 * us, 91 * us, 1) == "LayerNorm_2"  # LayerNorm_2 is no layer 2
    assert idx.python_module(1 * us, 2 * us, 1) == "LayerNorm_0"


def test_an_mlp_sequential_inside_a_block_is_not_the_layer_container(tmp_path):
    # GIVEN two blocks of a user's ring model (RingBlock_0/1: no *Layer or *Block class rule
    # needed, composite siblings of one parent), each with an nn.Sequential MLP of Linear, GELU,
    # Linear inside (Linear_3 and Linear_7 are the Sequentials' children)
    events = [
        _frame(1, 0, "nn.Module: Model_0", 0, 200),
        _frame(2, 1, "nn.Module: Ring_0", 10, 80),
        _frame(3, 2, "nn.Module: Linear_0", 11, 2),
        _frame(4, 2, "nn.Module: Sequential_0", 20, 30),
        _frame(5, 4, "nn.Module: Linear_1", 21, 2),
        _frame(6, 4, "nn.Module: GELU_0", 24, 2),
        _frame(7, 4, "nn.Module: Linear_3", 27, 2),
        _frame(8, 1, "nn.Module: Ring_1", 110, 80),
        _frame(9, 8, "nn.Module: Linear_4", 111, 2),
        _frame(10, 8, "nn.Module: Sequential_1", 120, 30),
        _frame(11, 10, "nn.Module: Linear_5", 121, 2),
        _frame(12, 10, "nn.Module: GELU_1", 124, 2),
        _frame(13, 10, "nn.Module: Linear_7", 127, 2),
    ]
    idx = RankIndex(_trace(tmp_path, events))
    # THEN the blocks are the layers, and an MLP's Linear inside one is that layer's
    assert idx.python_layers() == {0, 1}
    us = 1000
    assert idx.python_module(127 * us, 128 * us, 1) == "layers.1.Linear_7"
    assert idx.python_module(21 * us, 22 * us, 1) == "layers.0.Linear_1"


def test_transfer_time_and_exposed_communication(tmp_path):
    # a 100 us step; an NCCL all-reduce kernel of 40 us, half of it under a compute kernel
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 10, "dur": 2,
         "args": {"Input Dims": [[[256]]], "Input type": ["TensorList"]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 11, "dur": 1,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 7,
         "ts": 40, "dur": 40, "args": {"correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm_bf16", "pid": 0, "tid": 8, "ts": 20, "dur": 40,
         "args": {"correlation": 4}},
    ]  # fmt: skip
    trace = _trace(tmp_path, events)
    frame = detect_collectives(trace)
    t = detect_timing(trace, frame)
    assert t.step_ms == pytest.approx(0.1) and t.comm_ms == pytest.approx(0.04)  # the kernel, not the 2 us call
    assert t.exposed_ms == pytest.approx(0.02) and t.issue_only == 0
    cpu_only = detect_timing(trace, frame.assign(transfer_start_us=None, transfer_dur_us=None))
    assert cpu_only.comm_ms == pytest.approx(0.002) and cpu_only.issue_only == 1


def _mem(ts, addr, nbytes, total, device_type=1):
    args = {"Addr": addr, "Bytes": nbytes, "Device Type": device_type, "Device Id": 0 if device_type else -1}
    if total is not None:
        args["Total Allocated"] = total
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts, "s": "t",
            "args": args}  # fmt: skip


@pytest.mark.parametrize(
    "case, holder",
    [("quiet", "model"), ("unrecorded free before backward", "undecided"),
     ("unrecorded free after backward", "backend"), ("no event after the boundary", "undecided"),
     ("no Total Allocated", "undecided"), ("quiet, on CPU", "undecided")],
)  # fmt: skip
def test_a_collective_output_whose_free_is_not_in_the_trace(tmp_path, case, holder):
    """NCCL and gloo may free a collective's output on a thread the profiler does not record. On
    CUDA the caching allocator's Total Allocated counts every thread: a count that shows no
    unrecorded free through the end of the trace means something of the step still holds it (the
    model); one quiet up to the boundary and moving after it means the backend released it after
    the boundary. Where the count says nothing (it moved before the boundary, is missing, or is a
    CPU count, which sees only recorded threads), the output a call returned has no holder the trace
    can show: the backend's dropped reference and one the model kept look the same."""
    total = None if case == "no Total Allocated" else 1000
    device_type = 0 if case == "quiet, on CPU" else 1
    gather = {"ph": "X", "cat": "cpu_op", "name": "_c10d_functional::all_gather_into_tensor", "pid": 1, "tid": 1,
              "ts": 10, "dur": 5, "args": {"Input Dims": [[4, 16]], "Input type": ["float"]}}  # fmt: skip
    events = [gather, _mem(12, 0xA000, 256, total and total + 256, device_type)]
    after = total and total + 256
    if case == "unrecorded free before backward":
        events.append(_mem(50, 0xB000, 64, after + 64 - 256, device_type))  # the count fell by 256 more than recorded
        after = after + 64 - 256
    events.append(node(100))
    if case == "unrecorded free after backward":
        events.append(_mem(110, 0xB000, 64, after + 64, device_type))
        after += 64
        events.append(_mem(130, 0xC000, 64, after + 64 - 256, device_type))
    elif case != "no event after the boundary":
        events.append(_mem(120, 0xC000, 64, after and after + 64, device_type))
    r = detect_retained(_trace(tmp_path, events), element_size=4)
    gathered = r.tensors[r.tensors["storage_ptr"] == 0xA000]
    assert len(gathered) == 1
    row = gathered.iloc[0]
    assert row["holder"] == holder, row["evidence"]
    assert row["producer"] == "_c10d_functional::all_gather_into_tensor"
    assert row["collective"] == "_c10d_functional::all_gather_into_tensor"  # the tensor the call returned
    assert {"model": "never freed", "backend": "released after it", "undecided": "look the same"}[holder] in row[
        "evidence"]  # fmt: skip


def test_step_time_from_the_best_source_the_trace_has(tmp_path):
    # GIVEN a step without ProfilerStep# (a DeepSpeed-style trace): 1 ms of data loading, the
    # forward (autograd-numbered ops), the backward, the optimizer, then 3 ms of logging
    def op(name, ts, dur, tid=1, **args):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [
        op("aten::copy_", 0, 1000),  # the data loader's copy: no autograd number
        op("aten::mm", 2000, 300, **{"Sequence number": 7}),
        op("aten::gelu", 2400, 100, **{"Sequence number": 8}),
        {**node(3000, "GeluBackward0"), "dur": 200},
        {**node(3300, "MmBackward0"), "dur": 400},
        {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1,
         "ts": 3800, "dur": 200},
        op("aten::item", 7000, 3000),  # logging
    ]  # fmt: skip
    trace = _trace(tmp_path, events)
    t = detect_timing(trace, detect_collectives(trace))
    # the training work: the first numbered forward op to the optimizer's end, 2000 -> 4000 us
    assert t.step_ms == pytest.approx(2.0) and t.step_source.startswith("first autograd op")
    # sptrace's phase markers, where present, measure it instead
    phases = [{"ph": "X", "cat": "user_annotation", "name": f"{markers.PHASE}{p}", "pid": 1, "tid": 1, "ts": ts,
               "dur": dur} for p, ts, dur in (("forward", 1900, 700), ("backward", 2990, 800))]  # fmt: skip
    trace = _trace(tmp_path, events + phases, "rank1.json")
    t = detect_timing(trace, detect_collectives(trace))
    assert t.step_ms == pytest.approx(1.89) and t.step_source == "sptrace.phase markers"
    # and the profiler's own step marker before anything else
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 1500, "dur": 5000}
    trace = _trace(tmp_path, events + phases + [step], "rank2.json")
    t = detect_timing(trace, detect_collectives(trace))
    assert t.step_ms == pytest.approx(5.0) and t.step_source == "ProfilerStep#"
    # nothing to go by: the trace's span, and it says so
    trace = _trace(tmp_path, [op("aten::copy_", 0, 1000), op("aten::item", 7000, 3000)], "rank3.json")
    t = detect_timing(trace, detect_collectives(trace))
    assert t.step_ms == pytest.approx(10.0) and t.step_source == "the trace's span"
