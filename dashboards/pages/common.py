"""Pieces every page uses: the run selector, error boxes, grids."""

from __future__ import annotations

from typing import Any

import dash_ag_grid as dag
import pandas as pd
from dash import dcc, html
from sptrace.dashboards.store import RunStore


def run_selector(store: RunStore, page: str) -> Any:
    return dcc.Dropdown(id=f"{page}-run", options=store.options(), value=0, clearable=False, style={"width": "420px"})


def error_box(message: str) -> Any:
    return html.Div(message, className="run-error", style={"color": "#b00", "fontWeight": "bold"})


def grid(frame: pd.DataFrame, grid_id: str, max_rows: int = 5000) -> Any:
    shown = frame.head(max_rows).copy()
    for col in shown.columns:
        if shown[col].dtype == object:
            shown[col] = shown[col].map(lambda v: v if isinstance(v, (str, int, float, type(None))) else str(v))
    return dag.AgGrid(
        id=grid_id,
        rowData=shown.to_dict(orient="records"),
        columnDefs=[{"field": c, "filter": True, "sortable": True, "resizable": True} for c in shown.columns],
        dashGridOptions={"pagination": True, "paginationPageSize": 50},
        columnSize="responsiveSizeToFit",  # every column in view
        style={"height": "420px"},
    )
