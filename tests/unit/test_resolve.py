"""GIVEN a committed 2-rank ring-attention run (tests/golden/runs/ring-mha) whose run.json is hidden
from the analysis, so that only the flags declare B, S and H
WHEN it is analysed
THEN the model is resolved once, after the map, in sptrace.resolve: P, L, g and the dtype are read
off the traces (each saying so in its provenance), a declared value is never replaced, nothing
patches the model afterwards (ModelShape.override is never called during the reduce), and every
check sees that one model. Without a declared dtype the ring's receive buffers are still known as
what a peer sent: c10d's recv_ records no element type, the aten::empty that made the buffer does
(K and V stacked at P = 2 hold B*S*H elements, and read as a full sequence by dims alone)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sptrace.analysis import analyse_run, reduce_run
from sptrace.checks.registry import SHARDING
from sptrace.resolve import declared_model
from sptrace.run.map import MapSpec, map_run
from sptrace.vocab.shape import ModelShape

RUN = Path(__file__).resolve().parents[1] / "golden" / "runs" / "ring-mha"


@pytest.fixture
def bare_run(tmp_path: Path) -> Path:
    """The run's traces without its run.json: nothing declares P, L, heads or the dtype."""
    out = tmp_path / "bare"
    out.mkdir()
    for trace in RUN.glob("*.json*"):
        if trace.name != "run.json":
            shutil.copy(trace, out / trace.name)
    return out


def test_sizes_the_user_leaves_out_are_read_off_the_traces(bare_run: Path, tmp_path: Path) -> None:
    a = analyse_run(bare_run, flags={"scheme": "ring", "batch": 2, "seq": 32, "hidden": 48, "heads": 4},
                    load_options={"cache_dir": tmp_path / "cache"})  # fmt: skip
    m = a.model
    assert (m.sp_size, m.layers, m.kv_heads, m.dtype) == (2, 1, 4, "float32")
    assert m.provenance["sp_size"] == "the run's only process group (2 ranks)"
    assert m.provenance["layers"] == "the trace (layers 0-0 communicate)"
    assert m.provenance["kv_heads"] == "equal to heads (no --kv-heads declared)"
    assert m.provenance["dtype"].startswith("the trace")
    assert m.provenance["seq"] == "--seq"
    assert a.reports[SHARDING].verdict is not None and a.reports[SHARDING].verdict.status == "pass"


def test_a_declared_value_is_never_replaced(tmp_path: Path) -> None:
    a = analyse_run(RUN, flags={"layers": 3, "dtype": "bfloat16"}, load_options={"cache_dir": tmp_path})
    assert (a.model.layers, a.model.dtype) == (3, "bfloat16")
    assert a.model.provenance["layers"] == "--layers" and a.model.provenance["dtype"] == "--dtype"
    # the trace's float32 activations contradict the declaration: the sharding check says so, naming both
    assert any("declared dtype bfloat16" in n and "float32" in n for n in a.sharding.notes)


def test_nothing_patches_the_model_after_the_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, results = map_run(RUN, MapSpec(("collectives", "sharding", "path"), cache_dir=tmp_path))
    declared = declared_model(run.run_info, {"seq": 32})

    def patched(*args: object, **kwargs: object) -> ModelShape:
        raise AssertionError("ModelShape.override called after the map")

    monkeypatch.setattr(ModelShape, "override", patched)
    a = reduce_run(run, RUN, results, declared=declared)
    assert a.model.seq == 32 and a.sharding is not None and a.comm is not None
    assert a.estimate is not None and a.estimate.cfg is a.model  # the cost model's report names the one model
