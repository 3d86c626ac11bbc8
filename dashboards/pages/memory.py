"""Memory: activations kept for backward per rank, by module and sharding class, per layer."""

from __future__ import annotations

from typing import Any

from dash import Input, Output, dcc, html
from sptrace.dashboards.pages.common import error_box, grid, run_selector
from sptrace.dashboards.store import RunStore

from sptrace.errors import SptraceError
from sptrace.report import figures


def view(store: RunStore, index: int) -> list[Any]:
    a = store.get(index)
    if isinstance(a, SptraceError):
        return [error_box(str(a))]
    memory = dcc.Graph(id="memory-over-step", figure=figures.memory_over_step(a.memory))
    if a.sharding is None:
        return [error_box(f"sharding not checked: {a.sharding_unavailable}"), memory]
    report = a.sharding
    saved = report.saved.copy()
    saved["shape"] = saved["shape"].map(lambda s: "x".join(map(str, s)) if isinstance(s, (tuple, list)) else "")
    columns = [
        "rank",
        "module",
        "layer",
        "shape",
        "dtype",
        "nbytes",
        "storage_bytes",
        "class",
        "why",
        "holder",
        "source",
    ]
    parts: list[Any] = [
        html.P(report.verdict.line(), className="verdict"),
        *[html.P(f"note: {n}") for n in report.notes],
        dcc.Graph(id="memory-graph", figure=figures.saved_by_layer(report.saved)),
        memory,
        html.Ul([html.Li(f.text()) for f in report.findings[:100]]),
        grid(saved[columns], "memory-grid"),
    ]
    return parts


def layout(store: RunStore) -> Any:
    return html.Div([html.H2("Memory"), run_selector(store, "memory"), html.Div(id="memory-body")])


def register(app: Any, store: RunStore) -> None:
    @app.callback(Output("memory-body", "children"), Input("memory-run", "value"))
    def _show(index: int) -> list[Any]:
        return view(store, index)
