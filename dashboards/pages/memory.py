"""Memory: activations kept for backward per rank, by module and sharding class, per layer."""

from __future__ import annotations

from typing import Any

from dash import Input, Output, dcc, html

from dashboards import figures
from dashboards.pages.common import error_box, grid, run_selector
from dashboards.store import RunStore


def view(store: RunStore, index: int) -> list[Any]:
    a = store.get(index)
    if "error" in a:
        return [error_box(a["error"])]
    if "sharding" not in a:
        return [error_box("no run.json: run `sptrace check RUN --batch B --seq S --hidden H` for this run")]
    report = a["sharding"]
    saved = report.saved.copy()
    saved["shape"] = saved["shape"].map(lambda s: "x".join(map(str, s)) if s else "")
    parts: list[Any] = [
        html.P(
            "PASS: every activation kept for backward is sharded"
            if report.ok
            else f"FAIL: {len(report.findings)} full-size saves"
        ),
        dcc.Graph(id="memory-graph", figure=figures.saved_by_layer(report.saved)),
        dcc.Graph(id="memory-over-step", figure=figures.memory_over_step(a["memory"])),
        html.Ul([html.Li(f.message) for f in report.findings[:100]]),
        grid(
            saved[["rank", "module", "layer", "shape", "dtype", "nbytes", "storage_bytes", "class", "why", "source"]],
            "memory-grid",
        ),
    ]
    return parts


def layout(store: RunStore) -> Any:
    return html.Div([html.H2("Memory"), run_selector(store, "memory"), html.Div(id="memory-body")])


def register(app: Any, store: RunStore) -> None:
    @app.callback(Output("memory-body", "children"), Input("memory-run", "value"))
    def _show(index: int) -> list[Any]:
        return view(store, index)
