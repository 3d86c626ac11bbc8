"""Figure functions on plain data: what they plot must be the numbers they were given."""

from __future__ import annotations

import pandas as pd
import pytest
from sptrace.reference_models.config import StepConfig

from sptrace.costmodel import estimate_comm
from sptrace.report import figures


@pytest.fixture
def frame():
    return pd.DataFrame({
        "rank": [0, 0, 1, 1], "kind": ["all_gather", "all_reduce", "all_gather", "all_reduce"],
        "start_us": [100.0, 300.0, 150.0, 320.0], "dur_us": [10.0, 20.0, 10.0, 20.0],
        "transfer_start_us": [101.0, None, 151.0, None], "transfer_dur_us": [30.0, None, 30.0, None],
        "module": ["a", "b", "a", "b"], "phase": ["forward", "backward"] * 2, "in_bytes": [8, 16, 8, 16],
        "wire_bytes": [7 * 2**20, 28 * 2**20, 7 * 2**20, 28 * 2**20],
    })  # fmt: skip


def test_timeline_aligns_ranks(frame):
    fig = figures.collective_timeline(frame, {0: 0.0, 1: 50.0})
    assert sorted(t.name for t in fig.data) == ["all_gather", "all_reduce"]
    ag = next(t for t in fig.data if t.name == "all_gather")
    assert list(ag.base) == [0.0, 0.0]  # rank 1's clock is 50 us ahead: both start together
    assert list(ag.y) == ["rank 0", "rank 1"]
    assert list(ag.x) == [0.03, 0.03]  # a bar spans the transfer (30 us), not the CPU issue (10 us)
    ar = next(t for t in fig.data if t.name == "all_reduce")
    assert list(ar.x) == [0.02, 0.02]  # no transfer record: the issue span
    assert figures.collective_timeline(frame.iloc[:0]).layout.title.text == "no collectives"


def test_wire_by_kind_against_the_model(frame):
    est = estimate_comm(StepConfig())
    fig = figures.wire_by_kind(frame, est)
    measured, model = fig.data
    assert dict(zip(measured.x, measured.y)) == {"all_gather": 7.0, "all_reduce": 28.0}
    assert dict(zip(model.x, model.y))["all_gather"] == est.wire_per_step("all_gather") / 2**20


def test_saved_by_layer_stacks_classes():
    classes = ["seq-sharded", "full", "seq-sharded", "other"]
    saved = pd.DataFrame({"rank": [0, 0, 1, 1], "layer": [0, 0, 0, None], "class": classes,
                          "storage_bytes": [1024, 4096, 1024, 2048]})  # fmt: skip
    fig = figures.saved_by_layer(saved)
    by = {t.name: dict(zip(t.x, t.y)) for t in fig.data}
    assert by["seq-sharded"] == {"layer 0": 1.0} and by["full"] == {"layer 0": 2.0}
    assert by["other"] == {"outside layers": 1.0}


def test_model_sweep_is_the_cost_model():
    base = StepConfig(layers=1, seq=128)
    fig = figures.model_sweep(base, [128, 256])
    mega = next(t for t in fig.data if t.name == "megatron")
    assert list(mega.y) == [estimate_comm(base.replace(seq=s)).wire_per_step() / 2**30 for s in (128, 256)]
    assert figures.model_sweep(base.shape(), [128]).data[0].y[0] == mega.y[0]  # a ModelShape alike


def test_timeline_phase_lanes(frame):
    phases = pd.DataFrame(
        {"rank": [0, 1], "phase": ["forward", "forward"], "start_us": [90.0, 140.0], "dur_us": [50.0, 50.0]}
    )
    fig = figures.collective_timeline(frame, {0: 0.0, 1: 50.0}, phases=phases)
    lane = next(t for t in fig.data if t.name == "forward (phase)")
    assert list(lane.y) == ["rank 0 phases", "rank 1 phases"] and list(lane.base) == [0.0, 0.0]
    assert fig.layout.xaxis.title.text == "ms"
    assert list(fig.layout.yaxis.categoryarray) == ["rank 1 phases", "rank 1", "rank 0 phases", "rank 0"]


def test_wire_by_layer_and_memory_over_step(frame):
    fig = figures.wire_by_layer(frame.assign(layer=[0, None, 0, None]))
    by = {t.name: dict(zip(t.x, t.y)) for t in fig.data}
    assert by == {"forward": {"layer 0": 7 * 1024.0}, "backward": {"outside layers": 28 * 1024.0}}
    series = pd.DataFrame(
        {"rank": [0, 0, 1], "ts_us": [1000.0, 3000.0, 2000.0], "allocated_bytes": [2**20, 3 * 2**20, 2**21]}
    )
    mem = figures.memory_over_step(series)
    assert [t.name for t in mem.data] == ["rank 0", "rank 1"]
    assert list(mem.data[0].x) == [0.0, 2.0] and list(mem.data[0].y) == [1.0, 3.0]
