"""Collectives: wire bytes per kind and per layer against the model (a difference outlined red;
clicking a bar filters the table to its collectives), bandwidth against size for the matched
collectives, and the tables of every rank's and every matched collective."""

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
from sptrace.lanes import stragglers
from sptrace.report import figures, timeline
from sptrace.vocab.errors import SptraceError
from sptrace.vocab.units import rank_text

ROW_COLUMNS = ["rank", "kind", "op", "phase", "layer", "module", "in_bytes", "wire_bytes", "start_ms", "transfer_ms",
               "group_size", "peer", "dtype", "source"]  # fmt: skip


def collective_rows(a: RunAnalysis, frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """The table of collectives: times in ms from the step start (aligned clocks), transfer
    time (kernel or worker span, else the CPU span)."""
    f = a.collectives if frame is None else frame
    if f.empty:
        return pd.DataFrame(columns=ROW_COLUMNS)
    transfer = f["transfer_dur_us"].astype(float).where(f["transfer_dur_us"].notna(), f["dur_us"].astype(float))
    out = f.assign(start_ms=a.clock_ms(f["rank"], f["start_us"]).round(3), transfer_ms=(transfer / 1e3).round(3))
    out["layer"] = out["layer"].astype("Int64")
    return out[ROW_COLUMNS]


def matched_rows(a: RunAnalysis) -> pd.DataFrame:
    m = a.matching.matched if a.matching is not None else pd.DataFrame()
    if m.empty:
        return m
    out = pd.DataFrame({
        "kind": m["kind"], "phase": m["phase"], "layer": m["layer"].astype("Int64"), "module": m["module"],
        "ranks": m["ranks"].map(rank_text), "in_bytes": m["in_bytes"], "wire_bytes": m["wire_bytes"],
        "start_ms": ((m["start_us"] - a.step_zero_us) / 1e3).round(3),
        "arrival_skew_ms": (m["arrival_skew_us"] / 1e3).round(3), "straggler": m["straggler"],
        "transfer_ms": (m["transfer_us"] / 1e3).round(3), "algbw_gbps": m["algbw_gbps"], "busbw_gbps": m["busbw_gbps"],
    })  # fmt: skip
    return out


def select(a: RunAnalysis, kind: str | None = None, layer: str | None = None, phase: str | None = None) -> pd.DataFrame:
    """The collectives a clicked bar stands for: a kind, or a layer ("layer 3" / "outside
    layers") and phase."""
    f = a.collectives
    if kind is not None:
        f = f[f["kind"] == kind]
    if layer is not None:
        f = f[f["layer"].isna()] if layer == "outside layers" else f[f["layer"] == int(layer.split()[-1])]
    if phase is not None:
        f = f[f["phase"] == phase]
    return f


def render(store: RunStore, view: View) -> list[Component]:
    a = store.get(view.run)
    head = page_title("Collectives", "Wire bytes against the cost model (a difference is outlined red). "
                      "Click a bar to list its collectives.")  # fmt: skip
    if isinstance(a, SptraceError):
        return [head, error_box(str(a))]
    # against the cost model; without one, the ranks against each other (sptrace analyze does the same)
    report = a.comm if a.comm is not None else a.crossrank
    verdict = a.collectives_verdict
    summary = verdict.line() if verdict else f"not checked against the cost model: {a.comm_unavailable}"
    if a.comm is None and verdict is not None:
        summary += f" (ranks compared with each other; the cost model was skipped: {a.comm_unavailable})"
    parts: list[Component] = [
        head,
        dmc.Group([verdict_badge("collectives", verdict, a.comm_unavailable), dmc.Text(summary, size="sm")],
                  mb="sm", className="verdict"),
    ]  # fmt: skip
    parts += [note_box(n, color="gray") for n in (report.notes if report is not None else [])]
    parts.append(dmc.SimpleGrid([
        graph("collectives-wire", figures.wire_by_kind(a)),
        graph("collectives-layers", figures.wire_by_layer(a)),
    ], cols={"base": 1, "lg": 2}))  # fmt: skip
    if report is not None:
        parts.append(dmc.Title(f"findings ({len(report.findings)})", order=4, mt="md", mb="xs"))
        parts.append(findings_list(report.findings, view.run, limit=50))
    parts += [
        dmc.Group([
            dmc.Text("showing every collective", id="collectives-filter", size="sm", fw=600),
            dmc.Button("show all", id="collectives-clear", size="compact-xs", variant="subtle"),
        ], mt="lg", mb=4),
        grid(collective_rows(a), "collectives-grid", "collectives"),
    ]  # fmt: skip
    parts += p2p_section(a)
    matched = matched_rows(a)
    if len(matched):
        parts += skew_section(a, "collectives")
        parts.append(graph("collectives-bandwidth", figures.bandwidth_vs_size(a.matching.matched)))
        parts.append(grid(matched, "matched-grid", "matched across ranks: skew, straggler, bandwidth"))
    return parts


def p2p_section(a: RunAnalysis) -> list[Component]:
    """Point-to-point traffic (ring attention): who sent whom how much, and each ring step's
    per-hop time and overlap."""
    if a.p2p is None or a.p2p.pairs.empty:
        return []
    p2p = a.p2p
    share, imbalance = p2p.overlap_share(), p2p.imbalance()
    facts = [f"{len(p2p.pairs)} sends paired with their receives", f"{len(p2p.unpaired)} unpaired"]
    if share is not None:
        facts.append(f"{100 * share:.0f}% of the transfer time hidden behind compute")
    if imbalance is not None:
        facts.append(f"compute between transfers max/mean {imbalance:.2f}")
    steps = p2p.steps.astype(object).where(p2p.steps.notna(), None)
    return [
        dmc.Title("point-to-point: the ring", order=4, mt="lg", mb="xs"),
        dmc.Text("; ".join(facts), size="sm", mb="xs", id="p2p-summary"),
        dmc.SimpleGrid([
            graph("collectives-p2p-matrix", timeline.p2p_matrix(a)),
            graph("collectives-p2p-steps", timeline.p2p_steps(a)),
        ], cols={"base": 1, "lg": 2}),
        grid(steps, "p2p-steps-grid", "ring steps: hops, bytes, transfer time, bandwidth, skew, overlap"),
    ]  # fmt: skip


def skew_section(a: RunAnalysis, page: str, k: int = 10) -> list[Component]:
    """Who kept the others waiting: the collectives x ranks heatmap of arrival skew and the top-k
    stragglers (one figure and one short table at any rank count, never a lane per rank)."""
    if a.matching is None or a.matching.matched.empty:
        return []
    return [
        dmc.Title("arrival skew across ranks", order=4, mt="lg", mb="xs"),
        graph(f"{page}-skew", timeline.skew_heatmap(a)),
        grid(stragglers(a, k), f"{page}-stragglers", f"top {k} stragglers: the wait each caused"),
    ]


def register(app: Dash, store: RunStore) -> None:
    @app.callback(
        Output({"type": "sptrace-grid", "name": "collectives-grid"}, "rowData"),
        Output("collectives-filter", "children"),
        Input("collectives-wire", "clickData"),
        Input("collectives-layers", "clickData"),
        Input("collectives-clear", "n_clicks"),
        State("header-run", "value"),
        prevent_initial_call=True,
    )
    def _filter(
        by_kind: ClickData | None, by_layer: ClickData | None, _clear: int | None, run: str | None
    ) -> tuple[list[Row] | NoUpdate, str | NoUpdate]:
        a = store.get(run)
        if isinstance(a, SptraceError):
            return no_update, no_update
        trigger = ctx.triggered_id
        if trigger == "collectives-wire" and by_kind:
            kind = by_kind["points"][0]["x"]
            return records(collective_rows(a, select(a, kind=kind))), f"showing the {kind} collectives"
        if trigger == "collectives-layers" and by_layer:
            point = by_layer["points"][0]
            phase = point.get("customdata")
            chosen = select(a, layer=point["x"], phase=phase)
            return records(collective_rows(a, chosen)), f"showing {point['x']}, {phase}"
        return records(collective_rows(a)), "showing every collective"
