"""`sptrace sweep`: every scheme x sequence length profiled, tabulated and fitted; the Compare
page shows it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sptrace.cli import main
from sptrace.sweep import fit_regression

pytestmark = pytest.mark.distributed


FLAGS = ["--seq", "32,64", "--nproc", "2", "--layers", "1", "--warmup", "0"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """megatron and ulysses at S = 32 and 64 on two ranks: four runs in one launch, shared by
    this module's tests. Returns the folder and what the command printed."""
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    import io
    from contextlib import redirect_stdout

    printed = io.StringIO()
    with redirect_stdout(printed):
        assert main(["sweep", "--schemes", "megatron,ulysses", *FLAGS, "--out", str(out)]) == 0
    return out, printed.getvalue()


def test_sweep_end_to_end(sweep, capsys):
    out, printed = sweep
    assert "fit over 4 runs" in printed and "fewer runs than the 5 coefficients" in printed
    table = pd.read_csv(out / "comparison.csv")
    assert sorted(zip(table["scheme"], table["seq"])) == [
        ("megatron", 32),
        ("megatron", 64),
        ("ulysses", 32),
        ("ulysses", 64),
    ]
    assert (table["comm_GiB"] == table["model_comm_GiB"]).all()  # measured bytes are the model's
    assert (table["step_ms"] > 0).all() and (table["peak_GiB"] > 0).all()
    assert (table["comm_ms"] > 0).all() and (table["comm_ms"] < table["step_ms"]).all()  # transfer time
    fit = json.loads((out / "regression.json").read_text())
    assert set(fit["coefficients"]) == {"intercept", "peak_GiB", "comm_GiB", "S_K", "S_K^2"} and fit["runs"] == 4
    # a second sweep reuses the runs it already has
    mtime = (out / "megatron-S32" / "run.json").stat().st_mtime_ns
    assert main(["sweep", "--schemes", "megatron,ulysses", *FLAGS, "--out", str(out)]) == 0
    assert (out / "megatron-S32" / "run.json").stat().st_mtime_ns == mtime
    # the Compare page of `sptrace dash SWEEP`
    from sptrace.dashboards.app import create_app
    from sptrace.dashboards.pages import compare
    from sptrace.dashboards.pages.common import View

    from sptrace.sweep import UNDERDETERMINED, sweep_runs

    app = create_app(sweep_runs(out), [out])
    from plotly.utils import PlotlyJSONEncoder

    page = json.dumps(compare.render(app.sptrace_store, View("compare")), cls=PlotlyJSONEncoder, ensure_ascii=False)
    assert "fit over 4 runs" in page and "the article (36 runs, 8×H100)" in page
    assert UNDERDETERMINED in page  # the same warning the CLI prints


def _conclusions(run) -> dict:
    """What analyze and check conclude about a run, without its clock: per-rank collectives
    (kind, phase, layer, module, bytes, group), verdicts, findings and every tensor the step keeps
    (module, shape, bytes, class, holder). Timing, clock offsets and storage addresses differ
    between any two launches of the same step, and so do the backend's buffers alive at the
    boundary (whether gloo's thread or the model dropped a buffer last is a race) and the verdict
    line's counts of them."""
    import io
    from contextlib import redirect_stdout

    def run_json(*argv):
        buf = io.StringIO()
        with redirect_stdout(buf):
            code = main([*argv, str(run), "--format", "json", "--no-cache"])
        return code, json.loads(buf.getvalue())

    def timeless(rows):
        return [{k: v for k, v in row.items() if not k.endswith(("_us", "_ms", "gbps", "_ptr")) and k not in
                 ("straggler", "key", "tid", "start_ms_from_step")} for row in rows]  # fmt: skip

    a_code, a = run_json("analyze")
    c_code, c = run_json("check")
    colls = run_json("collectives")[1]
    rows = colls if isinstance(colls, list) else colls.get("collectives", colls)
    return {
        "analyze": (a_code, a["verdict"], a["ranks"], a["layers"], a["findings"], timeless(a["matched_collectives"])),
        # what the step keeps: which of a collective's buffers gloo's thread freed is a race of each launch
        "check": (c_code, c["verdict"]["status"], c["counts"], c["findings"], c["layers"],
                  sorted(map(str, timeless([s for s in c["saved"] if s["holder"] in ("autograd", "model")])))),
        "collectives": sorted(map(str, timeless(rows))),
        "config": json.loads((run / "run.json").read_text())["config"],
    }  # fmt: skip


def test_a_run_in_a_shared_launch_is_the_run_alone(sweep, tmp_path, capsys):
    """ulysses-S64 came last of the sweep's one launch, after three other runs in the same
    processes; profiled alone, in a launch of its own, it has the same collectives, findings,
    retained tensors and verdicts."""
    out, _ = sweep
    alone = tmp_path / "alone"
    argv = ["profile", "--scheme", "ulysses", "--seq", "64", *FLAGS[2:], "--out", str(alone)]
    assert main(argv) == 0
    capsys.readouterr()
    shared, single = _conclusions(out / "ulysses-S64"), _conclusions(alone)
    for key in shared:
        assert shared[key] == single[key], key
    assert shared["check"][0] == 0 and shared["analyze"][0] == 0 and len(shared["collectives"]) > 0


def test_sweep_puts_the_five_schemes_side_by_side(sweep, tmp_path, capsys):
    """megatron, ulysses, hybrid, ring and usp on the same model: every run's measured wire
    bytes are its model's, its retained bytes per layer are measured, and the Compare page
    shows all five runs and the five schemes' model curves. The two runs the shared sweep
    already has are reused: the other three are profiled in one launch."""
    import shutil

    out = tmp_path / "five"
    out.mkdir()
    for name in ("megatron-S32", "ulysses-S32"):
        shutil.copytree(sweep[0] / name, out / name, copy_function=shutil.copy2)
    mtime = (out / "megatron-S32" / "run.json").stat().st_mtime_ns
    schemes = ["megatron", "ulysses", "hybrid", "ring", "usp"]
    flags = ["--schemes", ",".join(schemes), "--seq", "32", "--nproc", "2", "--layers", "1", "--warmup", "0"]
    assert main(["sweep", *flags, "--out", str(out)]) == 0
    assert "sweep: profiling 3 of 5 runs in one launch" in capsys.readouterr().err
    assert (out / "megatron-S32" / "run.json").stat().st_mtime_ns == mtime
    table = pd.read_csv(out / "comparison.csv")
    assert sorted(table["scheme"]) == sorted(schemes)
    assert (table["comm_GiB"] == table["model_comm_GiB"]).all()
    assert (table["retained_KiB_per_layer"] > 0).all() and (table["step_ms"] > 0).all()
    from plotly.utils import PlotlyJSONEncoder
    from sptrace.dashboards.app import create_app
    from sptrace.dashboards.pages import compare
    from sptrace.dashboards.pages.common import View

    from sptrace.sweep import sweep_runs

    app = create_app(sweep_runs(out), [out])
    page = json.dumps(compare.render(app.sptrace_store, View("compare")), cls=PlotlyJSONEncoder)  # every run
    for name in ("ring-S32", "usp-S32", "megatron-S32"):
        assert name in page
    assert "usp (U=2)" in page  # the model's curve of each scheme


def test_regression_recovers_known_coefficients():
    rows = []
    for seq, peak, comm in [
        (8192, 10, 5),
        (16384, 12, 9),
        (32768, 15, 20),
        (65536, 20, 41),
        (131072, 30, 80),
        (262144, 50, 160),
    ]:
        s_k = seq / 1024
        rows.append({"seq": seq, "peak_GiB": peak, "comm_GiB": comm,
                     "step_ms": 5.40 + 2.80 * peak + 1.49 * comm + 4.94 * s_k + 0.14157 * s_k**2})  # fmt: skip
    fit = fit_regression(pd.DataFrame(rows))
    assert fit["coefficients"] == pytest.approx(
        {"intercept": 5.40, "peak_GiB": 2.80, "comm_GiB": 1.49, "S_K": 4.94, "S_K^2": 0.14157}, rel=1e-6
    )
    assert fit["r2"] == pytest.approx(1.0) and not fit["underdetermined"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--schemes", "zigzag", "--seq", "64"], "unknown scheme 'zigzag'"),
        (["--seq", "64,x"], "--seq takes comma-separated integers"),
        (["--seq", "64,100"], "seq 100 is not divisible by the sequence-parallel size 8"),
    ],
)
def test_sweep_bad_flags(tmp_path, capsys, flags, message):
    assert main(["sweep", *flags, "--out", str(tmp_path / "s")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
