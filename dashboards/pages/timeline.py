"""Timeline: ranks as rows, collectives on a clock aligned across ranks; zoom to one layer.
Only collectives are drawn (hundreds per step, not the trace's hundreds of thousands of events),
at most 5000 of them."""

from __future__ import annotations

from typing import Any

from dash import Input, Output, dcc, html
from sptrace.dashboards.pages.common import error_box, run_selector
from sptrace.dashboards.store import RunStore

from sptrace.errors import SptraceError
from sptrace.report import figures


def layer_options(store: RunStore, index: int) -> list[dict[str, Any]]:
    a = store.get(index)
    if isinstance(a, SptraceError) or a.collectives.empty:
        return [{"label": "all layers", "value": "all"}]
    layers = sorted(int(x) for x in a.collectives["layer"].dropna().unique())
    return [{"label": "all layers", "value": "all"}] + [{"label": f"layer {i}", "value": i} for i in layers]


def view(store: RunStore, index: int, layer: Any = "all") -> Any:
    a = store.get(index)
    if isinstance(a, SptraceError):
        return error_box(str(a))
    frame = a.collectives
    if layer not in (None, "all"):
        frame = frame[frame["layer"] == int(layer)]
    phases = a.phases if layer in (None, "all") else None
    m = a.matching
    figure = figures.collective_timeline(
        frame, m.offsets_us if m else {}, phases=phases, links=m.members if m else None
    )
    return dcc.Graph(id="timeline-graph", figure=figure)


def layout(store: RunStore) -> Any:
    return html.Div([
        html.H2("Timeline"), run_selector(store, "timeline"),
        dcc.Dropdown(id="timeline-layer", options=[{"label": "all layers", "value": "all"}], value="all",
                     clearable=False, style={"width": "200px"}),
        html.Div(id="timeline-body"),
    ])  # fmt: skip


def register(app: Any, store: RunStore) -> None:
    @app.callback(Output("timeline-layer", "options"), Input("timeline-run", "value"))
    def _layers(index: int) -> list[dict[str, Any]]:
        return layer_options(store, index)

    @app.callback(Output("timeline-body", "children"), Input("timeline-run", "value"), Input("timeline-layer", "value"))
    def _show(index: int, layer: Any) -> Any:
        return view(store, index, layer)
