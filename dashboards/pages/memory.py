"""Memory: what each layer keeps for backward, stacked sharded / ambiguous / full against
Korthikanti's figure (click a bar to list those tensors, with shape, op, module and holder), and
allocated memory over the step per rank with the forward -> backward boundary."""

from __future__ import annotations

import dash_mantine_components as dmc
import pandas as pd
from dash import Dash, Input, NoUpdate, Output, State, ctx, no_update
from dash.development.base_component import Component
from sptrace.dashboards.pages.common import (
    ClickData,
    Row,
    View,
    error_box,
    findings_list,
    graph,
    grid,
    note_box,
    page_title,
    records,
    verdict_badge,
)  # fmt: skip
from sptrace.dashboards.store import RunStore

from sptrace.analysis import RunAnalysis
from sptrace.checks.sharding_verdict import GROUPS
from sptrace.report import figures
from sptrace.vocab.errors import SptraceError
from sptrace.vocab.units import human_bytes

TENSOR_COLUMNS = ["rank", "layer", "module", "shape", "dtype", "nbytes", "storage_bytes", "class", "why", "op",
                  "made_at", "holder", "evidence", "saved_by", "alloc_ms", "free_ms"]  # fmt: skip


def tensor_rows(a: RunAnalysis, saved: pd.DataFrame | None = None) -> pd.DataFrame:
    s = a.sharding.saved if saved is None else saved
    if s.empty:
        return pd.DataFrame(columns=TENSOR_COLUMNS)
    out = s.assign(
        op=s["producer"].fillna(s["alloc_op"]),
        alloc_ms=a.clock_ms(s["rank"], s["alloc_ns"].astype(float) / 1e3).round(3),
        free_ms=a.clock_ms(s["rank"], s["free_ns"].astype(float) / 1e3).round(3),
        layer=s["layer"].astype("Int64"),
    )
    return out[TENSOR_COLUMNS]


def select(a: RunAnalysis, layer: str | None, group: str | None) -> pd.DataFrame:
    """The tensors a clicked bar stands for: a layer ("layer 3" / "outside layers") and one of
    the sharding check's groups (sharding_verdict.GROUPS)."""
    s = a.sharding.saved
    if layer is not None:
        s = s[s["layer"].isna()] if layer == "outside layers" else s[s["layer"] == int(layer.split()[-1])]
    if group in GROUPS:
        s = s[s["group"] == group]
    return s


def render(store: RunStore, view: View) -> list[Component]:
    a = store.get(view.run)
    head = page_title("Memory", "Activations kept for backward, per layer and rank, against Korthikanti et al.; "
                      "click a bar to list its tensors.")  # fmt: skip
    if isinstance(a, SptraceError):
        return [head, error_box(str(a))]
    over_step = graph("memory-over-step", figures.memory_over_step(a))
    if a.sharding is None:
        return [head, error_box(f"sharding not checked: {a.sharding_unavailable}", title="sharding not checked"),
                over_step]  # fmt: skip
    report = a.sharding
    parts: list[Component] = [
        head,
        dmc.Group([verdict_badge("sharding", report.verdict), dmc.Text(report.verdict.line(), size="sm")], mb="sm",
                  className="verdict"),
        *[note_box(n, color="gray") for n in report.notes],
        dmc.SimpleGrid([
            graph("memory-graph", figures.retained_by_layer(report.saved, a.expected_activation_bytes)),
            over_step,
        ], cols={"base": 1, "lg": 2}),
        dmc.Title(f"findings ({len(report.findings)})", order=4, mt="md", mb="xs"),
        findings_list(report.findings, view.run, limit=50),
        *projection_parts(a),
        dmc.Group([
            dmc.Text("showing every retained tensor", id="memory-filter", size="sm", fw=600),
            dmc.Button("show all", id="memory-clear", size="compact-xs", variant="subtle"),
        ], mt="lg", mb=4),
        grid(tensor_rows(a), "memory-grid", "tensors kept for backward"),
    ]  # fmt: skip
    return parts


def projection_parts(a: RunAnalysis) -> list[Component]:
    """The kept bytes at the production shape (--at, a production: block), where one is declared:
    a line, the ranks' table and the FAILs' (sptrace.checks.projection computes them)."""
    p = a.projection
    if p is None:
        return []
    korthikanti = (human_bytes(p.korthikanti_per_layer) if p.korthikanti_per_layer is not None
                   else f"unknown, {p.korthikanti_why}")  # fmt: skip
    parts: list[Component] = [
        dmc.Title(f"at production size: {p.headline()}", order=4, mt="md", mb="xs"),
        dmc.Text(f"Korthikanti et al. at this shape: {korthikanti} per layer and rank. A tensor whose dimensions "
                 "cannot be named is carried as measured and listed.", size="sm", mb="xs"),
        grid(p.rank_rows(), "memory-projection", "kept per rank at production (the boundary that kept the most)"),
    ]  # fmt: skip
    if p.fails:
        parts.append(grid(p.fail_rows(), "memory-projection-fails", "each FAIL's bytes over a 1/P shard at production"))
    parts += [note_box(n, color="gray") for n in p.notes]
    return parts


def register(app: Dash, store: RunStore) -> None:
    @app.callback(
        Output({"type": "sptrace-grid", "name": "memory-grid"}, "rowData"),
        Output("memory-filter", "children"),
        Input("memory-graph", "clickData"),
        Input("memory-clear", "n_clicks"),
        State("header-run", "value"),
        prevent_initial_call=True,
    )
    def _filter(
        clicked: ClickData | None, _clear: int | None, run: str | None
    ) -> tuple[list[Row] | NoUpdate, str | NoUpdate]:
        a = store.get(run)
        if isinstance(a, SptraceError) or a.sharding is None:
            return no_update, no_update
        if ctx.triggered_id == "memory-graph" and clicked:
            point = clicked["points"][0]
            chosen = select(a, point["x"], point.get("customdata"))
            return records(tensor_rows(a, chosen)), f"showing {point['x']}: {point.get('customdata')} tensors"
        return records(tensor_rows(a)), "showing every retained tensor"
