"""The Dash app over the runs named on the command line (``sptrace dash RUN...``)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import dash
from dash import Dash, dcc, html

from dashboards.pages import collectives, compare, gpu, memory, overview, timeline
from dashboards.store import RunStore

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
    nav = [dcc.Link(title, href=path, style={"marginRight": "1.5em"}) for _, path, title, _ in PAGES]
    app.layout = html.Div(
        [html.H1("sptrace"), html.Nav(nav), html.Hr(), dash.page_container], style={"margin": "1em 2em"}
    )
    app.sptrace_store = store  # type: ignore[attr-defined]
    return app


def serve(
    paths: list[Path], host: str = "127.0.0.1", port: int = 8050, debug: bool = False,
    sweeps: list[Path] | None = None, analyses: list | None = None,
) -> Any:  # fmt: skip
    app = create_app(paths, sweeps, analyses)
    return app.run(host=host, port=port, debug=debug)
