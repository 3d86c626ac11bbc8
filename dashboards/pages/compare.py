"""Compare: the runs side by side, and the cost model swept over sequence length."""

from __future__ import annotations

from typing import Any

from dash import dcc, html
from sptrace.dashboards.pages.common import grid
from sptrace.dashboards.pages.overview import summary
from sptrace.dashboards.store import RunStore
from sptrace.reference_models.config import StepConfig

from sptrace.analysis import RunAnalysis
from sptrace.costmodel.comm import NEEDS
from sptrace.report import figures


def sweep_section(root: Any) -> list[Any]:
    from sptrace.sweep import load_sweep

    loaded = load_sweep(root)
    if loaded is None:
        return []
    table, fit = loaded
    parts: list[Any] = [html.H3(f"sweep: {root}"), grid(table, f"sweep-grid-{root.name}")]
    if fit:
        c = fit["coefficients"]
        r2 = "n/a" if fit.get("r2") is None else f"{fit['r2']:.4f}"
        text = f"time_ms = {c['intercept']:.4g} + " + " + ".join(
            f"{v:.4g}*{k}" for k, v in c.items() if k != "intercept"
        )
        a = fit["article"]
        parts += [
            html.P(
                f"fit over {fit['runs']} runs: {text} (R² {r2}, mean abs error {fit['mae_ms']:.1f} ms)", className="fit"
            ),
            html.P(
                f"the article (36 runs, 8xH100): time_ms = {a['intercept']} + {a['peak_GiB']}*peak_GiB + "
                f"{a['comm_GiB']}*comm_GiB + {a['S_K']}*S_K + {a['S_K^2']}*S_K^2 (R² {a['r2']})"
            ),
            dcc.Graph(figure=figures.sweep_fit(table, c)),
        ]
    return parts


def layout(store: RunStore) -> Any:
    # the first run whose model is fully declared, else the reference models' defaults (labelled)
    runs = [store.get(i) for i in range(len(store.paths))]
    declared = [a.model for a in runs if isinstance(a, RunAnalysis) and not a.model.missing(NEEDS)]
    base = declared[0] if declared else StepConfig().shape()
    seqs = sorted({base.seq * 2**k // 4 for k in range(8) if base.seq * 2**k // 4 >= base.sp_size})
    seqs = [s for s in seqs if s % base.sp_size == 0]
    sweeps = [part for root in store.sweeps for part in sweep_section(root)]
    return html.Div([
        html.H2("Compare"), grid(summary(store), "compare-grid"), *sweeps,
        dcc.Graph(id="compare-sweep", figure=figures.model_sweep(base, seqs)),
    ])  # fmt: skip
