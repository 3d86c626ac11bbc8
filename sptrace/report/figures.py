"""Figures over sptrace's analyses: pure functions of a RunAnalysis (or of its tables), plotly
only, no Dash. The dashboard and the HTML report share them (the app imports this module; the
library never imports the app), and every figure uses one template, ``sptrace``, whose type and
colours match the dashboard's Mantine theme: system fonts only, nothing fetched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from sptrace.costmodel import CommEstimate, estimate_comm
from sptrace.costmodel.comm import as_shape
from sptrace.reduce.timebase import aligned, transfer_span
from sptrace.units import human_bytes

FONT = "Inter, system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
"""System fonts only: an air-gapped cluster downloads nothing."""
# Mantine's default palette (shade 6), shared by the dashboard's components and these figures
COLORS = {
    "blue": "#228be6", "orange": "#fd7e14", "teal": "#12b886", "red": "#fa5252", "violet": "#7950f2",
    "cyan": "#15aabf", "grape": "#be4bdb", "lime": "#82c91e", "yellow": "#fab005", "pink": "#e64980",
    "gray": "#868e96", "dark": "#343a40", "green": "#40c057", "indigo": "#4c6ef5",
}  # fmt: skip
VERDICT_COLORS = {"pass": "#2f9e44", "fail": "#e03131", "undecided": "#f08c00", "unavailable": "#868e96"}
"""Green MATCH/PASS, red MISMATCH/FAIL, amber CANNOT DECIDE / ambiguous, grey not checked."""
SEVERITY_COLORS = {"error": VERDICT_COLORS["fail"], "warning": VERDICT_COLORS["undecided"], "info": "#868e96"}
KIND_COLORS = {
    "all_gather": COLORS["blue"], "reduce_scatter": COLORS["orange"], "all_to_all": COLORS["teal"],
    "all_reduce": COLORS["red"], "broadcast": COLORS["violet"], "send": COLORS["grape"], "recv": COLORS["pink"],
    "send_recv": COLORS["grape"], "scatter": COLORS["cyan"], "gather": COLORS["lime"], "reduce": COLORS["indigo"],
    "barrier": COLORS["gray"], "other": COLORS["dark"],
}  # fmt: skip
CLASS_COLORS = {
    "seq-sharded": "#37b24d", "head-sharded": "#1c7ed6", "ambiguous": VERDICT_COLORS["undecided"],
    "full": VERDICT_COLORS["fail"], "other": "#ced4da", "unknown": "#adb5bd",
    "full-unknown-life": VERDICT_COLORS["undecided"],
}  # fmt: skip
PHASE_COLORS = {"forward": "rgba(34,139,230,0.08)", "backward": "rgba(253,126,20,0.09)",
                "optimizer": "rgba(134,142,150,0.10)", "step": "rgba(134,142,150,0.05)"}  # fmt: skip
MiB = 2**20
HEADERS = {
    "in_bytes": "input", "out_bytes": "output", "wire_bytes": "on the wire", "storage_bytes": "storage",
    "nbytes": "tensor bytes", "start_ms": "issued (ms)", "transfer_start_ms": "transfer starts (ms)",
    "dur_ms": "CPU span (ms)", "transfer_ms": "transfer (ms)", "alloc_ms": "allocated (ms)", "free_ms": "freed (ms)",
    "group_size": "group size", "arrival_skew_ms": "arrival skew (ms)", "max_wait_ms": "longest wait (ms)",
    "algbw_gbps": "algbw (GB/s)", "busbw_gbps": "busbw (GB/s)", "n_ranks": "ranks", "expected": "model",
    "observed": "measured", "expected_wire_bytes": "model wire", "observed_wire_bytes": "measured wire",
    "start_ms_from_step": "start (ms from the step start)", "unknown_wire": "of unknown size",
}  # fmt: skip
"""Column headers of the dashboard's grids and the HTML report's tables; a column not named here
shows its name with spaces (``header``)."""


def header(column: str) -> str:
    """A table column's header: ``wire_bytes`` -> "on the wire", ``group_ranks`` -> "group ranks"."""
    return HEADERS.get(column, column.replace("_", " "))


pio.templates["sptrace"] = go.layout.Template(
    layout=go.Layout(
        font={"family": FONT, "size": 13, "color": "#212529"},
        title={"font": {"size": 15}, "x": 0.01, "xanchor": "left", "y": 0.985, "yanchor": "top"},
        colorway=[COLORS[c] for c in ("blue", "orange", "teal", "red", "violet", "cyan", "grape", "lime")],
        paper_bgcolor="white", plot_bgcolor="white",
        xaxis={"gridcolor": "#e9ecef", "zerolinecolor": "#dee2e6", "linecolor": "#ced4da"},
        yaxis={"gridcolor": "#e9ecef", "zerolinecolor": "#dee2e6", "linecolor": "#ced4da"},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0},
        hoverlabel={"font": {"family": FONT, "size": 12}},
        margin={"l": 60, "r": 20, "t": 84, "b": 45},
    )
)  # fmt: skip
TEMPLATE = "sptrace"


def _figure(title: str, **layout: Any) -> go.Figure:
    return go.Figure().update_layout(template=TEMPLATE, title=title, **layout)


def _empty(title: str) -> go.Figure:
    return _figure(title).add_annotation(text="nothing to show", showarrow=False, x=0.5, y=0.5, xref="paper",
                                         yref="paper", font={"color": COLORS["gray"]})  # fmt: skip


# ---- timeline ----------------------------------------------------------------------------------


def timeline(
    a: Any,
    *,
    layer: int | None = None,
    phase: str | None = None,
    max_bars: int = 6000,
    max_lanes: int = 64,
    ranks: list[int] | None = None,
) -> go.Figure:
    """One lane per rank on clocks aligned across ranks: the step's phases as background bands,
    compute as a thin grey band, each collective as a bar over its transfer (kernels or gloo
    worker), at least 1/400 of the view wide so that every one is visible; the same collective
    linked across ranks, and its straggler (the last rank to arrive) marked. ``layer`` or
    ``phase`` zooms to the collectives of a layer or to a phase; ``ranks`` picks the lanes
    (at most ``max_lanes``: past that a lane per rank is neither readable nor fast)."""
    frame = a.collectives
    if frame.empty and a.compute.empty:
        return _empty("timeline")
    offsets = a.offsets_us
    present = sorted(set(frame["rank"].dropna().astype(int)) | set(a.compute["rank"].dropna().astype(int)))
    title = ""
    if ranks is not None:
        wanted = set(ranks)
        shown = [r for r in present if r in wanted][:max_lanes]
        if len(shown) < len(present):
            title = f"{_rank_text(shown)} of {len(present)}"
        ranks = shown
    else:
        ranks = present
        if len(ranks) > max_lanes:
            title = f"the first {max_lanes} of {len(ranks)} ranks"
            ranks = ranks[:max_lanes]
    if len(ranks) < len(present):
        frame = frame[frame["rank"].isin(ranks)]
    lane = {r: i for i, r in enumerate(ranks)}

    t0 = a.step_zero_us
    f = frame.copy()
    if not f.empty:
        # a bar spans when the data moved (sptrace.reduce.timebase): raw_start on the rank's own
        # clock, bar_start on the aligned one
        f["raw_start"], f["bar_dur"] = transfer_span(f)
        f["bar_start"] = aligned(f["raw_start"], f["rank"], offsets)
        f["issue_ms"] = (aligned(f["start_us"], f["rank"], offsets) - t0) / 1e3
    phases = a.phases[a.phases["rank"].isin(ranks)] if len(a.phases) else a.phases
    phases = phases.assign(s=lambda p: aligned(p["start_us"], p["rank"], offsets)) if len(phases) else phases
    lo_parts = [t0]
    if len(f):
        lo_parts.append(f["bar_start"].min())
    if len(phases):
        lo_parts.append(phases["s"].min())
    lo = min(lo_parts)
    hi_parts = []
    if len(f):
        hi_parts.append((f["bar_start"] + f["bar_dur"]).max())
    if len(phases):
        hi_parts.append((phases["s"] + phases["dur_us"]).max())
    hi = max(hi_parts) if hi_parts else lo + 1
    view = (lo, hi)
    if layer is not None and len(f):
        sel = f[f["layer"] == layer]
        if len(sel):
            view = (sel["bar_start"].min(), (sel["bar_start"] + sel["bar_dur"]).max())
    elif phase is not None and len(phases):
        sel = phases[phases["phase"] == phase]
        if len(sel):
            view = (sel["s"].min(), (sel["s"] + sel["dur_us"]).max())
    span = max(view[1] - view[0], 1.0)
    fig = _figure(title, barmode="overlay", height=110 + 46 * len(ranks), showlegend=True)
    # phases: background bands behind each rank's lane
    for p in phases.itertuples() if len(phases) else ():
        y = lane.get(int(p.rank))
        if y is None:
            continue
        fill = PHASE_COLORS.get(p.phase, PHASE_COLORS["step"])
        fig.add_shape(type="rect", x0=(p.s - t0) / 1e3, x1=(p.s + p.dur_us - t0) / 1e3, y0=y - 0.48, y1=y + 0.48,
                      fillcolor=fill, line_width=0, layer="below")  # fmt: skip
        if p.phase != "step" and y == 0:  # named once, above the top lane
            fig.add_annotation(x=(p.s - t0) / 1e3, y=-0.5, text=p.phase, showarrow=False, xanchor="left",
                               yanchor="bottom", font={"size": 11, "color": COLORS["gray"]})  # fmt: skip
    # compute: a thin band at the bottom of each lane
    if len(a.compute):
        c = a.compute[a.compute["rank"].isin(ranks)]
        c = c.assign(s=aligned(c["start_us"], c["rank"], offsets))
        fig.add_trace(go.Bar(
            y=[lane[int(r)] - 0.28 for r in c["rank"]], base=(c["s"] - t0) / 1e3,
            x=np.maximum(c["dur_us"].astype(float), span / 2000) / 1e3, orientation="h", width=0.12,
            name="compute", marker={"color": "#adb5bd"}, hovertemplate="compute %{x:.2f} ms<extra></extra>",
        ))  # fmt: skip
    # collectives, with what hover needs: bytes, bandwidth, layer, module and the matched peers
    if len(f):
        f = f.sort_values("bar_start").head(max_bars)
        info = _matched_info(a, f)
        for kind, g in f.groupby("kind", sort=False):
            m = info.loc[g.index]
            custom = np.column_stack([
                g["rank"].astype(int), g["op"].astype(str), g["in_bytes"].map(_bytes_text),
                g["wire_bytes"].map(_bytes_text), m["algbw"], m["peers"], g["layer"].map(_layer_text),
                g["module"].fillna("").astype(str), g["phase"].astype(str), g["bar_dur"] / 1e3, g["issue_ms"],
                m["straggler"], g["raw_start"], g["raw_start"] + g["bar_dur"],
            ])  # fmt: skip
            fig.add_trace(go.Bar(
                y=[lane[int(r)] + 0.08 for r in g["rank"]], base=(g["bar_start"] - t0) / 1e3,
                x=np.maximum(g["bar_dur"], span / 400) / 1e3, orientation="h", width=0.5, name=kind,
                marker={"color": KIND_COLORS.get(str(kind), COLORS["dark"]), "line": {"width": 0}}, customdata=custom,
                hovertemplate=(
                    f"<b>{kind}</b> on rank %{{customdata[0]}} (%{{customdata[1]}})<br>"
                    "in %{customdata[2]}, wire %{customdata[3]}, %{customdata[4]}<br>"
                    "layer %{customdata[6]} %{customdata[7]}, %{customdata[8]}<br>"
                    "transfer %{customdata[9]:.2f} ms, issued at %{customdata[10]:.2f} ms<br>"
                    "matched with %{customdata[5]}; straggler %{customdata[11]}<extra></extra>"
                ),
            ))  # fmt: skip
        _links_and_stragglers(fig, a, f, lane, t0)
    fig.update_layout(
        xaxis={"title": "ms from the step start (clocks aligned across ranks)",
               "range": [(view[0] - t0) / 1e3 - span * 0.01 / 1e3, (view[1] - t0) / 1e3 + span * 0.01 / 1e3]},
        yaxis={"tickvals": list(lane.values()), "ticktext": [f"rank {r}" for r in lane], "autorange": "reversed",
               "range": [len(ranks) - 0.5, -0.85], "showgrid": False, "zeroline": False},
        legend={"traceorder": "normal"}, hovermode="closest",
    )  # fmt: skip
    return fig


def _bytes_text(v: Any) -> str:
    return "?" if v is None or (isinstance(v, float) and np.isnan(v)) else human_bytes(float(v))


def _layer_text(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else str(int(v))


def _matched_info(a: Any, f: pd.DataFrame) -> pd.DataFrame:
    """Per row of ``f``: its matched collective's bandwidth, peers and straggler."""
    out = pd.DataFrame({"algbw": "bandwidth ?", "peers": "no other rank", "straggler": "-"}, index=f.index)
    m = a.matching
    if m is None or m.matched.empty or m.members.empty:
        return out
    members = m.members.merge(m.matched[["group", "key", "ranks", "straggler", "algbw_gbps", "busbw_gbps"]],
                              on=["group", "key"], how="inner")  # fmt: skip
    keyed = f.reset_index().merge(members, on=["rank", "start_us"], how="left").set_index("index")
    for i, row in keyed.iterrows():
        if isinstance(row.get("ranks"), list):
            others = [r for r in row["ranks"] if r != row["rank"]]
            out.at[i, "peers"] = _rank_text(others)
            if pd.notna(row["straggler"]):
                out.at[i, "straggler"] = f"rank {int(row['straggler'])}"
            if pd.notna(row["algbw_gbps"]):
                busbw = f"{row['busbw_gbps']:.2f} GB/s" if pd.notna(row["busbw_gbps"]) else "? (group size unknown)"
                out.at[i, "algbw"] = f"algbw {row['algbw_gbps']:.2f} GB/s, busbw {busbw}"
    return out


def _rank_text(ranks: list[int]) -> str:
    from sptrace.units import rank_ranges

    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks) if ranks else "no other rank"


def _links_and_stragglers(fig: go.Figure, a: Any, f: pd.DataFrame, lane: dict[int, int], t0: float) -> None:
    m = a.matching
    if m is None or m.members.empty:
        return
    members = m.members.merge(f[["rank", "start_us", "bar_start"]], on=["rank", "start_us"], how="inner")
    xs: list[float | None] = []
    ys: list[float | None] = []
    px: list[float | None] = []  # send -> receive, from the send's start to the receive's end
    py: list[float | None] = []
    ends = f.set_index(["rank", "start_us"])["bar_dur"]
    for (group, _), g in list(members.groupby(["group", "key"], sort=False))[:800]:
        if len(g) < 2:
            continue
        if group == "p2p" and len(g) == 2:
            send, recv = g.iloc[0], g.iloc[1]  # matching lists the sender first
            px += [(send["bar_start"] - t0) / 1e3, (recv["bar_start"] + ends.get((recv["rank"], recv["start_us"]), 0.0)
                                                    - t0) / 1e3, None]  # fmt: skip
            py += [lane[int(send["rank"])] + 0.08, lane[int(recv["rank"])] + 0.08, None]
            continue
        g = g.sort_values("rank")
        xs += [*((g["bar_start"] - t0) / 1e3), None]
        ys += [*(lane[int(r)] + 0.08 for r in g["rank"]), None]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="same collective", hoverinfo="skip",
                             line={"color": "rgba(73,80,87,0.25)", "width": 1}))  # fmt: skip
    if px:
        fig.add_trace(go.Scatter(x=px, y=py, mode="lines", name="send -> receive", hoverinfo="skip",
                                 line={"color": "rgba(190,75,219,0.45)", "width": 1}))  # fmt: skip
    strag = members.merge(m.matched[["group", "key", "straggler"]], on=["group", "key"])
    strag = strag[strag["rank"] == strag["straggler"]]
    if len(strag):
        fig.add_trace(go.Scatter(
            x=(strag["bar_start"] - t0) / 1e3, y=[lane[int(r)] - 0.22 for r in strag["rank"]], mode="markers",
            name="straggler (arrived last)", marker={"symbol": "triangle-down", "size": 8, "color": COLORS["red"]},
            hovertemplate="rank %{y} arrived last<extra></extra>",
        ))  # fmt: skip


# ---- collectives -------------------------------------------------------------------------------


def wire_by_kind(frame: pd.DataFrame, est: CommEstimate | None) -> go.Figure:
    """Wire bytes per rank and step by collective kind: measured (mean over ranks; collectives of
    unknown size left out) and the model; a kind that differs from the model is outlined red."""
    ranks = max(frame["rank"].nunique(), 1) if not frame.empty else 1
    measured = frame.groupby("kind")["wire_bytes"].sum() / ranks if not frame.empty else pd.Series(dtype=float)
    kinds = sorted(set(measured.index) | ({c.kind for c in est.collectives} if est else set()))
    model = [est.wire_per_step(k) / MiB for k in kinds] if est else None
    got = [float(measured.get(k, 0.0)) / MiB for k in kinds]
    differs = [model is not None and not np.isclose(g, m, rtol=1e-9, atol=1e-9) for g, m in zip(got, model or got)]
    fig = _figure("wire bytes per rank and step, by kind", barmode="group", yaxis_title="MiB")
    fig.add_trace(go.Bar(
        x=kinds, y=got, name="measured", customdata=kinds,
        marker={"color": COLORS["blue"], "line": {"color": [VERDICT_COLORS["fail"] if d else "rgba(0,0,0,0)"
                                                            for d in differs], "width": 3}},
        hovertemplate="%{x}: %{y:.3f} MiB measured<extra></extra>",
    ))  # fmt: skip
    if model is not None:
        fig.add_trace(go.Bar(x=kinds, y=model, name="model", customdata=kinds, marker={"color": "#ced4da"},
                             hovertemplate="%{x}: %{y:.3f} MiB in the model<extra></extra>"))  # fmt: skip
    return fig


def wire_by_layer(frame: pd.DataFrame, est: CommEstimate | None = None) -> go.Figure:
    """Wire bytes per layer and phase, per rank (mean over ranks), against the model's per-layer
    figure; collectives outside layers (gradient syncs) in their own bar. A bar that differs from
    the model is outlined red."""
    if frame.empty:
        return _empty("wire bytes per layer")
    ranks = max(frame["rank"].nunique(), 1)
    f = frame.assign(where=frame["layer"].map(lambda v: "outside layers" if pd.isna(v) else f"layer {int(v)}"))
    fig = _figure("wire bytes per layer and phase, per rank", barmode="stack", yaxis_title="KiB")
    for phase, g in f.groupby("phase"):
        per = g.groupby("where")["wire_bytes"].sum() / ranks / 2**10
        expect = est.wire_per_layer(phase=phase) / 2**10 if est is not None else None
        outline = [
            VERDICT_COLORS["fail"] if expect is not None and w != "outside layers" and not np.isclose(v, expect)
            else "rgba(0,0,0,0)" for w, v in per.items()
        ]  # fmt: skip
        fig.add_trace(go.Bar(
            x=list(per.index), y=list(per.values), name=phase, customdata=[phase] * len(per),
            marker={"line": {"color": outline, "width": 3}},
            hovertemplate="%{x}, " + phase + ": %{y:.2f} KiB" + (f" (model {expect:.2f})" if expect else "")
            + "<extra></extra>",
        ))  # fmt: skip
    if est is not None:
        total = est.wire_per_layer() / 2**10
        fig.add_hline(y=total, line_dash="dot", line_color=COLORS["gray"], annotation_text="model, per layer",
                      annotation_position="top left")  # fmt: skip
    return fig


def bandwidth_vs_size(matched: pd.DataFrame) -> go.Figure:
    """Each matched collective's algbw and busbw (nccl-tests' definitions) against its size."""
    m = matched[matched["algbw_gbps"].notna()] if len(matched) else matched
    if m.empty:
        return _empty("bandwidth against size")
    fig = _figure("bandwidth against size (matched collectives)", xaxis_title="bytes", yaxis_title="GB/s",
                  xaxis_type="log")  # fmt: skip
    for kind, g in m.groupby("kind"):
        color = KIND_COLORS.get(str(kind), COLORS["dark"])
        fig.add_trace(go.Scatter(x=g["in_bytes"], y=g["busbw_gbps"], mode="markers", name=f"{kind} busbw",
                                 marker={"color": color, "size": 8}))  # fmt: skip
        fig.add_trace(go.Scatter(x=g["in_bytes"], y=g["algbw_gbps"], mode="markers", name=f"{kind} algbw",
                                 marker={"color": color, "size": 7, "symbol": "circle-open"}))  # fmt: skip
    return fig


# ---- memory ------------------------------------------------------------------------------------


RETAINED_GROUPS = {"sharded": ("seq-sharded", "head-sharded"), "ambiguous": ("ambiguous", "full-unknown-life"),
                   "full": ("full",), "other": ("other", "unknown")}  # fmt: skip


def skew_heatmap(a: Any, max_rows: int = 400, max_columns: int = 256) -> go.Figure:
    """Arrival skew as collectives x ranks (sptrace.reduce.matching.skew_by_rank): how long after
    the first rank of its group each rank arrived at its i-th collective. Past ``max_columns``
    ranks, neighbouring ranks share a column (its largest skew), so that a thousand ranks stay
    one readable, light figure."""
    from sptrace.reduce.matching import skew_by_rank

    m = a.matching
    grid = skew_by_rank(m, max_rows=max_rows) if m is not None else pd.DataFrame()
    if grid.empty:
        return _empty("arrival skew: no collective matched across ranks")
    ranks = [int(r) for r in grid.columns]
    per = -(-len(ranks) // max_columns)  # ceil: ranks per column
    if per > 1:
        blocks = [ranks[i : i + per] for i in range(0, len(ranks), per)]
        grid = pd.concat({_rank_text(b): grid[b].max(axis=1) for b in blocks}, axis=1)
        x = list(grid.columns)
        x_title = f"ranks ({per} to a column: its largest skew)"
    else:
        x = [str(r) for r in ranks]
        x_title = "rank"
    labels = _collective_labels(m, len(grid))
    z = grid.to_numpy(dtype=float) / 1e3
    fig = _figure(
        f"arrival skew: {len(grid)} collectives x {len(ranks)} ranks", height=max(260, min(900, 120 + 9 * len(grid)))
    )
    fig.add_trace(go.Heatmap(
        z=z, x=x, y=labels, colorscale="Reds", zmin=0, colorbar={"title": {"text": "ms late"}, "thickness": 12},
        hovertemplate="rank %{x}<br>%{y}<br>%{z:.3f} ms after the first rank of its group<extra></extra>",
        hoverongaps=False,
    ))  # fmt: skip
    fig.update_layout(
        xaxis={"title": x_title, "type": "category", "showgrid": False},
        yaxis={"title": "collective, in issue order", "autorange": "reversed", "type": "category", "showgrid": False},
    )  # fmt: skip
    return fig


def p2p_matrix(a: Any, max_ranks: int = 256) -> go.Figure:
    """Bytes each rank sent each other rank point to point in the step (src rows, dst columns):
    a ring is one off-diagonal band (two: forward to r+1, backward to r-1). Past ``max_ranks``
    neighbouring ranks share a row and a column (their sum)."""
    report = getattr(a, "p2p", None)
    if report is None or report.pairs.empty:
        return _empty("point-to-point: no send paired with a receive")
    pairs = report.pairs
    ranks = sorted(set(pairs["src"]) | set(pairs["dst"]))
    per = -(-(max(ranks) + 1) // max_ranks)
    src, dst = pairs["src"] // per, pairs["dst"] // per
    n = max(ranks) // per + 1
    z = np.zeros((n, n))
    np.add.at(z, (src.to_numpy(), dst.to_numpy()), pairs["bytes"].fillna(0).to_numpy(dtype=float))
    labels = [str(i) if per == 1 else f"{i * per}-{i * per + per - 1}" for i in range(n)]
    fig = _figure(f"point-to-point bytes sent in the step: {len(pairs)} sends, {len(ranks)} ranks",
                  height=max(300, min(760, 140 + 18 * n)))  # fmt: skip
    fig.add_trace(go.Heatmap(
        z=np.where(z > 0, z / 2**10, np.nan), x=labels, y=labels, colorscale="Purples",
        colorbar={"title": {"text": "KiB"}, "thickness": 12}, hoverongaps=False,
        hovertemplate="rank %{y} -> rank %{x}: %{z:.1f} KiB<extra></extra>",
    ))  # fmt: skip
    fig.update_layout(
        xaxis={"title": "to rank" + ("s" if per > 1 else ""), "type": "category", "showgrid": False},
        yaxis={"title": "from rank" + ("s" if per > 1 else ""), "type": "category", "autorange": "reversed",
               "showgrid": False},
    )  # fmt: skip
    return fig


def p2p_steps(a: Any) -> go.Figure:
    """Per ring step, in execution order: the slowest and the mean hop's transfer time, and the
    share of the transfer the ranks spent computing (overlap)."""
    report = getattr(a, "p2p", None)
    steps = report.steps if report is not None else pd.DataFrame()
    if steps.empty:
        return _empty("ring steps: no send paired with a receive")
    labels = [
        f"{'L' + str(int(r.layer)) if r.layer is not None and r.layer is not pd.NA else '-'} "
        f"{str(r.phase)[:3]} {int(r.step)}"
        for r in steps.itertuples()
    ]
    fig = _figure("per-hop transfer time by ring step (bars) and the share hidden behind compute (line)",
                  height=340, showlegend=True)  # fmt: skip
    fig.add_trace(
        go.Bar(
            x=labels,
            y=steps["transfer_us_max"] / 1e3,
            name="slowest hop",
            marker={"color": COLORS["grape"]},
            hovertemplate="%{x}: %{y:.2f} ms<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            x=labels,
            y=steps["transfer_us_mean"] / 1e3,
            name="mean hop",
            marker={"color": COLORS["pink"]},
            hovertemplate="%{x}: %{y:.2f} ms<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=steps["overlap"] * 100,
            name="hidden %",
            yaxis="y2",
            mode="lines+markers",
            line={"color": COLORS["teal"]},
            hovertemplate="%{x}: %{y:.0f}% hidden<extra></extra>",
        )
    )
    fig.update_layout(
        barmode="group", xaxis={"title": "layer, phase, ring step", "type": "category"},
        yaxis={"title": "ms"}, yaxis2={"title": "% hidden", "overlaying": "y", "side": "right", "range": [0, 100],
                                       "showgrid": False},
    )  # fmt: skip
    return fig


def _collective_labels(m: Any, n: int) -> list[str]:
    """Row i's label: the i-th collective of the lowest rank (kind and layer)."""
    mem = m.members
    low = mem[mem["rank"] == mem["rank"].min()].sort_values("start_us", kind="stable").head(n)
    info = low.merge(m.matched[["group", "key", "kind", "layer"]], on=["group", "key"], how="left")
    labels = [
        f"#{i} {k}" + ("" if pd.isna(layer) else f" L{int(layer)}")
        for i, (k, layer) in enumerate(zip(info["kind"].fillna("?"), info["layer"]))
    ]
    return labels + [f"#{i}" for i in range(len(labels), n)]


def retained_by_layer(saved: pd.DataFrame, expected_bytes: float | None = None) -> go.Figure:
    """Bytes kept across the boundary per layer (mean over ranks), stacked sharded / ambiguous /
    full / other, against Korthikanti's figure for the scheme."""
    if saved.empty:
        return _empty("retained across the forward/backward boundary")
    s = saved.assign(layer=saved["layer"].fillna(-1).astype(int))
    ranks = max(s["rank"].nunique(), 1)
    fig = _figure("retained across the forward/backward boundary, per layer and rank", barmode="stack",
                  yaxis_title="KiB")  # fmt: skip
    colors = {"sharded": CLASS_COLORS["seq-sharded"], "ambiguous": CLASS_COLORS["ambiguous"],
              "full": CLASS_COLORS["full"], "other": CLASS_COLORS["other"]}  # fmt: skip
    for group, classes in RETAINED_GROUPS.items():
        part = s[s["class"].isin(classes)]
        if part.empty:
            continue
        per_layer = part.groupby("layer")["storage_bytes"].sum() / ranks
        labels = ["outside layers" if i < 0 else f"layer {i}" for i in per_layer.index]
        fig.add_trace(go.Bar(x=labels, y=per_layer.values / 2**10, name=group, marker_color=colors[group],
                             customdata=[group] * len(labels),
                             hovertemplate="%{x}: %{y:.1f} KiB " + group + "<extra></extra>"))  # fmt: skip
    if expected_bytes:
        fig.add_hline(y=expected_bytes / 2**10, line_dash="dash", line_color=COLORS["dark"],
                      annotation_text="Korthikanti et al., per layer", annotation_position="top left")  # fmt: skip
    return fig


def _min_max_thin(frame: pd.DataFrame, x: str, y: str, max_points: int) -> pd.DataFrame:
    """At most about ``max_points`` rows of a time series, keeping the lowest and highest value
    of each of ``max_points / 2`` time bins (so every peak stays on the plot). Written here:
    plotly-resampler, which does this in the browser, needs plotly < 7."""
    if len(frame) <= max_points:
        return frame
    bins = pd.cut(frame[x], bins=max(max_points // 2, 1), labels=False)
    grouped = frame[y].groupby(bins.to_numpy())
    keep = np.union1d(grouped.idxmin().to_numpy(), grouped.idxmax().to_numpy())
    return frame.loc[keep].sort_values(x)


def memory_over_step(a: Any, max_points: int = 4000) -> go.Figure:
    """Allocated memory over the step, one line per rank (Total Allocated of [memory] events),
    with the step's phases as bands and each rank's forward -> backward boundary marked."""
    series = a.memory
    if series.empty:
        return _empty("allocated memory over the step (no [memory] events)")
    offsets = a.offsets_us
    ranks = sorted(series["rank"].unique())
    t0 = a.step_zero_us
    fig = _figure("allocated memory over the step", xaxis_title="ms from the step start", yaxis_title="MiB")
    if len(a.phases):
        first = a.phases[a.phases["rank"] == ranks[0]]
        for p in first.itertuples():
            s = aligned(p.start_us, p.rank, offsets)
            fig.add_vrect(x0=(s - t0) / 1e3, x1=(s + p.dur_us - t0) / 1e3, line_width=0, layer="below",
                          fillcolor=PHASE_COLORS.get(p.phase, PHASE_COLORS["step"]))  # fmt: skip
    for rank, g in series.groupby("rank"):
        g = _min_max_thin(g.sort_values("ts_us"), "ts_us", "allocated_bytes", max_points)
        x = (aligned(g["ts_us"], rank, offsets) - t0) / 1e3
        # SVG lines, not Scattergl: a WebGL context per figure costs more than drawing a few
        # thousand points, and headless or remote browsers often have no GPU at all
        fig.add_trace(go.Scatter(x=x, y=g["allocated_bytes"] / MiB, mode="lines", line_shape="hv",
                                 name=f"rank {rank}", hovertemplate="%{x:.2f} ms: %{y:.1f} MiB<extra>rank "
                                 f"{rank}</extra>"))  # fmt: skip
    boundaries = [aligned(r.boundary_ns / 1e3, r.rank, offsets) for r in a.retained if r.boundary_ns is not None]
    if boundaries:
        x = (float(np.median(boundaries)) - t0) / 1e3
        fig.add_vline(x=x, line_dash="dash", line_color=COLORS["dark"], annotation_text="forward → backward",
                      annotation_position="top")  # fmt: skip
    return fig


# ---- across runs -------------------------------------------------------------------------------


def compare_runs(analyses: list[Any]) -> go.Figure:
    """Runs side by side: each run's slowest step split into communication (mean transfer per
    rank) and the rest, wire bytes per rank against the model, and retained bytes per layer and
    rank against Korthikanti's figure."""
    from plotly.subplots import make_subplots

    names = [a.name for a in analyses]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07,
                        subplot_titles=("step time (ms)", "wire bytes per rank (MiB)",
                                        "retained per layer and rank (KiB)"))  # fmt: skip
    steps = [a.time_summary() for a in analyses]
    comm = [t["comm_ms"] or 0.0 for t in steps]
    rest = [max((t["step_ms"] or 0.0) - c, 0.0) for t, c in zip(steps, comm)]
    # stacked by hand (base=) so that the other panels can group measured beside model
    fig.add_trace(
        go.Bar(
            x=names,
            y=comm,
            name="communication (transfer)",
            marker_color=COLORS["orange"],
            offsetgroup="step",
            hovertemplate="%{x}: %{y:.1f} ms of transfer<extra></extra>",
        ),
        1,
        1,
    )
    fig.add_trace(
        go.Bar(
            x=names,
            y=rest,
            base=comm,
            name="the rest of the step",
            marker_color="#ced4da",
            offsetgroup="step",
            hovertemplate="%{x}: %{y:.1f} ms besides<extra></extra>",
        ),
        1,
        1,
    )
    wire = [a.wire_bytes_per_rank() / MiB for a in analyses]
    model = [a.estimate.wire_per_step() / MiB if a.estimate is not None else None for a in analyses]
    fig.add_trace(
        go.Bar(
            x=names,
            y=wire,
            name="measured wire",
            marker_color=COLORS["blue"],
            offsetgroup="measured",
            hovertemplate="%{x}: %{y:.3f} MiB measured<extra></extra>",
        ),
        1,
        2,
    )
    fig.add_trace(
        go.Bar(
            x=names,
            y=model,
            name="model wire",
            marker_color="#adb5bd",
            offsetgroup="model",
            hovertemplate="%{x}: %{y:.3f} MiB in the model<extra></extra>",
        ),
        1,
        2,
    )
    kept = [None if a.retained_per_layer() is None else a.retained_per_layer() / 2**10 for a in analyses]
    fig.add_trace(
        go.Bar(
            x=names,
            y=kept,
            name="retained",
            marker_color=CLASS_COLORS["seq-sharded"],
            offsetgroup="measured",
            hovertemplate="%{x}: %{y:.1f} KiB retained<extra></extra>",
        ),
        1,
        3,
    )
    expected = [a.expected_activation_bytes / 2**10 if a.expected_activation_bytes else None for a in analyses]
    fig.add_trace(
        go.Bar(
            x=names,
            y=expected,
            name="Korthikanti et al.",
            marker_color="#adb5bd",
            offsetgroup="model",
            hovertemplate="%{x}: %{y:.1f} KiB by Korthikanti's formula<extra></extra>",
        ),
        1,
        3,
    )
    fig.update_layout(template=TEMPLATE, barmode="group", height=420, margin={"t": 40, "b": 40},
                      legend={"orientation": "h", "y": -0.22, "yanchor": "top", "x": 0})  # fmt: skip
    fig.update_xaxes(tickangle=-20, automargin=True)
    return fig


def model_sweep(
    base: object, seqs: list[int], schemes: tuple[str, ...] = ("megatron", "ulysses", "hybrid", "ring", "usp")
) -> go.Figure:
    """The cost model's wire GiB per rank and step against sequence length (the first article's
    table), for each scheme at ``base``'s other settings (a ModelShape with every value known).
    USP takes ``base``'s Ulysses degree when ``base`` is a USP run, else 2 (1 at an odd P); a
    length a scheme cannot split (ring's zigzag needs 2P chunks) is a gap."""
    from sptrace.errors import UsageError

    fig = _figure("model: wire bytes per rank and step", xaxis_title="sequence length", yaxis_title="GiB",
                  xaxis_type="log")  # fmt: skip
    shape = as_shape(base)
    P = shape.sp_size or 1
    degree = shape.ulysses_degree if shape.scheme == "usp" and shape.ulysses_degree else 2 if P % 2 == 0 else 1
    for scheme in schemes:
        ys = []
        for s in seqs:
            zero = "-zero3" if shape.zero3 and scheme != "megatron" else ""
            extra = {"ulysses_degree": degree} if scheme == "usp" else {}
            try:
                est = estimate_comm(shape.override("sweep", scheme=scheme + zero, seq=s, **extra))
                ys.append(est.wire_per_step() / 2**30)
            except UsageError:  # this length does not split evenly for the scheme
                ys.append(None)
        name = f"usp (U={degree})" if scheme == "usp" else scheme
        fig.add_trace(go.Scatter(x=seqs, y=ys, mode="lines+markers", name=name))
    fig.update_xaxes(tickvals=seqs, ticktext=[_seq_text(s) for s in seqs])
    return fig


def _seq_text(s: int) -> str:
    return f"{s // 1024}K" if s >= 1024 and s % 1024 == 0 else str(s)


def sweep_fit(table: pd.DataFrame, fit: dict[str, Any]) -> go.Figure:
    """Measured step time per run against the fitted regression's prediction; an underdetermined
    fit (fewer runs than coefficients) says so in the title, as the CLI does."""
    c = fit["coefficients"]
    s_k = table["seq"] / 1024
    pred = (
        c["intercept"] + c["peak_GiB"] * table["peak_GiB"] + c["comm_GiB"] * table["comm_GiB"] + c["S_K"] * s_k
        + c["S_K^2"] * s_k**2
    )  # fmt: skip
    title = "step time: measured and fitted"
    if fit.get("underdetermined"):
        from sptrace.sweep import UNDERDETERMINED

        title += f" (underdetermined: {UNDERDETERMINED})"
    fig = _figure(title, xaxis_title="sequence length", yaxis_title="ms")
    for scheme, g in table.assign(pred=pred).groupby("scheme"):
        fig.add_trace(go.Scatter(x=g["seq"], y=g["step_ms"], mode="markers", name=f"{scheme} measured"))
        fig.add_trace(go.Scatter(x=g["seq"], y=g["pred"], mode="lines", name=f"{scheme} fit"))
    return fig


def temporal_breakdown(frame: pd.DataFrame) -> go.Figure:
    """HTA's temporal breakdown: idle, compute and non-compute share of each rank's GPU time."""
    fig = _figure("GPU time per rank (HTA temporal breakdown)", barmode="stack", yaxis_title="%")
    for column, color in (
        ("idle_time_pctg", "#ced4da"),
        ("compute_time_pctg", COLORS["teal"]),
        ("non_compute_time_pctg", COLORS["orange"]),
    ):
        if column in frame:
            ranks = [f"rank {r}" for r in frame["rank"]]
            fig.add_trace(go.Bar(x=ranks, y=frame[column], name=column.removesuffix("_pctg"), marker_color=color))
    return fig
