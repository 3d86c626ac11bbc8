"""The loader on traces recorded from the reference models (8 gloo ranks)."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest

import sptrace
from sptrace.cli import main
from sptrace.vocab.markers import SavedTensor
from tests.trace_helpers import read_events, saved_tensors

pytestmark = pytest.mark.distributed


def test_reference_run_loads_with_markers_and_memory(profiled, private_cache):
    path = profiled("megatron")
    run = sptrace.load_run(path, cache_dir=private_cache)
    assert len(run) == 8 and run.world_size == 8 and run.backend == "gloo" and run.missing_ranks == []
    assert run.run_info["config"]["scheme"] == "megatron"
    for trace in run:
        raw = read_events(trace.path)
        assert trace.num_events == len(raw)
        counts = trace.category_counts()
        assert counts["cpu_instant_event"] == sum(1 for e in raw if e["name"] == "[memory]")
        assert counts["python_function"] == sum(1 for e in raw if e.get("cat") == "python_function")
        ev = trace.events
        mem = ev[ev["name"] == "[memory]"]
        assert mem["mem_addr"].notna().all() and (mem["device_type"] == 0).all()
        names = ev["name"].astype(str)
        loaded = {r for n in names[names.str.startswith("sptrace.saved::")] for r in SavedTensor.all_from_marker(n)}
        assert loaded == set(saved_tensors(raw))
        c10d = ev[(ev["cat"] == "cpu_op") & names.str.startswith("c10d::")]
        assert len(c10d) == 21  # 2 layers x (4 fwd + 6 bwd) + 1 gradient all-reduce
        ag = c10d[c10d["name"] == "c10d::_allgather_base_"].iloc[0]
        assert json.loads(ag["input_dims"])[:2] == [[128, 2, 96], [16, 2, 96]]
        assert ev["fwd_thread_id"].notna().sum() > 0 and ev["seq_num"].notna().sum() > 0
        assert pc.sum(pc.is_valid(trace.table["python_parent_id"])).as_py() > 0


def test_info_on_a_reference_run(profiled, private_cache, capsys):
    path = profiled("ulysses")
    assert main(["info", str(path), "--cache-dir", str(private_cache), "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ranks"] == "0-7" and info["world_size"] == 8 and info["backend"] == "gloo"
    assert info["run_info"]["scheme"] == "ulysses"
    assert info["process_groups"] == [{"name": "0", "desc": "default_pg", "size": 8, "ranks": list(range(8))}]
    assert all(r["c10d_ops"] == 17 and r["memory_events"] > 100 for r in info["per_rank"])  # 16 all-to-all + 1
    assert info["analyses"]["retained-activation check (sptrace check)"] == "yes"
    assert info["analyses"]["GPU kernel analyses (timeline, overlap, HTA breakdowns)"].startswith("no GPU kernels")
