"""GIVEN an 8-rank Megatron-style job written the way users write it, profiled with plain
torch.profiler over two active steps, in each of which one rank computes an auxiliary statistic
(real matmuls) inside one layer's MLP before its all-gather: rank 5 in layer 1 in the first step,
rank 1 in layer 0 (half as much) in the second
WHEN sptrace walks the critical path across the ranks
THEN each step's path runs through that step's rank and layer and the collective after it, the
summaries name both, the path shown is the slowest step's, and its segments tile the step. The
oracle is the job's own record, per step, of where it put the extra work, which collective the
layer issues next, and how long the work took (timed around it), never sptrace's cost model or
detector."""

from __future__ import annotations

import itertools
import json

import pytest

from sptrace.analysis import analyse_run
from sptrace.cli import main
from sptrace.detect.layers import layer_of

pytestmark = pytest.mark.distributed
WORLD = 8


def step_oracle(user_runs) -> dict[str, dict]:
    """Each profiled step's slow rank, layer and next collective, with the time the slow rank
    measured around its extra work (from that rank's own record)."""
    records = [json.loads(p.read_text())["steps"] for p in (user_runs / "oracle" / "slow_rank").glob("rank*.json")]
    steps = records[0]
    for name, step in steps.items():
        step["extra_us"] = next(r[name]["extra_us"] for r in records if r[name]["extra_us"] is not None)
    return steps


@pytest.fixture(scope="module")
def slow(user_runs, private_cache):
    steps = step_oracle(user_runs)
    analysis = analyse_run(user_runs / "slow_rank", load_options={"cache_dir": private_cache, "workers": 1})
    # the path shown is one step's: the oracle of that step
    assert analysis.critical_path.step in steps
    return steps[analysis.critical_path.step], analysis


def test_each_step_s_path_names_that_step_s_rank_layer_and_collective(user_runs, slow):
    steps = step_oracle(user_runs)
    _, analysis = slow
    path = analysis.critical_path
    assert [p.step for p in path.steps] == list(steps)  # both steps, in the order they ran
    for p in path.steps:
        truth = steps[p.step]
        assert (p.culprit.rank, layer_of(p.culprit.module), p.culprit.phase) == (
            truth["rank"], truth["layer"], truth["phase"],
        )  # fmt: skip
        assert p.culprit.collective.startswith(truth["next_collective"]) and p.culprit.waiting == WORLD - 1
        assert p.culprit.dur_us >= 0.9 * truth["extra_us"]
        assert sum(p.by_kind.values()) == pytest.approx(p.step_us, rel=1e-6)
    # the path shown is the slowest step's
    assert path.step_us == max(p.step_us for p in path.steps)
    assert path.step == max(path.steps, key=lambda p: p.step_us).step


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
    oracle, analysis = slow
    run = str(user_runs / "slow_rank")
    main(["analyze", run, "--cache-dir", str(private_cache)])
    text = capsys.readouterr().out
    named = f"critical path: rank {oracle['rank']} layers.{oracle['layer']} {oracle['phase']}"
    assert named in text and f"made {WORLD - 1} ranks wait at {oracle['next_collective']}" in text
    assert f"each profiled step's path (the one above is {analysis.critical_path.step}'s" in text
    for p in analysis.critical_path.steps:
        assert f"{p.step:<20} {p.step_us / 1e3:9.3f} ms  {p.culprit.where}" in text
    main(["analyze", run, "--cache-dir", str(private_cache), "--format", "json"])
    path = json.loads(capsys.readouterr().out)["critical_path"]
    assert [s["step"] for s in path["steps"]] == [p.step for p in analysis.critical_path.steps]
    assert path["step"] == analysis.critical_path.step
    segments = path["segments"]
    assert {"rank", "kind", "module", "layer", "start_us", "dur_us"} <= set(segments[0])
    assert segments[0]["start_us"] == 0
    for a, b in itertools.pairwise(segments):  # contiguous: each starts where the one before ended
        assert b["start_us"] == pytest.approx(a["start_us"] + a["dur_us"], abs=0.01)
    assert sum(s["dur_us"] for s in segments) == pytest.approx(path["step_us"], rel=1e-6)
    assert path["culprit"]["rank"] == oracle["rank"]
