"""GIVEN real GPU traces nobody on this project wrote (../shared/corpus, read in place)
WHEN sptrace loads them
THEN the tables hold exactly the events and values in the raw JSON (counts derived by reading
the files with the standard json module, and by hand for the named events)."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pyarrow.compute as pc
import pytest

import sptrace
from sptrace.load import SCHEMA


def raw_events(path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def cats(trace):
    return trace.category_counts()


def test_every_corpus_trace_loads_with_all_its_events(corpus):
    files = sorted(p for p in corpus.rglob("*") if p.name.endswith((".json", ".json.gz")))
    assert len(files) == 13
    for path in files:
        trace = sptrace.load_trace(path, cache=False)
        assert trace.table.schema == SCHEMA
        assert trace.num_events == len(raw_events(path)), path


def test_df_index_resolver_categories_memory_and_threads(corpus, private_cache):
    trace = sptrace.load_trace(
        corpus / "hta_tests_data/df_index_resolver/df_index_resolver.json.gz", cache_dir=private_cache
    )
    assert (trace.rank, trace.world_size, trace.backend) == (1, 2, "nccl")
    assert trace.num_events == 216092
    counts = cats(trace)
    assert counts["ac2g"] == 64663 and counts["cpu_op"] == 56680 and counts["cuda_runtime"] == 42373
    assert counts["cpu_instant_event"] == 28010 and counts["kernel"] == 19370 and counts["gpu_memcpy"] == 2040
    ev = trace.events
    mem = ev[ev["name"] == "[memory]"]
    assert len(mem) == 28010 and mem["mem_addr"].notna().all() and (mem["device_type"] == 1).sum() > 0
    first = mem.sort_values(["ts_ns", "ev_idx"]).iloc[0]
    raw = min(
        (e for e in raw_events(trace.path) if e["name"] == "[memory]"), key=lambda e: (e["ts"], e["args"]["Ev Idx"])
    )
    assert first["ts_ns"] == raw["ts"] * 1000 and first["mem_bytes"] == raw["args"]["Bytes"]
    assert first["mem_addr"] == raw["args"]["Addr"] and first["mem_total_allocated"] == raw["args"]["Total Allocated"]
    assert set(ev["thread_name"].dropna().unique()) == {
        "thread 785244 (python3.8)", "thread 783658 (python3.8)", "stream 7 ", "stream 14 "
    }  # fmt: skip
    flows = ev[ev["cat"] == "ac2g"]
    assert flows["flow_id"].notna().all() and set(flows["ph"].unique()) == {"s", "f"}


def test_nccl_args_and_nanosecond_timestamps(corpus, private_cache):
    trace = sptrace.load_trace(corpus / "hta_tests_data/nccl_parser_config/nccl_data.json.gz", cache_dir=private_cache)
    ev = trace.events
    rpc = ev[ev["name"] == "record_param_comms"]
    assert len(rpc) == 27
    # the first record_param_comms in the file, read by hand:
    # ts 4458676524648.797 us, dur 189.626 us, allreduce of 2049000 Float on group '0' = [0, 1]
    first = rpc[rpc["external_id"] == 2099].iloc[0]
    assert first["ts_ns"] == 4458676524648797 and first["dur_ns"] == 189626
    assert first["coll_name"] == "allreduce" and first["coll_dtype"] == "Float"
    assert first["in_nelems"] == first["out_nelems"] == 2049000 and first["group_size"] == 2
    assert first["pg_name"] == "0" and first["pg_ranks"] == "[0, 1]" and first["pg_desc"] == "default_pg"
    assert first["in_split"] == "[]"
    kernel = ev[(ev["cat"] == "kernel") & (ev["external_id"] == 12945)].iloc[0]
    assert kernel["name"].startswith("ncclKernel_AllReduce_RING_LL_Sum_float")
    assert (kernel["ts_ns"], kernel["dur_ns"], kernel["stream"], kernel["correlation"]) == (
        4458677009853422,
        2636669,
        40,
        60047,
    )
    assert kernel["coll_name"] == "allreduce" and kernel["in_nelems"] == 6637568  # args copied onto the kernel
    assert trace.metadata["distributedInfo"]["nccl_version"] == "2.17.1"
    assert trace.metadata["baseTimeNanoseconds"] == 1711964646000000000


def test_old_schema_is_mapped_to_the_current_vocabulary(corpus, private_cache):
    trace = sptrace.load_trace(
        corpus / "kineto_tb_plugin/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz",
        cache_dir=private_cache,
    )
    counts = cats(trace)
    assert counts["cpu_op"] == 23646  # "Operator"
    assert counts["kernel"] == 8772 and counts["cuda_runtime"] == 11923  # "Kernel", "Runtime"
    assert counts["gpu_memset"] == 312 and counts["gpu_memcpy"] == 12
    assert counts["ac2g"] == 18192  # "async" flows named "launch"
    assert counts["cpu_instant_event"] == 12838  # uncategorised [memory] instants
    ev = trace.events
    kernels = ev[ev["cat"] == "kernel"]
    assert (kernels["tid"] == 7).all()  # tid "stream 7"
    assert kernels["external_id"].notna().all()  # old lower-case "external id"
    assert trace.rank == 0 and trace.rank_source == "file name"  # worker0...; no distributedInfo


def test_python_stacks_and_null_parent_ids(corpus, private_cache):
    trace = sptrace.load_trace(
        corpus / "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", cache_dir=private_cache
    )
    counts = cats(trace)
    assert counts["python_function"] == 4262 and counts["cpu_op"] == 4186 and counts["cpu_instant_event"] == 2450
    ev = trace.events
    root = ev[ev["name"] == "threading.py(1032): _bootstrap"].iloc[0]
    assert root["python_id"] == 1 and root["python_parent_id"] is pd_na()  # JSON null
    assert root["ts_ns"] == 1428625731516983 and root["dur_ns"] == 49779532
    assert trace.rank is None and trace.world_size is None


def pd_na():
    import pandas as pd

    return pd.NA


def test_dlrm_run_has_eight_ranks(corpus, private_cache):
    run = sptrace.load_run(corpus / "param_dlrm_kineto", cache_dir=private_cache)
    assert len(run) == 8 and run.world_size == 8 and run.backend == "nccl" and run.missing_ranks == []
    assert [t.rank for t in run] == list(range(8))
    assert all(t.path.name.startswith(f"worker{t.rank}_") for t in run)
    for t in run:
        raw = Counter(e.get("cat") for e in raw_events(t.path))
        assert cats(t)["cpu_op"] == raw["cpu_op"] == 1633
        assert cats(t)["kernel"] == raw["kernel"]
        names = t.table["name"].cast("string")
        assert pc.sum(pc.equal(names, "nccl:all_to_all")).as_py() == 5
        assert pc.sum(pc.equal(names, "nccl:all_reduce")).as_py() == 3


def test_cpu_only_rank_of_300(corpus, private_cache):
    run = sptrace.load_run(corpus / "hta_tests_data/cpu_only", cache_dir=private_cache)
    (trace,) = run
    assert trace.rank == 34 and run.world_size == 300 and trace.num_events == 30 and trace.backend == "gloo"
    assert len(trace.process_groups) == 11
    assert run.missing_ranks == [r for r in range(300) if r != 34]
    assert any("299 of 300 ranks have no trace" in w for w in run.warnings)


def test_cache_is_keyed_on_the_file_and_written_atomically(tmp_path, corpus, cache_dir):
    src = corpus / "param_dlrm_kineto/worker3_step_12.1694128201557.pt.trace.json"
    copy = tmp_path / "rank3.json"
    copy.write_bytes(src.read_bytes())
    first = sptrace.load_trace(copy, cache_dir=cache_dir)
    entries = list(cache_dir.glob("*.arrow"))
    assert len(entries) == 1 and not list(cache_dir.glob(".tmp-*"))
    again = sptrace.load_trace(copy, cache_dir=cache_dir)
    assert again.table.equals(first.table) and again.metadata == first.metadata
    # edit the trace: a new entry replaces the stale one
    data = json.loads(copy.read_text())
    data["traceEvents"] = data["traceEvents"][:100]
    copy.write_text(json.dumps(data))
    edited = sptrace.load_trace(copy, cache_dir=cache_dir)
    assert edited.num_events == 100
    assert len(list(cache_dir.glob("*.arrow"))) == 1
    # a damaged entry is a miss, not an error
    (entry,) = cache_dir.glob("*.arrow")
    entry.write_bytes(b"garbage")
    assert sptrace.load_trace(copy, cache_dir=cache_dir).num_events == 100
    # cache=False neither reads nor writes
    other = tmp_path / "c2"
    sptrace.load_trace(copy, cache=False, cache_dir=other)
    assert not other.exists()


def test_parallel_load_matches_serial(corpus, cache_dir):
    serial = sptrace.load_run(corpus / "param_dlrm_kineto", cache=False, workers=1)
    parallel = sptrace.load_run(corpus / "param_dlrm_kineto", cache=False, workers=2)
    cached = sptrace.load_run(corpus / "param_dlrm_kineto", cache_dir=cache_dir, workers=2)
    for r in range(8):
        assert parallel.ranks[r].table.equals(serial.ranks[r].table)
        assert cached.ranks[r].table.equals(serial.ranks[r].table)


@pytest.mark.parametrize("ts, ns", [("1428625731896.179", 1428625731896179), ("5157702714584.019", 5157702714584019),
                                    ("1623143093553659", 1623143093553659000), ("0.001", 1)])  # fmt: skip
def test_microseconds_become_exact_nanoseconds(tmp_path, ts, ns):
    path = tmp_path / "t.json"
    event = '{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": TS, "dur": 1.5}'
    path.write_text('{"traceEvents": [' + event.replace("TS", ts) + "]}")
    trace = sptrace.load_trace(path, cache=False)
    assert trace.table["ts_ns"][0].as_py() == ns and trace.table["dur_ns"][0].as_py() == 1500


def test_huge_float_timestamps_take_the_exact_text_path(tmp_path):
    # 1.7e15 us since the epoch with a fraction: a double cannot hold the nanoseconds
    path = tmp_path / "t.json"
    path.write_text(
        '{"traceEvents": [{"ph": "X", "name": "op", "pid": 1, "tid": 1, "ts": 1700000000123456.789, "dur": 2}]}'
    )
    assert sptrace.load_trace(path, cache=False).table["ts_ns"][0].as_py() == 1700000000123456789


def test_minified_trace_keeps_its_rank(tmp_path, corpus):
    # HTA finds the rank with a line-by-line regex, so a minified trace becomes rank 0
    src = corpus / "param_dlrm_kineto/worker3_step_12.1694128201557.pt.trace.json"
    minified = tmp_path / "trace.json"
    minified.write_text(json.dumps(json.loads(src.read_text()), separators=(",", ":")))
    assert "\n" not in minified.read_text()
    trace = sptrace.load_trace(minified, cache=False)
    assert (trace.rank, trace.world_size, trace.rank_source) == (3, 8, "distributedInfo")
    assert trace.num_events == 3474
