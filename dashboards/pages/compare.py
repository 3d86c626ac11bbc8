"""Compare: the runs side by side, and the cost model swept over sequence length."""

from __future__ import annotations

from typing import Any

from dash import dcc, html

from dashboards import figures
from dashboards.pages.common import grid
from dashboards.pages.overview import summary
from dashboards.store import RunStore
from sptrace.config import StepConfig


def layout(store: RunStore) -> Any:
    base = next((store.get(i)["config"] for i in range(len(store.paths)) if store.get(i).get("config")), None)
    base = base or StepConfig()
    seqs = sorted({base.seq * 2**k for k in range(-2, 6) if base.seq * 2**k >= base.sp_size})
    seqs = [s for s in seqs if s % base.sp_size == 0]
    return html.Div([
        html.H2("Compare"), grid(summary(store), "compare-grid"),
        dcc.Graph(id="compare-sweep", figure=figures.model_sweep(base, seqs)),
    ])  # fmt: skip
