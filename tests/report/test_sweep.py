"""`sptrace sweep`: every scheme x sequence length profiled, tabulated and fitted; the Compare
page shows it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sptrace.cli import main
from sptrace.sweep import fit_regression

pytestmark = pytest.mark.distributed


def test_sweep_end_to_end(tmp_path, capsys):
    out = tmp_path / "sweep"
    flags = ["--schemes", "megatron,ulysses", "--seq", "32,64", "--nproc", "2", "--layers", "1", "--warmup", "0"]
    assert main(["sweep", *flags, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
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
    assert main(["sweep", *flags, "--out", str(out)]) == 0
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


def test_sweep_puts_the_five_schemes_side_by_side(tmp_path, capsys):
    """megatron, ulysses, hybrid, ring and usp on the same model: every run's measured wire
    bytes are its model's, its retained bytes per layer are measured, and the Compare page
    shows all five runs and the five schemes' model curves."""
    out = tmp_path / "five"
    schemes = ["megatron", "ulysses", "hybrid", "ring", "usp"]
    flags = ["--schemes", ",".join(schemes), "--seq", "32", "--nproc", "2", "--layers", "1", "--warmup", "0"]
    assert main(["sweep", *flags, "--out", str(out)]) == 0
    capsys.readouterr()
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
