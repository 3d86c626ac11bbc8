"""Collectives: the table of every rank's collectives, per-kind bytes against the model, and
the matched collectives with skew, straggler and bandwidth."""

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
    frame = a.collectives
    parts: list[Any] = [
        dcc.Graph(id="collectives-wire", figure=figures.wire_by_kind(frame, a.estimate)),
        dcc.Graph(id="collectives-layers", figure=figures.wire_by_layer(frame)),
    ]
    if a.comm is not None:
        parts.append(html.P(a.comm.verdict.line(), className="verdict"))
        findings = [html.Li(f.text()) for f in a.comm.findings[:100]]
        parts.append(html.Div([html.H4(f"findings ({len(a.comm.findings)})"), html.Ul(findings)]))
    else:
        parts.append(html.P(f"not checked against the cost model: {a.comm_unavailable}", className="verdict"))
    parts.append(html.H4("every collective"))
    parts.append(grid(frame, "collectives-grid"))
    matched = a.matching.matched if a.matching is not None else frame.iloc[0:0]
    if not matched.empty:
        parts.append(html.H4("matched across ranks"))
        parts.append(grid(matched.drop(columns=["ranks"]), "matched-grid"))
    return parts


def layout(store: RunStore) -> Any:
    return html.Div([html.H2("Collectives"), run_selector(store, "collectives"), html.Div(id="collectives-body")])


def register(app: Any, store: RunStore) -> None:
    @app.callback(Output("collectives-body", "children"), Input("collectives-run", "value"))
    def _show(index: int) -> list[Any]:
        return view(store, index)
