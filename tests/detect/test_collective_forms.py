"""GIVEN small hand-written traces of the forms real jobs write (NCCL >= 2.27 launching through the
driver, CUDA-graph replays, ac2g flows, functional collectives, several process groups, gloo
worker annotations without their c10d op)
WHEN collectives are detected
THEN each collective is one row with its true bytes, group and transfer time, and what cannot
be known is null with a reason."""

from __future__ import annotations

import json
import math

import pytest

import sptrace
from sptrace.detect import detect_collectives


def _trace(tmp_path, events, name="rank0.json", **top):
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events, **top}))
    return sptrace.load_trace(path, cache=False)


def op(name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kernel(name, ts, dur, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"stream": 7, "device": 0, **args}}  # fmt: skip


def runtime(name, ts, corr, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2, "args": {"correlation": corr}}


RPC_AG = {"Collective name": "_allgather_base", "dtype": "BFloat16", "In msg nelems": 1024, "Out msg nelems": 8192,
          "Group size": 8, "Process Group Name": "3", "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}  # fmt: skip


def test_nccl_227_driver_launch_is_one_collective(tmp_path):
    # NCCL >= 2.27 launches through cuLaunchKernelEx (category cuda_driver)
    events = [
        op("c10d::_allgather_base_", 100, 50),
        op("record_param_comms", 105, 40, **RPC_AG),
        runtime("cuLaunchKernelEx", 120, 77, cat="cuda_driver"),
        kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", 200, 900, correlation=77),
    ]
    frame = detect_collectives(_trace(tmp_path, events))
    assert len(frame) == 1  # not also a "kernel only" collective
    row = frame.iloc[0]
    assert (row["kind"], row["in_bytes"], row["out_bytes"], row["group_size"]) == ("all_gather", 2048, 16384, 8)
    assert (row["start_us"], row["dur_us"]) == (100.0, 50.0)  # the issue, on the CPU
    assert (row["transfer_start_us"], row["transfer_dur_us"]) == (200.0, 900.0)  # the transfer, on the GPU


AR_ARGS = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 256, "Out msg nelems": 256,
           "Group size": 2}  # fmt: skip


def test_ac2g_flow_and_external_id_link_kernels(tmp_path):
    flow = [
        {"ph": "s", "cat": "ac2g", "name": "launch", "id": 5, "pid": 1, "tid": 1, "ts": 110},
        {"ph": "f", "cat": "ac2g", "name": "launch", "id": 5, "pid": 0, "tid": 7, "ts": 300, "bp": "e"},
    ]
    events = [
        op("c10d::allreduce_", 100, 50, **{"Input Dims": [[[256]]], "Input type": ["TensorList"]}),
        op("record_param_comms", 102, 40, **AR_ARGS),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300, 50),  # no correlation: the flow links it
        op("c10d::broadcast_", 500, 20, **{"External id": 42}),
        kernel("ncclDevKernel_Broadcast_RING_LL", 600, 10, **{"External id": 42}),  # linked by External id
        *flow,
    ]
    frame = detect_collectives(_trace(tmp_path, events))
    assert frame["kind"].tolist() == ["all_reduce", "broadcast"]
    assert frame["transfer_start_us"].tolist() == [300.0, 600.0]


def test_cuda_graph_replay_kernels_are_their_own_rows(tmp_path):
    # a replayed graph launches its NCCL kernels with one cudaGraphLaunch, inside no collective op
    events = [
        op("CUDAGraph::replay", 100, 30),
        runtime("cudaGraphLaunch", 105, 9),
        kernel("ncclDevKernel_AllGather_RING_LL", 200, 40, correlation=9),
        kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 260, 40, correlation=9),
    ]
    frame = detect_collectives(_trace(tmp_path, events))
    assert frame["kind"].tolist() == ["all_gather", "reduce_scatter"]
    assert frame["source"].str.startswith("kernel only").all()
    assert frame["in_bytes"].isna().all() and frame["unknown"].str.contains("in bytes").all()


def test_functional_collectives_read_their_group_size(tmp_path):
    functional = {"Input Dims": [[4, 6], [], []], "Input type": ["float", "Scalar", ""],
                  "Concrete Inputs": ["", "4", ""]}  # fmt: skip
    scatter = {"Input Dims": [[8, 6], [], [], []], "Input type": ["float", "", "Scalar", ""],
               "Concrete Inputs": ["", "", "4", ""]}  # fmt: skip
    a2a = {"Input Dims": [[10, 3], [], [], []], "Input type": ["float", "ScalarList", "ScalarList", ""],
           "Concrete Inputs": ["", "[2, 2, 2, 2]", "[1, 2, 3, 4]", ""]}  # fmt: skip
    events = [
        op("_c10d_functional::all_gather_into_tensor", 100, 10, **functional),
        op("_c10d_functional::reduce_scatter_tensor", 200, 10, **scatter),
        op("_c10d_functional::all_to_all_single", 300, 10, **a2a),
        op("_c10d_functional::wait_tensor", 400, 10, **{"Input Dims": [[16, 6]], "Input type": ["float"]}),
    ]
    frame = detect_collectives(_trace(tmp_path, events))
    assert frame["kind"].tolist() == ["all_gather", "reduce_scatter", "all_to_all"]  # a wait is not one
    assert frame["in_bytes"].tolist() == [96, 192, 120]
    assert frame["out_bytes"].tolist() == [384, 48, 96]  # 8 rows of 3 received, from the split sizes
    assert frame["group_size"].tolist() == [4, 4, 4]


DP_AG = {**RPC_AG, "Process Group Name": "5", "Group size": 2, "Process Group Ranks": "[0, 8]"}


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


DP_AG = {**RPC_AG, "Process Group Name": "5", "Group size": 2, "Process Group Ranks": "[0, 8]"}


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def test_group_from_the_data_never_the_world(tmp_path):
    info = {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 16, "pg_config": [
        {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 16, "ranks": list(range(16))},
        {"pg_name": "3", "pg_desc": "tp", "pg_size": 8, "ranks": list(range(8))},
        {"pg_name": "5", "pg_desc": "dp", "pg_size": 2, "ranks": [0, 8]},
    ]}}  # fmt: skip
    base = {"Input type": ["float", "float"]}
    events = [
        op("c10d::_allgather_base_", 100, 10, **{**base, "Input Dims": [[64, 4], [8, 4]]}),  # out, in: ratio 8
        op("c10d::allreduce_", 200, 10, **{"Input Dims": [[[32]]], "Input type": ["TensorList"]}),
        op("c10d::_allgather_base_", 300, 10),
        op("record_param_comms", 301, 5, **DP_AG),
    ]
    frame = detect_collectives(_trace(tmp_path, events, **info))
    ratio, unknown, named = frame.to_dict(orient="records")
    assert ratio["group_size"] == 8 and "out/in ratio" in ratio["source"]
    # rank 0 is in three groups: an all-reduce that names none has no known group size
    assert _missing(unknown["group_size"]) and _missing(unknown["wire_bytes"]) and "group size" in unknown["unknown"]
    assert (named["group"], named["group_size"], named["group_ranks"]) == ("5", 2, [0, 8])


def test_gloo_annotations_without_their_op_are_collectives(tmp_path):
    # a trace that starts after the c10d ops were issued holds only the worker's annotations
    events = [{"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 9, "ts": 10,
               "dur": 30, "args": {"Input Dims": [[321271]], "Input type": ["float"]}}]  # fmt: skip
    frame = detect_collectives(_trace(tmp_path, events))
    (row,) = frame.to_dict(orient="records")
    assert row["kind"] == "all_reduce" and row["in_bytes"] == 321271 * 4 and row["dtype"] == "float32"
    assert row["source"].startswith("gloo annotation only") and row["transfer_dur_us"] == 30.0


@pytest.mark.parametrize(
    "spelling, canonical, size",
    [("float", "float32", 4), ("c10::BFloat16", "bfloat16", 2), ("Float", "float32", 4), ("long int", "int64", 8)],
)
def test_one_dtype_table(spelling, canonical, size):
    from sptrace.vocab import dtypes

    assert dtypes.canonical(spelling) == canonical and dtypes.element_size(spelling) == size
    assert dtypes.canonical("TensorList") is None and dtypes.element_size("Scalar") is None
