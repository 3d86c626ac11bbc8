"""Collectives: the table of every rank's collectives, per-kind bytes against the model, and
the matched collectives with skew, straggler and bandwidth."""

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
    frame = a["collectives"]
    parts: list[Any] = [
        dcc.Graph(id="collectives-wire", figure=figures.wire_by_kind(frame, a["config"])),
        dcc.Graph(id="collectives-layers", figure=figures.wire_by_layer(frame)),
    ]
    if "comm" in a:
        findings = [html.Li(f.message) for f in a["comm"].findings[:100]]
        parts.append(html.Div([html.H4(f"findings ({len(a['comm'].findings)})"), html.Ul(findings)]))
    parts.append(html.H4("every collective"))
    parts.append(grid(frame, "collectives-grid"))
    matched = a["matching"].matched
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
