"""Pieces every page uses: the view a URL asks for, verdict badges, alerts, grids with a CSV
download, and links that keep the chosen run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict
from urllib.parse import urlencode

import dash_ag_grid as dag
import dash_mantine_components as dmc
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from dash import dcc, html
from dash.development.base_component import Component

from sptrace.checks.findings import Finding, Verdict
from sptrace.report.theme import SEVERITY_COLORS, VERDICT_COLORS
from sptrace.report.theme import header as column_header

Cell = str | int | float | bool | None
"""A grid cell as AG Grid receives it (sptrace.dashboards.assets formats bytes and times)."""
Row = dict[str, Cell]
"""A grid row: column -> cell."""


class ClickPoint(TypedDict, total=False):
    """One point of a plotly click (dcc.Graph's ``clickData``), as sptrace's figures fill it: a
    bar's category and the customdata it carries (a kind, a phase, a group; the timeline's list)."""

    x: str
    y: str | float
    customdata: str | list[str | float]


class ClickData(TypedDict):
    """dcc.Graph's ``clickData``: the points clicked."""

    points: list[ClickPoint]


@dataclass
class View:
    """What the URL asks for: ``/memory?run=2``, ``/compare?runs=0,2``, ``/timeline?run=0&layer=1``."""

    page: str
    run: int = 0
    runs: list[int] | None = None
    """The runs to compare; None: every run."""
    params: dict[str, str] = field(default_factory=dict)

    def chosen(self, n: int) -> list[int]:
        return list(range(n)) if self.runs is None else self.runs

    def search(self) -> str:
        query: dict[str, str] = {"run": str(self.run)}
        if self.runs is not None:
            query["runs"] = ",".join(map(str, self.runs))
        query.update({k: v for k, v in self.params.items() if v not in (None, "")})
        return "?" + urlencode(query)


def href(page: str, run: int, **params: str | int | None) -> str:
    path = "/" if page == "overview" else f"/{page}"
    query = {"run": run, **{k: v for k, v in params.items() if v is not None}}
    return f"{path}?{urlencode(query)}"


def page_title(title: str, subtitle: str | None = None) -> Component:
    parts = [dmc.Title(title, order=2)]
    if subtitle:
        parts.append(dmc.Text(subtitle, c="dimmed", size="sm"))
    return dmc.Stack(parts, gap=2, mb="md")


def error_box(message: str, title: str = "this run cannot be shown") -> Component:
    """A run that could not be analysed, or a view that cannot be drawn: the reason, in red."""
    return dmc.Alert(message, title=title, color="red", variant="light", className="run-error", mb="md")


def note_box(message: str, title: str | None = None, color: str = "yellow", class_name: str = "note") -> Component:
    return dmc.Alert(message, title=title, color=color, variant="light", className=class_name, mb="sm")


def verdict_badge(check: str, verdict: Verdict | None, unavailable: str | None = None, size: str = "md") -> Component:
    """The one badge every page uses: green MATCH/PASS, red MISMATCH/FAIL, amber CANNOT DECIDE,
    grey "not checked"; hovering it gives the summary and, when it could not decide, the reasons."""
    if verdict is None:
        status, label, tip = "unavailable", "NOT CHECKED", f"{check} not checked: {unavailable or 'no data'}"
    else:
        status, label = verdict.status, verdict.label
        tip = verdict.summary + "".join(f"\n• {r}" for r in verdict.reasons)
    badge = dmc.Badge(
        label, color=VERDICT_COLORS[status], variant="filled", size=size, radius="sm",
        className=f"verdict-badge verdict-{status}", **{"data-check": check},
    )  # fmt: skip
    return dmc.Tooltip(badge, label=tip, multiline=True, w=420, withArrow=True, style={"whiteSpace": "pre-line"})


def finding_item(f: Finding, run: int) -> Component:
    """One finding, merged across ranks ("ranks 0-7"), linking to the page that shows it."""
    page = f.page or ("memory" if f.check == "sharding" else "collectives")
    params = {"layer": f.layer} if page == "timeline" and f.layer is not None else {}
    where = f.where or "run"
    link = dcc.Link(f"show on {page} →", href=href(page, run, **params), className="sptrace-link finding-link")
    return dmc.Group(
        [
            dmc.Badge(f.severity, color=SEVERITY_COLORS[f.severity], variant="light", size="sm", miw=64),
            dmc.Text([dmc.Text(where, span=True, fw=600), ": ", f.message + f.origin_text(), " ", link], size="sm",
                     style={"flex": 1, "overflowWrap": "anywhere"}),
        ],
        gap="sm", wrap="nowrap", align="flex-start", className="finding",
    )  # fmt: skip


def findings_list(findings: list[Finding], run: int, limit: int = 8) -> Component:
    if not findings:
        return dmc.Text("no findings", c="dimmed", size="sm")
    order = {"error": 0, "warning": 1, "info": 2}
    shown = sorted(findings, key=lambda f: order[f.severity])[:limit]
    items = [finding_item(f, run) for f in shown]
    if len(findings) > limit:
        items.append(dmc.Text(f"and {len(findings) - limit} more", c="dimmed", size="sm"))
    return dmc.Stack(items, gap=6)


# ---- grids -------------------------------------------------------------------------------------

LONG_TEXT = ("module", "why", "holder", "evidence", "message", "source", "op", "producer", "group_ranks", "made_at")
"""Columns whose values can be long: capped width, full text on hover."""


HEADER_CHAR_PX, CELL_CHAR_PX = 8.2, 7.8
"""Generous widths of one character of the grids' 13 px type: bold in headers, regular in cells."""
HEADER_PAD_PX, CELL_PAD_PX = 72, 48
"""A header's padding, sort and menu icons; a cell's padding."""


def _shown_length(frame: pd.DataFrame, col: str) -> int:
    """The longest text a column shows, as the grid's formatters (assets/dashAgGridFunctions.js)
    write it."""
    values = frame[col].head(5000)
    if col.endswith("bytes"):
        return 11  # "1023.99 MiB"
    if col.endswith(("_ms", "_gbps")):
        finite = pd.to_numeric(values, errors="coerce").abs().max()
        return len(f"{finite:.3f}") + 1 if pd.notna(finite) else 4
    texts = (str(c) for c in map(_cell, values) if c is not None)
    return max((len(t) + sum(ch.isupper() for ch in t) // 3 for t in texts), default=0)  # capitals are wider


def column_width(frame: pd.DataFrame, col: str, header: str) -> int:
    """Each column as wide as its content and its header's longest word, computed here: letting
    AG Grid measure (columnSize="autoSize") laid the page out once per cell and row, and made a
    page switch take 1.5 s on 2 cores. Headers wrap between words, so none is ever cut."""
    word = max((len(w) for w in header.split()), default=0)
    cap = 380 if col in LONG_TEXT else 480  # long text is cut there, and shown whole on hover
    content = min(cap, int(_shown_length(frame, col) * CELL_CHAR_PX + CELL_PAD_PX))
    return max(int(word * HEADER_CHAR_PX + HEADER_PAD_PX), content, 70)


ColumnDef = dict[str, str | int | dict[str, str]]
"""One of AG Grid's columnDefs: field, header, width, formatter, filter, type, tooltip field."""


def column_defs(frame: pd.DataFrame) -> list[ColumnDef]:
    defs = []
    for col in frame.columns:
        header = column_header(col)
        d: ColumnDef = {"field": col, "headerName": header, "width": column_width(frame, col, header)}
        numeric = pd.api.types.is_numeric_dtype(frame[col]) and not pd.api.types.is_bool_dtype(frame[col])
        if col.endswith("bytes"):
            d.update(valueFormatter={"function": "sptraceBytes(params.value)"}, filter="agNumberColumnFilter",
                     type="rightAligned")  # fmt: skip
        elif col.endswith(("_ms", "_gbps")):
            d.update(valueFormatter={"function": "sptraceNumber(params.value, 3)"}, filter="agNumberColumnFilter",
                     type="rightAligned")  # fmt: skip
        elif numeric:
            d.update(filter="agNumberColumnFilter", type="rightAligned")
        if col in LONG_TEXT:
            d.update(tooltipField=col)
        defs.append(d)
    return defs


def _cell(v: object) -> Cell:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    if isinstance(v, (tuple, list)):
        if v and all(isinstance(x, (int, np.integer)) for x in v):
            return "×".join(map(str, v))
        return ", ".join(map(str, v))
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (str, int, float, bool)):
        return v
    return str(v)


def records(frame: pd.DataFrame, max_rows: int = 5000) -> list[Row]:
    shown = frame.head(max_rows)
    return [{k: _cell(v) for k, v in row.items()} for row in shown.to_dict(orient="records")]


def grid(frame: pd.DataFrame, name: str, title: str, *, height: int = 420, max_rows: int = 5000) -> Component:
    """An AG Grid over ``frame``: human units (numbers kept, so sorting stays numeric), headers
    wrapped and sized to fit, long text on hover, and a CSV download of what the grid holds."""
    note = f" (the first {max_rows} of {len(frame)})" if len(frame) > max_rows else ""
    short = len(frame) <= 12  # a short table takes its own height, without pages
    return html.Div(
        [
            dmc.Group(
                [
                    dmc.Text([dmc.Text(title, span=True, fw=600), f" · {min(len(frame), max_rows)} rows{note}"],
                             size="sm"),
                    dmc.Button("Download CSV", id={"type": "sptrace-csv", "name": name}, size="compact-sm",
                               variant="light", className="csv-button"),
                ],
                justify="space-between", mb=6,
            ),
            dag.AgGrid(
                id={"type": "sptrace-grid", "name": name},
                rowData=records(frame, max_rows),
                columnDefs=column_defs(frame),
                defaultColDef={"sortable": True, "filter": True, "resizable": True, "wrapHeaderText": True,
                               "autoHeaderHeight": True, "minWidth": 70},
                dashGridOptions={"tooltipShowDelay": 300, "enableCellTextSelection": True,
                                 **({"domLayout": "autoHeight"} if short else {"pagination": True,
                                                                               "paginationPageSize": 50})},
                csvExportParams={"fileName": f"sptrace-{name}.csv"},
                className="ag-theme-alpine",
                style={"width": "100%"} if short else {"height": f"{height}px", "width": "100%"},
            ),
        ],
        id=name, className="sptrace-grid", style={"marginBottom": "1.5rem"},
    )  # fmt: skip


def graph(graph_id: str, figure: go.Figure) -> Component:
    return dcc.Graph(id=graph_id, figure=figure, config={"displaylogo": False, "toImageButtonOptions":
                                                          {"filename": f"sptrace-{graph_id}"}})  # fmt: skip


def card(children: Component | list[Component], **options: str | dict[str, str] | None) -> Component:
    return dmc.Card(children, **{"withBorder": True, "radius": "md", "padding": "lg", "shadow": "xs", **options})
