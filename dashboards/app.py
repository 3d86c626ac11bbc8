"""The Dash app over the runs named on the command line (``sptrace dash RUN...``)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import dash
from dash import Dash, dcc, html
from sptrace.dashboards.pages import collectives, compare, gpu, memory, overview, timeline
from sptrace.dashboards.store import RunStore

PAGES = (
    ("overview", "/", "Overview", overview),
    ("timeline", "/timeline", "Timeline", timeline),
    ("collectives", "/collectives", "Collectives", collectives),
    ("memory", "/memory", "Memory", memory),
    ("compare", "/compare", "Compare", compare),
    ("gpu", "/gpu", "GPU (HTA)", gpu),
)


def create_app(paths: list[Path], sweeps: list[Path] | None = None, analyses: list | None = None) -> Dash:
    """``paths``: the runs; ``sweeps``: sptrace sweep folders, shown on the Compare page;
    ``analyses``: the runs' analyses when the caller already has them (sptrace demo)."""
    store = RunStore(paths, sweeps or [], analyses)
    app = Dash(__name__, use_pages=True, pages_folder="", suppress_callback_exceptions=True, title="sptrace")
    for name, path, title, module in PAGES:
        dash.register_page(f"sptrace.{name}", path=path, name=title, layout=partial(module.layout, store))
        if hasattr(module, "register"):
            module.register(app, store)
    # a link the app does not know, followed inside the page: say so and link back
    dash.register_page("not_found_404", layout=html.Div(
        [html.H2("No such page"), dcc.Link("back to the overview", href="/", id="not-found-home")],
        className="not-found",
    ))  # fmt: skip
    nav = [dcc.Link(title, href=path, style={"marginRight": "1.5em"}) for _, path, title, _ in PAGES]
    app.layout = html.Div(
        [html.H1("sptrace"), html.Nav(nav), html.Hr(), dash.page_container], style={"margin": "1em 2em"}
    )
    known = {path for _, path, _, _ in PAGES}

    @app.server.before_request
    def _not_found() -> Any:
        """Dash answers every path with its page shell (200); an unknown one is a 404 here, with a
        link back, so a mistyped or stale link says so to browsers and tools alike."""
        from flask import request

        path = request.path
        if path in known or path.startswith(_DASH_PREFIXES):
            return None
        body = '<!DOCTYPE html><html><head><meta charset="utf-8"><title>sptrace: no such page</title></head>'
        body += '<body><h1>No such page</h1><p><a href="/">back to the sptrace overview</a></p></body></html>'
        return body, 404, {"Content-Type": "text/html; charset=utf-8"}

    app.sptrace_store = store  # type: ignore[attr-defined]
    return app


_DASH_PREFIXES = ("/_dash", "/_reload-hash", "/_favicon", "/assets/", "/_alive")
"""Dash's own routes (layout, callbacks, component bundles, assets)."""


def serve(
    paths: list[Path], host: str = "127.0.0.1", port: int = 8050, debug: bool = False,
    sweeps: list[Path] | None = None, analyses: list | None = None,
) -> Any:  # fmt: skip
    app = create_app(paths, sweeps, analyses)
    return app.run(host=host, port=port, debug=debug)
