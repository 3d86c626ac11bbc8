"""GIVEN real NCCL traces (../shared/corpus) and small hand-made ones
WHEN collectives are detected and matched across ranks
THEN kinds, bytes, groups and phases are the ones read by hand from the raw events."""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest

import sptrace
from sptrace.cli import main
from sptrace.detect import COLUMNS, detect_collectives
from sptrace.reduce.matching import match_collectives
from sptrace.reduce.peers import detect_run_collectives


@pytest.fixture(scope="module")
def dlrm(corpus, private_cache):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = sptrace.load_run(corpus / "param_dlrm_kineto", cache_dir=private_cache)
    return run, detect_run_collectives(run)


def test_dlrm_kinds_and_bytes(dlrm):
    run, frame = dlrm
    assert list(frame.columns) == COLUMNS
    for rank in range(8):
        mine = frame[frame["rank"] == rank]
        assert mine["kind"].value_counts().to_dict() == {"all_to_all": 5, "all_reduce": 3}
        # older record_param_comms without args: sizes from the c10d op's Input Dims (alltoall_base_:
        # output then input) and, for the TensorList all-reduces, from the nccl:all_reduce annotation
        # the trace names no process group (no pg_config, no record args): its size stays unknown,
        # never assumed to be the world's, and so do the wire bytes that depend on it
        assert mine["group_size"].isna().all() and mine["wire_bytes"].isna().all()
        assert mine["unknown"].str.contains("group size").all()
        assert mine["transfer_dur_us"].notna().all()  # each linked to its NCCL kernel by correlation
        raw = json.loads(run.ranks[rank].path.read_text())["traceEvents"]
        a2a = sorted((e for e in raw if e.get("name") == "c10d::alltoall_base_"), key=lambda e: e["ts"])
        sizes = {"float": 4, "long int": 8, "int": 4}
        assert mine[mine["kind"] == "all_to_all"]["in_bytes"].tolist() == [
            e["args"]["Input Dims"][1][0] * sizes[e["args"]["Input type"][1]] for e in a2a
        ]
    r0 = frame[frame["rank"] == 0]
    first_a2a = r0[r0["kind"] == "all_to_all"].iloc[0]
    assert first_a2a["in_bytes"] == 6144 * 4 and first_a2a["out_bytes"] == 6144 * 4
    first_ar = r0[r0["kind"] == "all_reduce"].iloc[0]
    assert first_ar["in_bytes"] == 394241 * 4 and first_ar["dtype"] == "float32"
    assert "bytes: nccl annotation Input Dims" in first_ar["source"]
    assert set(r0[r0["kind"] == "all_reduce"]["phase"]) == {"backward"}


def test_dlrm_cross_rank_matching(dlrm):
    _, frame = dlrm
    m = match_collectives(frame)
    assert len(m.matched) == 8 and (m.matched["n_ranks"] == 8).all() and m.unmatched == 0
    assert sorted(m.offsets_us) == list(range(8)) and m.offsets_us[0] == 0
    assert m.matched["straggler"].between(0, 7).all()
    # the trace names no group: busbw, which needs the group's size, is unknown, never the count
    # of ranks that matched
    ar = m.matched[m.matched["kind"] == "all_reduce"].iloc[0]
    assert pd.isna(ar["busbw_gbps"]) and ar["algbw_gbps"] > 0
    # unless every rank of the world matched it: a group holds no more ranks than the world
    ar = match_collectives(frame, world_size=8).matched.query("kind == 'all_reduce'").iloc[0]
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * 7 / 8)


def test_partial_trace_is_realigned(dlrm):
    _, frame = dlrm
    # rank 3's trace starts late: its first two collectives are missing
    r3 = frame[frame["rank"] == 3].sort_values("start_us").index[:2]
    m = match_collectives(frame.drop(index=r3))
    assert m.unmatched == 0
    assert any("rank 3's collectives realigned by +2" in n for n in m.notes)
    assert sorted(m.matched["n_ranks"].tolist()) == [7, 7] + [8] * 6


def test_nccl_record_param_comms_args(corpus):
    trace = sptrace.load_trace(corpus / "hta_tests_data/nccl_parser_config/nccl_data.json.gz", cache=False)
    frame = detect_collectives(trace)
    assert frame["kind"].value_counts().to_dict() == {"all_reduce": 15, "broadcast": 6}  # 6 'wait' records skipped
    raw = json.loads(__import__("gzip").open(trace.path).read())["traceEvents"]
    expected = sorted(
        e["args"]["In msg nelems"] * {"Float": 4, "Long": 8}[e["args"]["dtype"]]
        for e in raw
        if e.get("name") == "record_param_comms" and e["args"]["Collective name"] != "wait"
    )
    assert sorted(frame["in_bytes"]) == expected
    assert (frame["group"] == "0").all() and (frame["group_size"] == 2).all()
    assert all(r == [0, 1] for r in frame["group_ranks"])
    assert set(frame["step"]) == {4, 5, 6}
    assert set(frame[frame["kind"] == "all_reduce"]["phase"]) == {"backward"}  # DDP's bucketed all-reduce
    assert frame["source"].str.startswith("bytes: record_param_comms args").all()
    # each linked to its kernel (launch correlation): ncclKernel_AllReduce ... 2636.669 us in step 6
    assert frame["transfer_dur_us"].notna().all()
    assert frame[frame["kind"] == "all_reduce"]["transfer_dur_us"].round(3).isin([2636.669]).any()
    # one row per collective: the kernels are not counted again as kernel-only collectives
    assert not frame["source"].str.contains("kernel only").any()


def _write(tmp_path, events, name="rank0.json", **top):
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events, **top}))
    return path


def test_kernel_only_collectives_and_rccl_generic(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", "pid": 0, "tid": 7,
         "ts": 100, "dur": 10, "args": {"stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_Generic(ncclDevComm*)", "pid": 0, "tid": 7, "ts": 200,
         "dur": 5, "args": {"correlation": 2, "Collective name": "reduce_scatter", "dtype": "BFloat16",
                            "In msg nelems": 1024, "Out msg nelems": 128, "Group size": 8}},
    ]  # fmt: skip
    frame = detect_collectives(sptrace.load_trace(_write(tmp_path, events), cache=False))
    assert frame["kind"].tolist() == ["all_gather", "reduce_scatter"]
    assert frame.loc[0, "in_bytes"] is None or pd.isna(frame.loc[0, "in_bytes"])
    assert "kernel only" in frame.loc[0, "source"]
    assert frame.loc[1, "in_bytes"] == 2048 and frame.loc[1, "out_bytes"] == 256 and frame.loc[1, "dtype"] == "bfloat16"
    assert frame.loc[1, "wire_bytes"] == 2048 * 7 / 8


def test_symmetric_memory_and_no_collectives(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "symm_mem::one_shot_all_reduce", "pid": 1, "tid": 1, "ts": 5,
               "dur": 3, "args": {"Input Dims": [[256]], "Input type": ["c10::BFloat16"]}}]  # fmt: skip
    frame = detect_collectives(sptrace.load_trace(_write(tmp_path, events), cache=False))
    assert frame[["kind", "in_bytes", "dtype"]].values.tolist() == [["all_reduce", 512, "bfloat16"]]
    empty = detect_collectives(
        sptrace.load_trace(
            _write(tmp_path, [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 1}], "rank1.json"), cache=False
        )
    )
    assert empty.empty and list(empty.columns) == COLUMNS
    assert match_collectives(empty).matched.empty


def test_collectives_cli_formats(corpus, capsys, tmp_path):
    path = corpus / "param_dlrm_kineto"
    assert main(["collectives", str(path), "--cache-dir", str(tmp_path), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert len(records) == 64 and set(records[0]) == {*COLUMNS, "start_ms_from_step"}
    # byte counts are integers where known, never 14336.0; times from the step start beside the absolute ones
    assert all(isinstance(r["in_bytes"], int) for r in records if r["in_bytes"] is not None)
    assert all(isinstance(r["start_ms_from_step"], float) for r in records)
    assert main(["collectives", str(path), "--cache-dir", str(tmp_path), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split(",")[:3] == ["rank", "kind", "op"] and len(lines) == 65
    assert lines[0].split(",")[-1] == "start_ms_from_step" and ".0," not in ",".join(lines[1].split(",")[8:13]) + ","
    assert main(["collectives", str(path), "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "all_to_all         5.0 per rank" in out and "(5.0 per rank of unknown size or group)" in out
    assert (
        main(["collectives", str(corpus / "kineto_tb_plugin/resnet50_num_workers_0"), "--cache-dir", str(tmp_path)])
        == 0
    )
    assert "no collectives in this run" in capsys.readouterr().out
