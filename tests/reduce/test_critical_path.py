"""The critical path across ranks on the committed reference runs (gloo, CPU) and the corpus's
8-rank DLRM (NCCL, V100): continuous from the path's start to the last rank's step end, its
segments adding up to its step time, bounded by the ranks' own steps; on GPU traces it follows
compute kernels and NCCL kernels across ranks. Where the path puts one rank's extra work is
tested on a user model whose job records it (tests/user_models/test_user_critical_path.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sptrace.analysis import analyse_run
from sptrace.reduce.critical import KINDS
from sptrace.reduce.critical_walk import critical_path

RUNS = Path(__file__).resolve().parents[1] / "golden" / "runs"
CLEAN = ("megatron", "ulysses", "hybrid", "ring", "usp", "ring-mha")


def steps_aligned(a) -> dict[int, tuple[float, float]]:
    """Each rank's step [start, end] on the aligned clock, from its timing (the step the
    profiler or the phase markers measured) and the clock offsets matching gives."""
    off = a.offsets_us
    return {t.rank: (t.step_start_us - off.get(t.rank, 0.0), t.step_start_us + t.step_ms * 1e3 - off.get(t.rank, 0.0))
            for t in a.timing}  # fmt: skip


def assert_tiles(a) -> None:
    path = a.critical_path
    seg = path.segments
    assert set(seg["kind"]) <= set(KINDS) and (seg["dur_us"] > 0).all()
    starts, ends = seg["start_us"].to_numpy(), (seg["start_us"] + seg["dur_us"]).to_numpy()
    np.testing.assert_allclose(starts[1:], ends[:-1], atol=1e-3)  # no gap, no overlap
    assert starts[0] == pytest.approx(path.start_us) and seg["dur_us"].sum() == pytest.approx(path.step_us, rel=1e-9)
    steps = steps_aligned(a)
    # it ends where the last rank's step ends, and starts where some rank's step starts
    assert ends[-1] == pytest.approx(max(e for _, e in steps.values()), abs=1e-3)
    assert min(abs(path.start_us - s) for s, _ in steps.values()) <= 0.01 * path.step_us
    # no shorter than the shortest rank's step, no longer than the run's whole span
    lengths = [e - s for s, e in steps.values()]
    assert (
        0.99 * min(lengths)
        <= path.step_us
        <= 1.01 * (max(e for _, e in steps.values()) - min(s for s, _ in steps.values()))
    )


@pytest.mark.parametrize("name", CLEAN)
def test_on_a_clean_reference_run_the_path_tiles_the_step(name, private_cache):
    a = analyse_run(RUNS / name, load_options={"cache_dir": private_cache, "workers": 1})
    assert a.path == RUNS / name and a.name == name  # the run, beside its path
    assert_tiles(a)
    seg = a.critical_path.segments
    # compute in the model's layers and transfers of its collectives are on it
    assert (seg[seg["kind"] == "compute"]["layer"].notna()).any()
    assert (seg["kind"] == "transfer").any()
    named = set(seg["collective"].dropna())
    assert named <= {c for c in named if c.split()[0] in set(a.collectives["kind"])}
    # the loss's backward nodes, outside every module, go by their own names
    labels = set(seg[seg["phase"] == "backward"]["module"].dropna().astype(str))
    assert "PowBackward0" in labels and not [m for m in labels if m.startswith("autograd::engine")]
    # a run whose step the last rank spent mostly on its own: the path is that rank's step, to 1%
    last = max(steps_aligned(a).items(), key=lambda kv: kv[1][1])
    if set(seg["rank"]) == {last[0]}:
        assert a.critical_path.step_us == pytest.approx(last[1][1] - last[1][0], rel=0.01)


@pytest.mark.distributed
@pytest.mark.parametrize("name", ["megatron", "ulysses", "hybrid"])
def test_on_the_8_rank_demo_runs_the_path_tiles_the_step(name, profiled, private_cache):
    """The demo's clean 8-rank runs (profiled in this session): the path tiles its step, crosses
    ranks where one arrived last, and its compute is in the model's layers."""
    a = analyse_run(profiled(name), load_options={"cache_dir": private_cache, "workers": 1})
    assert_tiles(a)
    seg = a.critical_path.segments
    assert (seg[seg["kind"] == "compute"]["layer"].notna()).any() and (seg["kind"] == "transfer").any()
    assert seg["waiting"].max() >= 1


def test_on_gpu_traces_the_path_follows_kernels_and_nccl_kernels_across_ranks(corpus, private_cache):
    a = analyse_run(corpus / "param_dlrm_kineto", load_options={"cache_dir": private_cache, "workers": 1})
    assert_tiles(a)
    seg = a.critical_path.segments
    compute = seg[seg["kind"] == "compute"]
    assert (compute["lane"] == "gpu").any()  # kernels on the GPU's streams
    transfers = seg[seg["kind"] == "transfer"]
    assert {c.split()[0] for c in transfers["collective"]} <= {"all_to_all", "all_reduce"}
    # each transfer is an NCCL kernel's span: its collective's rows carry linked kernels
    assert a.collectives["transfer_start_us"].notna().all()
    assert seg["rank"].nunique() >= 2  # it crossed ranks where one arrived last
    culprit = a.critical_path.culprit
    assert culprit is not None and culprit.waiting >= 1


def two_rank_path(scale: float = 1.0):
    """Two ranks, one collective: rank 1 works 5 ms (times ``scale``) longer before it, so rank 0
    waits (synthetic rows, known times)."""
    coll = pd.DataFrame({
        "rank": [0, 1], "kind": ["all_reduce"] * 2, "group": ["0"] * 2, "start_us": [1000.0, 6000.0],
        "dur_us": [10.0, 10.0], "transfer_start_us": [1000.0, 6000.0], "transfer_dur_us": [5100.0, 100.0],
        "group_size": [2, 2], "seq": [7, 7], "module": ["layers.3.mlp"] * 2, "layer": [3, 3],
        "phase": ["forward"] * 2,
    })  # fmt: skip
    members = pd.DataFrame({"rank": [0, 1], "group": ["0", "0"], "key": [7, 7], "start_us": [1000.0, 6000.0]})
    work = pd.DataFrame({
        "rank": [0, 1, 0, 1], "start_us": [0.0, 0.0, 6100.0, 6100.0], "dur_us": [1000.0, 6000.0, 900.0, 400.0],
        "module": ["layers.3.attn", "layers.3.attn", "layers.4.attn", "layers.4.attn"],
        "phase": ["forward"] * 4, "lane": ["gpu"] * 4,
    })  # fmt: skip
    for frame in (coll, members, work):
        for col in ("start_us", "dur_us", "transfer_start_us", "transfer_dur_us"):
            if col in frame:
                frame[col] *= scale
    return critical_path(coll, members, {}, {0: (0.0, 7000.0 * scale), 1: (0.0, 6500.0 * scale)}, work)


def test_the_walk_moves_to_the_member_that_arrived_last():
    """The path is rank 1's work, the transfer, then rank 0's work after it."""
    path = two_rank_path()
    seg = path.segments
    assert list(zip(seg["rank"], seg["kind"], seg["dur_us"].round(3))) == [
        (1, "compute", 6000.0), (1, "transfer", 100.0), (0, "compute", 900.0),
    ]  # fmt: skip
    assert seg.iloc[1]["waiting"] == 1 and seg.iloc[1]["collective"] == "all_reduce #7"
    # the views' list of it, in order, from the path's start in ms
    rows = path.sequence()[["from start (ms)", "ms", "rank", "kind", "module", "collective", "waiting"]]
    assert rows.values.tolist() == [
        [0.0, 6.0, 1, "compute", "layers.3.attn", "", 0], [6.0, 0.1, 1, "transfer", "layers.3.mlp", "all_reduce #7", 1],
        [6.1, 0.9, 0, "compute", "layers.4.attn", "", 0],
    ]  # fmt: skip
    assert path.step_us == 7000.0
    culprit = path.culprit
    assert (culprit.rank, culprit.module, culprit.collective, culprit.waiting) == (
        1,
        "layers.3.attn",
        "all_reduce #7",
        1,
    )


@pytest.mark.parametrize(
    ("scale", "times"), [(1, "6 ms of 7 ms"), (1000, "6000 ms of 7000 ms"), (1e-3, "0.006 ms of 0.007 ms")]
)
def test_the_headline_writes_times_without_an_exponent(scale, times):
    """A step of seconds (a slow CI machine took 1 s for the demo's) reads '1000 ms', never '1e+03'."""
    path = two_rank_path(scale)
    assert (
        path.headline()
        == f"critical path: rank 1 layers.3.attn forward, {times} (86%), made 1 rank wait at all_reduce #7"
    )


def test_the_timeline_report_and_page_show_the_path(private_cache):
    """The path is drawn as one line through the lanes (two points a segment), and the report
    and the Timeline page name its culprit."""
    from sptrace.dashboards.pages.timeline import critical_path_section

    from sptrace.report import html
    from sptrace.report.timeline import timeline

    a = analyse_run(RUNS / "megatron", load_options={"cache_dir": private_cache, "workers": 1})
    path = a.critical_path
    line = next(t for t in timeline(a).data if t.name == "critical path")
    assert len([x for x in line.x if x is not None]) == 2 * len(path.segments)
    assert min(x for x in line.x if x is not None) == pytest.approx((path.start_us - a.step_zero_us) / 1e3)
    summary = path.culprit.line(path.step_us)
    assert summary.startswith("critical path: rank ")
    assert summary in "".join(html._critical_path(a))  # the report's section (its plots cost seconds)
    section = critical_path_section(a)
    assert any(getattr(c, "id", None) == "critical-path-summary" and c.children == summary for c in section)
    # the path in order: every segment of it in the page's grid and, up to 200, in the report
    sequence = path.sequence()
    assert 0 < len(sequence) <= len(path.segments) and sequence["ms"].sum() == pytest.approx(
        path.step_us / 1e3, abs=0.1
    )
    grid = next(c for c in section if "critical-path-sequence" in str(c))
    assert f"{len(sequence)} rows" in str(grid)
    report = "".join(html._critical_path(a))
    table = report[report.index("<h3>the path in order") :]
    assert table.count("<tr>") == min(len(sequence), html.SEQUENCE_ROWS) + 1


def test_each_profiled_step_has_its_own_path_and_the_slowest_is_shown():
    """Two ranks, two profiled steps: rank 1 is slow in the first (6 ms before the all-reduce),
    rank 0 in the second (4 ms). Each step's path is walked over that step's windows and names
    its own slow rank; the path shown is the slower step's; the views list both steps."""
    from types import SimpleNamespace

    from sptrace.dashboards.pages.timeline import critical_path_section

    from sptrace.detect.timing import RankTiming
    from sptrace.reduce.critical_walk import run_critical_path
    from sptrace.reduce.matching import Matching
    from sptrace.report import html

    coll = pd.DataFrame({
        "rank": [0, 1, 0, 1], "kind": ["all_reduce"] * 4, "group": ["0"] * 4,
        "start_us": [1000.0, 6000.0, 14000.0, 10500.0], "dur_us": [10.0] * 4,
        "transfer_start_us": [1000.0, 6000.0, 14000.0, 10500.0], "transfer_dur_us": [5100.0, 100.0, 100.0, 3600.0],
        "group_size": [2] * 4, "seq": [7, 7, 8, 8], "module": ["layers.3.mlp"] * 4, "layer": [3] * 4,
        "phase": ["forward"] * 4,
    })  # fmt: skip
    members = pd.DataFrame({"rank": [0, 1, 0, 1], "group": ["0"] * 4, "key": [7, 7, 8, 8],
                            "start_us": [1000.0, 6000.0, 14000.0, 10500.0], "skew_us": [0.0] * 4})  # fmt: skip
    modules = ["layers.3.attn", "layers.4.attn", "layers.4.mlp", "layers.5.mlp"]
    starts = [0.0, 6100.0, 10000.0, 14100.0]
    durs = {0: [1000.0, 900.0, 4000.0, 900.0], 1: [6000.0, 400.0, 500.0, 900.0]}
    work = {r: pd.DataFrame({"rank": r, "start_us": starts, "dur_us": d, "module": modules, "phase": "forward",
                             "lane": "gpu"}) for r, d in durs.items()}  # fmt: skip
    steps = (("ProfilerStep#1", 0.0, 7000.0), ("ProfilerStep#2", 10000.0, 15000.0))
    timing = [RankTiming(rank=r, step_ms=7.0, comm_ms=0.0, exposed_ms=None, issue_only=0, step_start_us=0.0,
                         steps=steps) for r in (0, 1)]  # fmt: skip
    path = run_critical_path(coll, Matching(pd.DataFrame(), {}, members=members), timing, work)
    assert [(p.step, p.step_us, p.culprit.rank, p.culprit.module) for p in path.steps] == [
        ("ProfilerStep#1", 7000.0, 1, "layers.3.attn"), ("ProfilerStep#2", 5000.0, 0, "layers.4.mlp"),
    ]  # fmt: skip
    assert path.steps[1].culprit.collective == "all_reduce #8" and path.steps[1].culprit.waiting == 1
    assert path.step == "ProfilerStep#1" and path.step_us == 7000.0
    assert path.segments["start_us"].max() < 7000.0  # the shown path is the first step's alone
    as_json = path.to_dict()
    assert [s["step"] for s in as_json["steps"]] == ["ProfilerStep#1", "ProfilerStep#2"]
    assert as_json["steps"][1]["summary"].startswith("critical path: rank 0 layers.4.mlp forward, 4 ms of 5 ms")
    a = SimpleNamespace(critical_path=path)
    report = "".join(html._critical_path(a))
    assert (
        "each profiled step&#x27;s path (ProfilerStep#1&#x27;s above)" in report or "ProfilerStep#1's above" in report
    )
    assert report.count("<td>ProfilerStep#") == 2 and "rank 0 layers.4.mlp forward" in report
    grids = [c for c in critical_path_section(a) if "critical-path-steps" in str(c)]
    assert len(grids) == 1 and "rank 0 layers.4.mlp forward" in str(grids[0])
    # one step recorded: no per-step list
    one = [RankTiming(rank=r, step_ms=7.0, comm_ms=0.0, exposed_ms=None, issue_only=0, step_start_us=0.0,
                      steps=steps[:1]) for r in (0, 1)]  # fmt: skip
    single = run_critical_path(coll, Matching(pd.DataFrame(), {}, members=members), one, work)
    assert single.steps == () and single.step is None and single.step_us == 7000.0
