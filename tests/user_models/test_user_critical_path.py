"""GIVEN an 8-rank Megatron-style job written the way users write it, profiled with plain
torch.profiler, in which one rank computes an auxiliary statistic (real matmuls) inside one
layer's MLP before its all-gather
WHEN sptrace walks the critical path across the ranks
THEN the path runs through that rank's layer and the collective after it, the summary names
both, and the segments tile the step. The oracle is the job's own record of where it put the
extra work, which collective the layer issues next, and how long the work took (timed around
it), never sptrace's cost model or detector."""

from __future__ import annotations

import itertools
import json

import pytest

from sptrace.analysis import analyse_run
from sptrace.cli import main
from sptrace.detect.index import layer_of

pytestmark = pytest.mark.distributed
WORLD = 8


@pytest.fixture(scope="module")
def slow(user_runs, private_cache):
    oracle = json.loads((user_runs / "oracle" / "slow_rank" / "rank0.json").read_text())["slow"]
    analysis = analyse_run(user_runs / "slow_rank", load_options={"cache_dir": private_cache, "workers": 1})
    return oracle, analysis


def test_the_path_runs_through_the_slow_rank_s_layer_and_the_collective_after_it(slow):
    oracle, analysis = slow
    path = analysis.critical_path
    seg = path.segments
    rank, layer = oracle["rank"], oracle["layer"]
    extra = seg[(seg["rank"] == rank) & (seg["kind"] == "compute") & (seg["layer"] == layer)
                & (seg["phase"] == oracle["phase"])]  # fmt: skip
    # the extra work is on the path, whole: at least the time the job measured around it
    assert extra["dur_us"].sum() >= 0.9 * oracle["extra_us"]
    # right after the rank's longest stretch of it, the path goes through the layer's next
    # collective, where every other rank waited for this one
    longest = extra.loc[extra["dur_us"].idxmax()]
    after = seg[(seg["start_us"] > longest["start_us"]) & seg["collective"].notna()]
    first = after.iloc[0]
    assert first["collective"].startswith(oracle["next_collective"])
    assert first["rank"] == rank and first["layer"] == layer
    assert after[after["collective"] == first["collective"]]["waiting"].max() == WORLD - 1


def test_the_summary_names_the_rank_the_layer_and_the_collective(slow, capsys):
    oracle, analysis = slow
    culprit = analysis.critical_path.culprit
    assert culprit.rank == oracle["rank"] and layer_of(culprit.module) == oracle["layer"]
    assert culprit.phase == oracle["phase"]
    assert culprit.collective.startswith(oracle["next_collective"]) and culprit.waiting == WORLD - 1
    assert culprit.dur_us >= 0.9 * oracle["extra_us"]


def test_analyze_prints_it_and_its_json_tiles_the_step(slow, user_runs, private_cache, capsys):
    oracle, _ = slow
    run = str(user_runs / "slow_rank")
    main(["analyze", run, "--cache-dir", str(private_cache)])
    text = capsys.readouterr().out
    named = f"critical path: rank {oracle['rank']} layers.{oracle['layer']} {oracle['phase']}"
    assert named in text and f"made {WORLD - 1} ranks wait at {oracle['next_collective']}" in text
    main(["analyze", run, "--cache-dir", str(private_cache), "--format", "json"])
    path = json.loads(capsys.readouterr().out)["critical_path"]
    segments = path["segments"]
    assert {"rank", "kind", "module", "layer", "start_us", "dur_us"} <= set(segments[0])
    assert segments[0]["start_us"] == 0
    for a, b in itertools.pairwise(segments):  # contiguous: each starts where the one before ended
        assert b["start_us"] == pytest.approx(a["start_us"] + a["dur_us"], abs=0.01)
    assert sum(s["dur_us"] for s in segments) == pytest.approx(path["step_us"], rel=1e-6)
    assert path["culprit"]["rank"] == oracle["rank"]
