"""Timeline: one lane per rank on clocks aligned across ranks, collectives over their transfer
and compute beneath them, the step's phases as background bands; zoom to a layer or a phase
(kept in the URL: ``/timeline?run=0&layer=1``)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode

import dash_mantine_components as dmc
import plotly.graph_objects as go
from dash import Dash, Input, NoUpdate, Output, State, ctx, dcc, html, no_update
from dash.development.base_component import Component
from sptrace.dashboards.export_route import export_href
from sptrace.dashboards.pages import whatif_panel
from sptrace.dashboards.pages.common import ClickData, View, error_box, graph, grid, page_title, verdict_badge
from sptrace.dashboards.store import RunStore

from sptrace.analysis import RunAnalysis
from sptrace.lane_window import MAX_POINTS, RESOLUTION
from sptrace.lanes import events_around, stragglers
from sptrace.report.timeline import timeline
from sptrace.vocab.errors import SptraceError

PHASES = ("forward", "backward", "optimizer")


def layer_options(a: RunAnalysis) -> list[dict[str, str]]:
    layers = sorted(int(x) for x in a.collectives["layer"].dropna().unique()) if len(a.collectives) else []
    return [{"label": "all layers", "value": "all"}] + [{"label": f"layer {i}", "value": str(i)} for i in layers]


MAX_LANES = 32
"""Past this many ranks the Timeline shows one group of ranks at a time, never a lane per rank."""


def rank_groups(ranks: list[int], size: int = MAX_LANES) -> list[list[int]]:
    """The run's ranks in consecutive groups of ``size`` (node-sized blocks: 8-GPU nodes fit whole)."""
    return [ranks[i : i + size] for i in range(0, len(ranks), size)]


def chosen_group(a: RunAnalysis, view: View) -> tuple[list[list[int]], int | None]:
    """(the rank groups, the one to show): ``ranks=<first rank>`` in the URL, else the group of
    the rank that caused the most waiting. None when every rank fits in one view."""
    ranks = sorted(a.run.ranks)
    if len(ranks) <= MAX_LANES:
        return [ranks], None
    groups = rank_groups(ranks)
    wanted = view.params.get("ranks")
    first = int(wanted) if wanted and wanted.isdigit() else None
    if first is None and a.matching is not None:
        top = stragglers(a, 1)
        first = int(top["rank"].iloc[0]) if len(top) else None
    index = next((i for i, g in enumerate(groups) if first in g), 0)
    return groups, index


def export_link(a: RunAnalysis, run: int, shown: list[int] | None) -> Component:
    """A link that downloads the ranks shown as one merged trace (sptrace export) for Perfetto."""
    ranks = shown if shown is not None else sorted(a.run.ranks)
    return html.A("download merged trace", href=export_href(run, ranks), id="timeline-export", className="sptrace-link",
                  title="these ranks on aligned clocks, with sptrace's tracks: open it in ui.perfetto.dev")  # fmt: skip


def zoom(view: View) -> tuple[int | None, str | None]:
    layer = view.params.get("layer")
    phase = view.params.get("phase")
    return (int(layer) if layer and layer.isdigit() else None), (phase if phase in PHASES else None)


def render(store: RunStore, view: View) -> list[Component]:
    a = store.get(view.run)
    head = page_title("Timeline", "Each rank's lane: collectives over their transfer, compute beneath, phases behind. "
                      "Hover a collective for its bytes, bandwidth, layer, module and peers.")  # fmt: skip
    if isinstance(a, SptraceError):
        return [head, error_box(str(a))]
    layer, phase = zoom(view)
    present = sorted(set(a.phases["phase"])) if len(a.phases) else []
    controls = dmc.Group([
        dmc.Select(id="timeline-layer", data=layer_options(a), value="all" if layer is None else str(layer),
                   allowDeselect=False, w=160, size="sm", label="zoom to a layer"),
        dmc.SegmentedControl(id="timeline-phase", value=phase or "step", size="sm",
                             data=[{"label": "whole step", "value": "step"}]
                             + [{"label": p, "value": p} for p in PHASES if p in present]),
        verdict_badge("collectives", a.collectives_verdict, a.comm_unavailable),
    ], align="flex-end", gap="lg", mb="sm")  # fmt: skip
    groups, index = chosen_group(a, view)
    if index is not None:  # many ranks: one group of lanes at a time
        from sptrace.vocab.units import rank_ranges

        controls.children.insert(0, dmc.Select(
            id="timeline-ranks", data=[{"label": f"ranks {rank_ranges(g)}", "value": str(g[0])} for g in groups],
            value=str(groups[index][0]), allowDeselect=False, searchable=True, w=170, size="sm",
            label=f"rank group ({len(groups)} of {MAX_LANES})",
        ))  # fmt: skip
    t = a.facts
    facts = []
    if t.step_ms is not None:
        facts.append(f"step {t.step_ms:.1f} ms (slowest rank)")
    if t.comm_ms is not None:
        facts.append(f"{t.comm_ms:.1f} ms of transfer per rank")
    facts.append(f"{len(a.collectives)} collectives on {a.collectives['rank'].nunique() if len(a.collectives) else 0} "
                 "ranks")  # fmt: skip
    shown = groups[index] if index is not None else None
    parts = [
        head, controls,
        dmc.Group([dmc.Text(" · ".join(facts), size="sm", c="dimmed"), export_link(a, view.run, shown)], gap="lg"),
        graph("timeline-graph", whole_view(store, a, view.run, layer, phase, shown)),
        dcc.Store(id="timeline-zoom", data=None),  # the x range asked for (the browser's, from each zoom)
        dcc.Store(id="timeline-window", data=None),  # the x range the figure holds (the server's)
    ]  # fmt: skip
    parts.append(html.Div(dmc.Text("Click a collective to list the events around it on its rank (read from the "
                                   "run's table cache, that window only).", size="sm", c="dimmed", mt="xs"),
                          id="timeline-events"))  # fmt: skip
    parts += critical_path_section(a)
    parts += whatif_panel.panel(a)
    if index is not None:  # the whole run at a glance: who arrived late, at which collective
        from sptrace.dashboards.pages.collectives import skew_section

        parts += skew_section(a, "timeline")
    return parts


def lanes_figure(
    a: RunAnalysis, run: int, layer: int | None, phase: str | None, shown: list[int] | None,
    window: tuple[float, float] | None = None, max_points: int = MAX_POINTS,
) -> go.Figure:  # fmt: skip
    """The Timeline's figure: the whole step (or the layer's or phase's extent), or ``window`` (ms
    from the step start) when the user zoomed; at most about MAX_POINTS points either way."""
    fig = timeline(a, layer=layer, phase=None if layer is not None else phase, ranks=shown, max_lanes=MAX_LANES,
                   window=window, max_points=max_points, resolution=RESOLUTION)  # fmt: skip
    # the user's zoom, pan and legend choices survive a fetched window (plotly keeps what the user
    # changed while uirevision stays the same); another run, layer, phase or rank group starts afresh
    fig.update_layout(uirevision=f"{run}-{layer}-{phase}-{shown[0] if shown else 'all'}")
    return fig


def whole_view(
    store: RunStore, a: RunAnalysis, run: int, layer: int | None, phase: str | None, shown: list[int] | None
) -> go.Figure:  # fmt: skip
    """The figure of the whole step (or a layer's or phase's extent), drawn once per run and zoom and
    kept by the store: coming back to the Timeline, or zooming all the way out, draws no figure again."""
    key = f"timeline {layer} {phase} {shown[0] if shown else 'all'} {store.timeline_points}"
    return store.cached(run, key, lambda: lanes_figure(a, run, layer, phase, shown, max_points=store.timeline_points))


ZOOMED_OUT = "all"
X_RANGE = """function(relayout) {
    // the x range a zoom or pan asked for (ms), "all" for autorange; nothing for any other relayout (a y
    // zoom, the drag mode, plotly's own autosize), so that a later autosize never cancels a zoom's fetch
    const skip = window.dash_clientside.no_update;
    if (!relayout) return skip;
    if (relayout['xaxis.autorange']) return 'all';
    let lo = relayout['xaxis.range[0]'], hi = relayout['xaxis.range[1]'];
    if (lo === undefined && Array.isArray(relayout['xaxis.range'])) [lo, hi] = relayout['xaxis.range'];
    lo = Number(lo); hi = Number(hi);
    return lo === lo && hi === hi && hi > lo ? [lo, hi] : skip;
}"""
"""Run in the browser (a clientside callback): the server hears of x changes alone. Were relayoutData
the server's input, plotly's autosize right after a zoom would supersede the zoom's request, and
the zoom's detail would never come."""


def critical_path_section(a: RunAnalysis) -> list[Component]:
    """The critical path (the red line across the lanes): who cost the step the most, its time
    by kind and by module."""
    path = a.critical_path
    if path is None:
        return []
    return [
        dmc.Title("Critical path", order=4, mt="lg"),
        dmc.Text(path.headline(), id="critical-path-summary", fw=500),
        dmc.Text(f"{path.step_us / 1e3:.2f} ms: {path.kinds_text(' · ')}", size="sm", c="dimmed", mb="xs"),
        grid(path.module_table(40), "critical-path", "time on the path by module"),
        *([dmc.Text(f"each profiled step's path (the one above is {path.step}'s, the slowest)", size="sm", mt="sm"),
           grid(path.step_table(), "critical-path-steps", "each step's critical path")] if path.steps else []),
        grid(path.sequence(), "critical-path-sequence", "the path in order"),
    ]  # fmt: skip


def register(app: Dash, store: RunStore) -> None:
    whatif_panel.register(app, store)

    @app.callback(
        Output("timeline-events", "children"),
        Input("timeline-graph", "clickData"),
        State("header-run", "value"),
        prevent_initial_call=True,
    )
    def _events(click: ClickData | None, run: str | None) -> Component | NoUpdate:
        """The window of events around the clicked collective, on its rank, from the run store."""
        a = store.get(run)
        point = (click or {}).get("points", [{}])[0]
        custom = point.get("customdata")
        if isinstance(a, SptraceError) or not isinstance(custom, list) or len(custom) < 14:
            return no_update
        window = events_around(a, int(custom[0]), float(custom[12]), float(custom[13]))
        title = f"events on rank {window.rank}, {window.start_ms:.2f} to {window.end_ms:.2f} ms"
        return grid(window.events, "timeline-events", title, height=360)

    app.clientside_callback(X_RANGE, Output("timeline-zoom", "data"), Input("timeline-graph", "relayoutData"),
                            prevent_initial_call=True)  # fmt: skip

    @app.callback(
        Output("timeline-graph", "figure"),
        Output("timeline-window", "data"),
        Input("timeline-zoom", "data"),
        State("timeline-window", "data"),
        State("url", "search"),
        State("header-run", "value"),
        prevent_initial_call=True,
    )
    def _window(
        wanted: list[float] | str | None, fetched: list[float] | None, search: str | None, run: str | None
    ) -> tuple[go.Figure | NoUpdate, list[float] | NoUpdate | None]:
        """A zoom or pan fetches the detail of the range shown (and zooming out, the whole step
        again): the server sends that window, decimated to its own resolution."""
        if wanted is None:
            return no_update, no_update
        window = None if wanted == ZOOMED_OUT else [float(x) for x in wanted]
        if window == fetched:
            return no_update, no_update
        a = store.get(run)
        if isinstance(a, SptraceError):
            return no_update, no_update
        query = {k: v[-1] for k, v in parse_qs((search or "").lstrip("?")).items()}
        view = View("timeline", int(run or 0), None, query)
        layer, phase = zoom(view)
        groups, index = chosen_group(a, view)
        shown = groups[index] if index is not None else None
        if window is None:
            figure = whole_view(store, a, view.run, layer, phase, shown)
        else:
            figure = lanes_figure(a, view.run, layer, phase, shown, (window[0], window[1]),
                                  max_points=store.timeline_points)  # fmt: skip
        return figure, window

    @app.callback(
        Output("url", "search", allow_duplicate=True),
        Input("timeline-ranks", "value"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def _ranks(first: str | None, search: str | None) -> str | NoUpdate:
        """The rank group is part of the URL, as a zoom is."""
        query = {k: v[-1] for k, v in parse_qs((search or "").lstrip("?")).items()}
        if first is None or query.get("ranks") == first:
            return no_update
        query["ranks"] = first
        return "?" + urlencode(query)

    @app.callback(
        Output("url", "search", allow_duplicate=True),
        Input("timeline-layer", "value"),
        Input("timeline-phase", "value"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def _zoom(layer: str | None, phase: str | None, search: str | None) -> str | NoUpdate:
        """A zoom is part of the URL: the router redraws the page from it, and the link shares it."""
        query = {k: v[-1] for k, v in parse_qs((search or "").lstrip("?")).items()}
        query.pop("layer", None)
        query.pop("phase", None)
        if ctx.triggered_id == "timeline-layer" and layer not in (None, "all"):
            query["layer"] = layer
        elif ctx.triggered_id == "timeline-phase" and phase not in (None, "step"):
            query["phase"] = phase
        new = "?" + urlencode(query)
        return new if new != (search or "") else no_update
