"""GPU: for runs with GPU kernels, HolisticTraceAnalysis's temporal breakdown, communication /
computation overlap and kernel-type breakdown. HTA is imported here only, when the page asks."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from dash import Input, Output, dcc, html
from sptrace.dashboards.pages.common import error_box, grid, run_selector
from sptrace.dashboards.store import RunStore

from sptrace.errors import SptraceError
from sptrace.report import figures


def hta_analyses(run: Any) -> dict[str, Any]:
    """HTA over the run's rank traces (linked into a private folder: HTA would read run.json and
    the logs as traces, and must not write next to read-only traces)."""
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="sptrace-hta-") as tmp:
        for trace in run:
            suffix = ".json.gz" if trace.path.name.endswith(".gz") else ".json"
            (Path(tmp) / f"rank{trace.rank}{suffix}").symlink_to(trace.path.resolve())
        analysis = TraceAnalysis(trace_dir=tmp)
        temporal = analysis.get_temporal_breakdown(visualize=False)
        overlap = analysis.get_comm_comp_overlap(visualize=False)
        kernel_types = analysis.get_gpu_kernel_breakdown(visualize=False)[0]
    return {"temporal": temporal, "overlap": overlap, "kernel_types": kernel_types}


def view(store: RunStore, index: int) -> list[Any]:
    a = store.get(index)
    if isinstance(a, SptraceError):
        return [error_box(str(a))]
    run = a.run
    if not any(t.category_counts().get("kernel", 0) for t in run):
        return [html.P("no GPU kernels in this run (a CPU / gloo trace): HTA's analyses need them", className="no-gpu")]
    try:
        hta = store.cached(index, "hta", lambda: hta_analyses(run))
    except Exception as exc:  # HTA is a third party: its failure is shown, not raised
        return [error_box(f"HTA failed on this run: {type(exc).__name__}: {exc}")]
    return [
        dcc.Graph(id="gpu-temporal", figure=figures.temporal_breakdown(hta["temporal"])),
        html.H4("communication / computation overlap (HTA)"), grid(hta["overlap"], "gpu-overlap"),
        html.H4("GPU time by kernel type (HTA)"), grid(hta["kernel_types"], "gpu-kernels"),
    ]  # fmt: skip


def layout(store: RunStore) -> Any:
    return html.Div([html.H2("GPU (HTA)"), run_selector(store, "gpu"), dcc.Loading(html.Div(id="gpu-body"))])


def register(app: Any, store: RunStore) -> None:
    @app.callback(Output("gpu-body", "children"), Input("gpu-run", "value"))
    def _show(index: int) -> list[Any]:
        return view(store, index)
