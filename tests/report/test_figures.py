"""Figure functions: they draw a finished RunAnalysis (or its tables, or a sweep) and compute
nothing, so each is checked here on tables written by hand: what they plot must be the numbers
they were given."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from sptrace.reference_models.config import StepConfig

from sptrace.analysis import RunAnalysis
from sptrace.checks.builtin import CollectivesDetail
from sptrace.checks.registry import COLLECTIVES, CheckReport
from sptrace.costmodel import estimate_comm
from sptrace.costmodel.sweep import sweep_model
from sptrace.detect.collectives import COLUMNS
from sptrace.detect.timing import RankTiming
from sptrace.reduce.matching import Matching
from sptrace.report import compare, figures, theme, timeline
from sptrace.sweep import load_sweep
from sptrace.vocab.shape import ModelShape


def analysis(collectives: pd.DataFrame, *, offsets=None, phases=None, compute=None, matched=None, members=None,
             memory=None, retained=(), timing=(), estimate=None, model=None, name="run") -> RunAnalysis:  # fmt: skip
    """A RunAnalysis around hand-written tables (only what the figures read)."""
    from pathlib import Path

    frame = collectives.reindex(columns=COLUMNS)
    matching = Matching(
        matched if matched is not None else pd.DataFrame(columns=["group", "key", "ranks", "straggler", "algbw_gbps",
                                                                  "busbw_gbps", "kind", "in_bytes"]),
        offsets or {},
        members if members is not None else pd.DataFrame(columns=["rank", "group", "key", "start_us"]),
    )  # fmt: skip
    own = CheckReport(COLLECTIVES, "collectives", None, detail=CollectivesDetail(estimate, None, None, None))
    return RunAnalysis(
        path=Path(name), run=None, model=model or ModelShape(), warnings=(), collectives=frame, matching=matching,
        timing=tuple(timing), retained=tuple(retained), reports={COLLECTIVES: own},
        phases=phases if phases is not None else pd.DataFrame(columns=["rank", "phase", "start_us", "dur_us"]),
        memory=memory if memory is not None else pd.DataFrame(columns=["rank", "ts_us", "allocated_bytes"]),
        compute_lanes=dict(tuple(compute.groupby("rank"))) if compute is not None else {},
    )  # fmt: skip


@pytest.fixture
def frame():
    return pd.DataFrame({
        "rank": [0, 0, 1, 1], "kind": ["all_gather", "all_reduce", "all_gather", "all_reduce"],
        "op": ["c10d::_allgather_base_", "c10d::allreduce_"] * 2,
        "start_us": [100.0, 300.0, 150.0, 320.0], "dur_us": [10.0, 20.0, 10.0, 20.0],
        "transfer_start_us": [101.0, None, 151.0, None], "transfer_dur_us": [30.0, None, 30.0, None],
        "module": ["a", "b", "a", "b"], "phase": ["forward", "backward"] * 2, "in_bytes": [8, 16, 8, 16],
        "wire_bytes": [7 * 2**20, 28 * 2**20, 7 * 2**20, 28 * 2**20], "layer": [0, None, 0, None],
    })  # fmt: skip


def bars(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_timeline_lanes_on_aligned_clocks(frame):
    fig = timeline.timeline(analysis(frame, offsets={0: 0.0, 1: 50.0}))
    assert [t.name for t in fig.data] == ["all_gather", "all_reduce"]
    ag = bars(fig, "all_gather")
    # rank 1's clock runs 50 us ahead: both transfers start together, 1 us after the step's zero
    assert list(ag.base) == pytest.approx([0.001, 0.001])
    assert [round(y) for y in ag.y] == [0, 1]  # one lane per rank
    assert list(ag.x) == pytest.approx([0.03, 0.03])  # a bar spans the transfer (30 us), not the issue (10 us)
    assert list(bars(fig, "all_reduce").x) == pytest.approx([0.02, 0.02])  # no transfer record: the CPU span
    assert list(fig.layout.yaxis.ticktext) == ["rank 0", "rank 1"]
    # the hover names kind, bytes, layer, module, phase
    custom = ag.customdata[0]
    assert custom[0] == 0 and custom[2] == "8 B" and custom[3] == "7.00 MiB" and custom[6] == "0" and custom[7] == "a"


def test_timeline_keeps_short_collectives_visible_on_a_445_ms_step():
    step = pd.DataFrame({"rank": [0], "phase": ["step"], "start_us": [0.0], "dur_us": [445_000.0]})
    tiny = pd.DataFrame({"rank": [0], "kind": ["all_gather"], "start_us": [1000.0], "dur_us": [5.0],
                         "transfer_start_us": [1001.0], "transfer_dur_us": [3.0], "phase": ["forward"]})  # fmt: skip
    fig = timeline.timeline(analysis(tiny, phases=step))
    (width,) = bars(fig, "all_gather").x
    assert width == pytest.approx(445 / 400)  # 3 us drawn as 1/400 of the view: a few pixels, never zero
    assert fig.layout.xaxis.range[1] >= 445


def test_timeline_phases_are_bands_and_zoom(frame):
    phases = pd.DataFrame(
        {
            "rank": [0, 0, 1, 1],
            "phase": ["forward", "backward"] * 2,
            "start_us": [90.0, 250.0, 140.0, 300.0],
            "dur_us": [150.0, 100.0, 150.0, 100.0],
        }
    )
    a = analysis(frame, offsets={0: 0.0, 1: 50.0}, phases=phases)
    fig = timeline.timeline(a)
    # one bar trace per phase, first (beneath the rest), a band as tall as the lane: thousands of
    # phases stay one trace each, where a layout shape per band cost plotly O(n^2) to add
    bands = [t for t in fig.data if t.name in ("forward", "backward")]
    assert [t.name for t in fig.data[:2]] == ["forward", "backward"] and all(t.width == 0.96 for t in bands)
    assert {t.marker.color for t in bands} == {theme.PHASE_COLORS["forward"], theme.PHASE_COLORS["backward"]}
    assert sum(len(t.x) for t in bands) == 4 and sorted({round(y) for t in bands for y in t.y}) == [0, 1]
    assert list(bars(fig, "backward").x) == pytest.approx([0.1, 0.1])  # 100 us each, on the rank's own lane
    assert [t.name for t in fig.data if t.type == "bar" and t.name not in ("forward", "backward")] == [
        "all_gather", "all_reduce"]  # fmt: skip
    layer0 = timeline.timeline(a, layer=0).layout.xaxis.range  # the layer's collectives: 11..41 us
    assert layer0[0] < 0.011 < 0.041 < layer0[1] < 0.05
    backward = timeline.timeline(a, phase="backward").layout.xaxis.range  # 250..350 us after the zero at 90
    assert backward[0] == pytest.approx(0.16, abs=0.01) and backward[1] == pytest.approx(0.26, abs=0.01)


def test_timeline_links_matched_collectives_and_marks_the_straggler(frame):
    members = pd.DataFrame({"rank": [0, 1], "group": ["g", "g"], "key": [1, 1], "start_us": [100.0, 150.0]})
    matched = pd.DataFrame({"group": ["g"], "key": [1], "ranks": [[0, 1]], "straggler": [1], "algbw_gbps": [2.5],
                            "busbw_gbps": [1.25], "kind": ["all_gather"], "in_bytes": [8]})  # fmt: skip
    fig = timeline.timeline(analysis(frame, offsets={0: 0.0, 1: 40.0}, matched=matched, members=members))
    link = bars(fig, "same collective")
    assert [bool(np.isnan(x)) for x in link.x] == [False, False, True]  # a gap after each collective
    straggler = bars(fig, "straggler (arrived last)")
    assert len(straggler.x) == 1 and round(straggler.y[0]) == 1
    peers = {row[0]: (row[5], row[4], row[11]) for row in bars(fig, "all_gather").customdata}
    assert peers[0] == ("rank 1", "algbw 2.50 GB/s, busbw 1.25 GB/s", "rank 1")
    assert peers[1][0] == "rank 0"


def test_wire_by_kind_outlines_what_differs_from_the_model(frame):
    est = estimate_comm(StepConfig())
    fig = figures.wire_by_kind(analysis(frame, estimate=est))
    measured, model = fig.data
    assert dict(zip(measured.x, measured.y)) == {"all_gather": 7.0, "all_reduce": 28.0, "reduce_scatter": 0.0}
    assert dict(zip(model.x, model.y))["all_gather"] == est.wire_per_step("all_gather") / 2**20
    outline = dict(zip(measured.x, measured.marker.line.color))
    assert outline["all_gather"] == theme.VERDICT_COLORS["fail"]  # 7 MiB is not what the model says
    assert list(measured.customdata) == list(measured.x)  # a click names the kind


def test_wire_by_layer_per_phase(frame):
    fig = figures.wire_by_layer(analysis(frame))
    by = {t.name: dict(zip(t.x, t.y)) for t in fig.data}
    assert by == {"backward": {"outside layers": 28 * 1024.0}, "forward": {"layer 0": 7 * 1024.0}}
    assert {t.name: t.customdata[0] for t in fig.data} == {"backward": "backward", "forward": "forward"}


def test_retained_by_layer_groups_and_the_expected_figure():
    groups = ["sharded", "full", "sharded", "undecided", "other", "backend or parameter"]
    saved = pd.DataFrame({"rank": [0, 0, 1, 1, 1, 1], "layer": [0, 0, 0, 0, None, 0], "group": groups,
                          "storage_bytes": [1024, 4096, 1024, 2048, 2048, 8192]})  # fmt: skip
    fig = figures.retained_by_layer(saved, expected_bytes=3 * 1024)
    by = {t.name: dict(zip(t.x, t.y)) for t in fig.data}
    assert by == {"sharded": {"layer 0": 1.0}, "undecided": {"layer 0": 1.0}, "full": {"layer 0": 2.0},
                  "other": {"outside layers": 1.0}, "backend or parameter": {"layer 0": 4.0}}  # fmt: skip
    colors = {t.name: t.marker.color for t in fig.data}
    assert colors["full"] == theme.VERDICT_COLORS["fail"] and colors["undecided"] == theme.VERDICT_COLORS[
        "undecided"]  # fmt: skip
    (line,) = [s for s in fig.layout.shapes if s.type == "line"]
    assert line.y0 == line.y1 == 3.0


def test_memory_over_step_has_phases_and_the_boundary(frame):
    series = pd.DataFrame({"rank": [0, 0, 1], "ts_us": [100.0, 300.0, 200.0], "allocated_bytes": [2**20, 3 * 2**20,
                                                                                                 2**21]})  # fmt: skip
    phases = pd.DataFrame({"rank": [0, 0], "phase": ["forward", "backward"], "start_us": [100.0, 200.0],
                           "dur_us": [100.0, 100.0]})  # fmt: skip
    retained = [SimpleNamespace(rank=0, boundary_ns=200_000), SimpleNamespace(rank=1, boundary_ns=200_000)]
    fig = figures.memory_over_step(analysis(frame, memory=series, phases=phases, retained=retained))
    assert [t.name for t in fig.data] == ["rank 0", "rank 1"]
    assert list(fig.data[0].x) == [0.0, 0.2] and list(fig.data[0].y) == [1.0, 3.0]
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(s.x0, s.x1) for s in rects] == [(0.0, 0.1), (0.1, 0.2)]
    (boundary,) = [s for s in fig.layout.shapes if s.type == "line"]
    assert boundary.x0 == pytest.approx(0.1)
    assert "forward → backward" in [a.text for a in fig.layout.annotations]


def test_memory_over_step_thins_long_series_and_keeps_every_peak(frame):
    n = 100_000
    rng = np.random.default_rng(0)
    allocated = rng.integers(2**20, 2**21, n).astype(float)
    allocated[12_345] = 64 * 2**20  # one short spike: the peak a user is looking for
    allocated[77_777] = 0.0
    series = pd.DataFrame({"rank": 0, "ts_us": np.arange(n, dtype=float), "allocated_bytes": allocated})
    fig = figures.memory_over_step(analysis(frame, memory=series), max_points=2000)
    (line,) = fig.data
    assert line.type == "scatter" and line.line.shape == "hv"  # SVG, a step function
    assert len(line.y) <= 2000 and max(line.y) == 64.0 and min(line.y) == 0.0
    assert list(line.x) == sorted(line.x)


def test_compare_runs_side_by_side(frame):
    timing = [RankTiming(0, 10.0, 4.0, None, 0), RankTiming(1, 12.0, 6.0, None, 0)]
    one = analysis(frame, timing=timing, name="one")
    two = analysis(frame.iloc[:2], timing=[RankTiming(0, 8.0, 2.0, None, 0)], name="two")
    fig = compare.compare_runs([one, two])
    comm, rest = fig.data[0], fig.data[1]
    assert list(comm.x) == ["one", "two"] and list(comm.y) == [5.0, 2.0]  # mean transfer per rank
    assert list(rest.y) == [7.0, 6.0] and list(rest.base) == [5.0, 2.0]  # stacked on it: the slowest step
    wire = bars(fig, "measured wire")
    assert list(wire.y) == [35.0, 35.0]  # MiB per rank
    # what the bars draw are the run's facts, the numbers the Overview, the report and a sweep show
    assert (one.facts.step_ms, one.facts.comm_ms, one.facts.comm_share) == (12.0, 5.0, 5.0 / 12.0)
    assert one.facts.wire_bytes == 35 * 2**20 and one.facts.model_wire_bytes is None and one.facts.exposed_ms is None


def test_model_sweep_is_the_cost_model():
    cfg = StepConfig(layers=1, seq=128)
    a = analysis(pd.DataFrame(), model=cfg.shape())
    sweep = a.model_sweep  # the analysis's own: sweep_model at the run's model
    assert sweep == sweep_model(cfg.shape())
    assert sweep.seqs == (32, 64, 128, 256, 512, 1024, 2048, 4096)  # S/4 to 32 S, those P = 8 divides
    assert sweep.describe() == "megatron P=8 L=1 B=2 S=128 H=96 a=16 g=8 F=160 float32, S varied"
    fig = compare.model_sweep(a)
    mega = bars(fig, "megatron")
    assert list(mega.y) == [estimate_comm(cfg.replace(seq=s)).wire_per_step() / 2**30 for s in sweep.seqs]
    assert list(fig.layout.xaxis.ticktext) == ["32", "64", "128", "256", "512", "1K", "2K", "4K"]
    assert [t.name for t in fig.data] == ["megatron", "ulysses", "hybrid", "ring", "usp (U=2)"]
    short = sweep_model(cfg.shape().override("test", seq=32))  # from S = 8: ring's zigzag needs 2P = 16 chunks
    assert short.seqs[0] == 8 and short.wire_bytes["ring"][0] is None and None not in short.wire_bytes["ring"][1:]
    assert bars(compare.model_sweep(analysis(pd.DataFrame(), model=short.model)), "ring").y[0] is None  # a gap
    # a model with a size undeclared is not swept: its curves would describe no run
    assert sweep_model(ModelShape(scheme="megatron", sp_size=8, seq=128)) is None


def test_sweep_fit_says_when_it_is_underdetermined(tmp_path):
    table = pd.DataFrame({"scheme": ["megatron", "ulysses"], "seq": [1024, 2048], "step_ms": [10.0, 20.0],
                          "peak_GiB": [1.0, 2.0], "comm_GiB": [0.5, 1.0]})  # fmt: skip
    coefficients = {"intercept": 1.0, "peak_GiB": 2.0, "comm_GiB": 3.0, "S_K": 4.0, "S_K^2": 0.5}
    table.to_csv(tmp_path / "comparison.csv", index=False)
    (tmp_path / "regression.json").write_text(json.dumps({"coefficients": coefficients, "underdetermined": True}))
    sweep = load_sweep(tmp_path)  # the fit's predictions are computed here, once; the figure draws them
    assert list(sweep.predicted_ms) == [1.0 + 2.0 + 1.5 + 4.0 + 0.5, 1.0 + 4.0 + 3.0 + 8.0 + 2.0]
    fig = compare.sweep_fit(sweep)
    assert "underdetermined" in fig.layout.title.text
    fit = bars(fig, "megatron fit")
    assert list(fit.y) == [1.0 + 2.0 + 1.5 + 4.0 + 0.5]
    (tmp_path / "regression.json").write_text(json.dumps({"coefficients": coefficients}))
    assert "underdetermined" not in compare.sweep_fit(load_sweep(tmp_path)).layout.title.text
    assert load_sweep(tmp_path / "elsewhere") is None


def test_every_figure_uses_the_template(frame):
    a = analysis(frame)
    swept = analysis(frame, model=StepConfig().shape())
    for fig in (timeline.timeline(a), figures.wire_by_kind(a), figures.memory_over_step(a),
                compare.compare_runs([a]), compare.model_sweep(swept)):  # fmt: skip
        assert fig.layout.template.layout.font.family == theme.FONT
