"""The Dash app over the runs named on the command line (``sptrace dash RUN...``).

Components come from dash-mantine-components rather than dash-bootstrap-components: Mantine 2
bundles its CSS inside the component JS that Dash serves from the installed package, while
Bootstrap's CSS is a separate stylesheet that dbc points at a CDN (an air-gapped cluster would
have to vendor it). Every figure uses sptrace.report.theme's template, whose fonts and colours
match Mantine's theme. Nothing is fetched from outside the machine.

Routing is this module's own (no ``dash.register_page``, whose registry is global to the
process): one callback maps the URL (``/memory?run=2``) to a page, so each app created here has
its own pages and store, links can be shared, and the back button works.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import dash_mantine_components as dmc
from dash import MATCH, Dash, Input, NoUpdate, Output, ctx, dcc, html, no_update
from dash.development.base_component import Component
from sptrace.dashboards.export_route import EXPORT_PATH, register_export
from sptrace.dashboards.pages import collectives, compare, diff, gpu, memory, overview, timeline
from sptrace.dashboards.pages.common import View, error_box, href
from sptrace.dashboards.store import RunStore

from sptrace.analysis import RunAnalysis
from sptrace.report.theme import FONT

PAGES = {
    "/": ("overview", "Overview", overview),
    "/timeline": ("timeline", "Timeline", timeline),
    "/collectives": ("collectives", "Collectives", collectives),
    "/memory": ("memory", "Memory", memory),
    "/compare": ("compare", "Compare", compare),
    "/diff": ("diff", "Diff", diff),
    "/gpu": ("gpu", "GPU (HTA)", gpu),
}
ASSETS = Path(__file__).parent / "assets"
DIFF_SELECT_W = 168
"""The Diff page's base and new selects (px): with the brand and the nav, one row at a 1440 px window."""
THEME = {"fontFamily": FONT, "headings": {"fontFamily": FONT}, "primaryColor": "blue", "defaultRadius": "sm"}
log = logging.getLogger(__name__)


def parse_view(store: RunStore, pathname: str | None, search: str | None) -> View | None:
    """The view a URL names, or None for a page that does not exist. A run index outside the
    store falls back to run 0 here; the server answers such a full URL with a 404 first."""
    page = PAGES.get(pathname or "/")
    if page is None:
        return None
    query = {k: v[-1] for k, v in parse_qs((search or "").lstrip("?")).items()}
    run = _index(query.pop("run", "0"), len(store)) or 0
    runs_text = query.pop("runs", "")
    runs = [i for i in (_index(x, len(store)) for x in runs_text.split(",")) if i is not None] if runs_text else None
    return View(page[0], run, runs, query)


def _index(text: str, n: int) -> int | None:
    try:
        i = int(text)
    except ValueError:
        return None
    return i if 0 <= i < n else None


def header(store: RunStore) -> Component:
    nav = html.Nav(
        [dcc.Link(title, href=path, id=f"nav-{key}", className="nav-link") for path, (key, title, _) in PAGES.items()],
        className="sptrace-nav", style={"display": "flex", "gap": "2px"},
    )  # fmt: skip
    options = store.options()
    run_select = dmc.Select(
        id="header-run", data=options, value="0" if options else None, allowDeselect=False, w=340,
        searchable=len(options) > 8, comboboxProps={"width": "max-content"}, size="sm", **{"aria-label": "run"},
        leftSection=dmc.Text("run", size="xs", c="dimmed"), leftSectionWidth=40,
    )  # fmt: skip
    # runs to compare: a checkbox list in a popover, so that a dozen runs never crowd the header
    runs_select = dmc.Popover(
        [
            dmc.PopoverTarget(dmc.Button(f"{len(options)} of {len(options)} runs", id="header-runs-label",
                                         variant="default", size="sm", w=200)),
            dmc.PopoverDropdown(dmc.CheckboxGroup(
                dmc.Stack([dmc.Checkbox(label=o["label"], value=o["value"]) for o in options], gap=6),
                id="header-runs", value=[o["value"] for o in options], label="runs to compare",
            )),
        ],
        position="bottom-end", shadow="md", withArrow=True,
    )  # fmt: skip
    brand = dcc.Link(
        dmc.Group([dmc.Text("sptrace", fw=800, size="xl", c="blue.7"),
                   dmc.Text("sequence-parallel trace analyzer", size="xs", c="dimmed", className="brand-subtitle")],
                  gap=8, align="baseline", wrap="nowrap"),
        href="/", style={"textDecoration": "none"},
    )  # fmt: skip
    # the Diff page's pair, compact ("base [..] → [..] new"): narrow selects cut a long name short and say it
    # whole on hover (their wrapper's title) and in their dropdown, so the header stays one row at 1440 px
    pair = dmc.Group([
        dmc.Text("base", size="xs", c="dimmed"),
        html.Div(dmc.Select(id="diff-base", data=options, value="0" if options else None, allowDeselect=False,
                            w=DIFF_SELECT_W, size="sm", comboboxProps={"width": "max-content"},
                            **{"aria-label": "baseline"}), id="diff-base-wrap"),
        dmc.Text("→", size="sm", c="dimmed"),
        html.Div(dmc.Select(id="diff-new", data=options, value="1" if len(options) > 1 else "0" if options else None,
                            allowDeselect=False, w=DIFF_SELECT_W, size="sm", comboboxProps={"width": "max-content"},
                            **{"aria-label": "new run"}), id="diff-new-wrap"),
        dmc.Text("new", size="xs", c="dimmed"),
    ], gap=6, wrap="nowrap")  # fmt: skip
    selectors = dmc.Group([
        html.Div(run_select, id="header-run-wrap"),
        html.Div(runs_select, id="header-runs-wrap", style={"display": "none"}),
        html.Div(pair, id="header-diff-wrap", style={"display": "none"}),
    ], gap="sm", wrap="nowrap")  # fmt: skip
    left = dmc.Group([brand, nav], gap="lg", wrap="nowrap", style={"minWidth": 0})
    return dmc.AppShellHeader(dmc.Group([left, selectors], justify="space-between", h="100%", px="lg", gap="md",
                                        wrap="nowrap"))  # fmt: skip


def not_found(pathname: str) -> Component:
    return dmc.Stack([
        dmc.Title("No such page", order=2),
        dmc.Text(f"{pathname} is not a page of this dashboard."),
        dcc.Link("back to the overview", href="/", id="not-found-home", className="sptrace-link"),
    ], className="not-found")  # fmt: skip


def create_app(
    paths: list[Path], sweeps: list[Path] | None = None, analyses: list[RunAnalysis] | None = None,
    options: dict[str, Any] | None = None, timeline_points: int | None = None,
) -> Dash:  # fmt: skip
    """``paths``: the runs; ``sweeps``: sptrace sweep folders, shown on the Compare page;
    ``analyses``: the runs' analyses when the caller already has them (sptrace demo);
    ``options``: analyse_run's for every run (the model flags, load options);
    ``timeline_points``: the most points the Timeline sends for one view (default
    sptrace.lane_window.MAX_POINTS)."""
    store = RunStore(paths, sweeps or [], analyses, options)
    if timeline_points is not None:
        store.timeline_points = timeline_points
    app = Dash(__name__, title="sptrace", update_title=None, suppress_callback_exceptions=True,
               assets_folder=str(ASSETS), serve_locally=True)  # fmt: skip
    app.layout = dmc.MantineProvider(
        [
            dcc.Location(id="url", refresh="callback-nav"),
            dmc.AppShell(
                [header(store), dmc.AppShellMain(html.Div(id="page", style={"padding": "20px 28px 40px"}))],
                header={"height": 60}, padding=0,
            ),
        ],
        theme=THEME, forceColorScheme="light",
    )  # fmt: skip
    keys = [key for key, _, _ in PAGES.values()]

    @app.callback(
        Output("page", "children"),
        Output("url", "search", allow_duplicate=True),
        Output("header-run", "value"),
        Output("header-runs", "value"),
        Output("header-run-wrap", "style"),
        Output("header-runs-wrap", "style"),
        Output("header-runs-label", "children"),
        Output("header-diff-wrap", "style"),
        Output("diff-base", "value"),
        Output("diff-new", "value"),
        *[Output(f"nav-{k}", "href") for k in keys],
        *[Output(f"nav-{k}", "className") for k in keys],
        Input("url", "pathname"),
        Input("url", "search"),
        Input("header-run", "value"),
        Input("header-runs", "value"),
        prevent_initial_call="initial_duplicate",
    )
    def _route(pathname: str, search: str, run: str | None, runs: list[str] | None) -> tuple:
        view = parse_view(store, pathname, search)
        new_search: str | NoUpdate = no_update
        if view is not None and ctx.triggered_id == "header-run" and run is not None and int(run) != view.run:
            # another run: the page's own settings (a layer, a phase) belonged to the old one
            view = replace(view, run=int(run), params={})
            new_search = view.search()
        elif view is not None and ctx.triggered_id == "header-runs" and runs is not None:
            chosen = sorted(int(r) for r in runs)
            view = replace(view, runs=None if chosen == list(range(len(store))) else chosen)
            new_search = view.search()
        if view is None:
            content: Component | list[Component] = not_found(pathname)
        else:
            try:
                content = PAGES[pathname or "/"][2].render(store, view)
            except Exception as exc:  # a bug in one view must not take the app down: say what broke
                log.exception("rendering %s%s", pathname, search)
                content = error_box(f"{type(exc).__name__}: {exc}", title="this view failed")
        current = view or View("overview")
        on_compare = current.page == "compare"
        on_diff = current.page == "diff"  # its pair is chosen on the page
        return (
            content,
            new_search,
            str(current.run),
            [str(r) for r in current.chosen(len(store))],
            {"display": "none"} if on_compare or on_diff else {},
            {} if on_compare else {"display": "none"},
            f"{len(current.chosen(len(store)))} of {len(store)} runs",
            {} if on_diff else {"display": "none"},
            *((str(i) for i in diff.pair(current, len(store))) if on_diff and len(store) else (no_update, no_update)),
            *[href(k, current.run) for k in keys],
            *["nav-link active" if k == current.page else "nav-link" for k in keys],
        )

    @app.callback(
        Output("diff-base-wrap", "title"),
        Output("diff-new-wrap", "title"),
        Input("diff-base", "value"),
        Input("diff-new", "value"),
    )
    def _pair_titles(base: str | None, new: str | None) -> tuple[str, str]:
        """The pair's whole run names on hover: a narrow select cuts a long one short."""

        def name(value: str | None) -> str:
            index = _index(value or "", len(store))
            return store.name(index) if index is not None else "none"

        return f"base: {name(base)}", f"new: {name(new)}"

    @app.callback(
        Output({"type": "sptrace-grid", "name": MATCH}, "exportDataAsCsv"),
        Input({"type": "sptrace-csv", "name": MATCH}, "n_clicks"),
        prevent_initial_call=True,
    )
    def _csv(clicks: int | None) -> bool:
        return bool(clicks)

    for _, _, module in PAGES.values():
        if hasattr(module, "register"):
            module.register(app, store)
    register_export(app, store)  # the Timeline's merged-trace download
    _serve_404(app, store)
    app.sptrace_store = store  # type: ignore[attr-defined]
    return app


_DASH_PREFIXES = ("/_dash", "/_reload-hash", "/_favicon", "/assets/", "/_alive")
"""Dash's own routes (layout, callbacks, component bundles, assets)."""


def _serve_404(app: Dash, store: RunStore) -> None:
    @app.server.before_request
    def _not_found() -> tuple[str, int, dict[str, str]] | None:
        """Dash answers every path with its page shell (200); an unknown page, or a run this
        dashboard does not serve, is a 404 here with a link back, so a mistyped or stale link
        says so to browsers and tools alike."""
        from flask import request

        path = request.path
        if path.startswith(_DASH_PREFIXES) or path == EXPORT_PATH:  # (the download says its own problems)
            return None
        problem = None
        if path not in PAGES:
            problem = f"{path} is not a page of this dashboard"
        else:
            for key in ("run", "runs", "base", "new"):
                for value in request.args.getlist(key):
                    if any(_index(v, len(store)) is None for v in value.split(",")):
                        problem = f"no run {value!r}: this dashboard serves runs 0 to {len(store) - 1}"
        if problem is None:
            return None
        import html as html_escape

        body = '<!DOCTYPE html><html><head><meta charset="utf-8"><title>sptrace: no such page</title></head>'
        body += f"<body><h1>No such page</h1><p>{html_escape.escape(problem)}</p>"
        body += '<p><a href="/">back to the sptrace overview</a></p></body></html>'
        return body, 404, {"Content-Type": "text/html; charset=utf-8"}


def serve(
    paths: list[Path], host: str = "127.0.0.1", port: int = 8050, debug: bool = False,
    sweeps: list[Path] | None = None, analyses: list[RunAnalysis] | None = None, options: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    import logging

    app = create_app(paths, sweeps, analyses, options)
    app.sptrace_store.warm()  # type: ignore[attr-defined]
    if not debug:  # one line per request drowns sptrace's own messages; --debug keeps them
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    return app.run(host=host, port=port, debug=debug)
