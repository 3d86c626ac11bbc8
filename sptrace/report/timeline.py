"""Figures of how the ranks meet, over aligned clocks: the timeline (a lane per rank, each
collective over its transfer, linked to the same collective on the other ranks, its straggler
marked), arrival skew (collectives x ranks), and point-to-point traffic (bytes rank to rank, and
the ring's steps). Each takes a finished RunAnalysis and returns a plotly figure; where a bar
starts and ends, and which collectives meet, are the lanes' (sptrace.lanes: the reduce's one time
base and matching), which they draw and never re-derive.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sptrace.analysis import RunAnalysis
from sptrace.lanes import arrival_skew, collective_bars, matched_peers, on_aligned_clock
from sptrace.report.theme import COLORS, PHASE_COLORS, empty, figure, kind_color
from sptrace.vocab.units import human_bytes, rank_text


def timeline(
    a: RunAnalysis,
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
        return empty("timeline")
    present = sorted(set(frame["rank"].dropna().astype(int)) | set(a.compute["rank"].dropna().astype(int)))
    title = ""
    if ranks is not None:
        wanted = set(ranks)
        shown = [r for r in present if r in wanted][:max_lanes]
        if len(shown) < len(present):
            title = f"{rank_text(shown)} of {len(present)}"
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
    f = collective_bars(a, frame)  # a bar spans when the data moved: raw_start on the rank's clock, bar_start aligned
    phases = a.phases[a.phases["rank"].isin(ranks)] if len(a.phases) else a.phases
    phases = phases.assign(s=lambda p: on_aligned_clock(a, p)) if len(phases) else phases
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
    fig = figure(title, barmode="overlay", height=110 + 46 * len(ranks), showlegend=True)
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
        c = c.assign(s=on_aligned_clock(a, c))
        fig.add_trace(go.Bar(
            y=[lane[int(r)] - 0.28 for r in c["rank"]], base=(c["s"] - t0) / 1e3,
            x=np.maximum(c["dur_us"].astype(float), span / 2000) / 1e3, orientation="h", width=0.12,
            name="compute", marker={"color": "#adb5bd"}, hovertemplate="compute %{x:.2f} ms<extra></extra>",
        ))  # fmt: skip
    # collectives, with what hover needs: bytes, bandwidth, layer, module and the matched peers
    if len(f):
        f = f.sort_values("bar_start").head(max_bars)
        info = matched_peers(a, f)
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
                marker={"color": kind_color(kind), "line": {"width": 0}}, customdata=custom,
                hovertemplate=(
                    f"<b>{kind}</b> on rank %{{customdata[0]}} (%{{customdata[1]}})<br>"
                    "in %{customdata[2]}, wire %{customdata[3]}, %{customdata[4]}<br>"
                    "layer %{customdata[6]} %{customdata[7]}, %{customdata[8]}<br>"
                    "transfer %{customdata[9]:.2f} ms, issued at %{customdata[10]:.2f} ms<br>"
                    "matched with %{customdata[5]}; straggler %{customdata[11]}<extra></extra>"
                ),
            ))  # fmt: skip
        _links_and_stragglers(fig, a, f, lane, t0)
    _critical_path(fig, a, lane, t0)
    fig.update_layout(
        xaxis={"title": "ms from the step start (clocks aligned across ranks)",
               "range": [(view[0] - t0) / 1e3 - span * 0.01 / 1e3, (view[1] - t0) / 1e3 + span * 0.01 / 1e3]},
        yaxis={"tickvals": list(lane.values()), "ticktext": [f"rank {r}" for r in lane], "autorange": "reversed",
               "range": [len(ranks) - 0.5, -0.85], "showgrid": False, "zeroline": False},
        legend={"traceorder": "normal"}, hovermode="closest",
    )  # fmt: skip
    return fig


def _bytes_text(v: float | None) -> str:
    return "?" if v is None or (isinstance(v, float) and np.isnan(v)) else human_bytes(float(v))


def _layer_text(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else str(int(v))


def _links_and_stragglers(fig: go.Figure, a: RunAnalysis, f: pd.DataFrame, lane: dict[int, int], t0: float) -> None:
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


def _critical_path(fig: go.Figure, a: RunAnalysis, lane: dict[int, int], t0: float) -> None:
    """The critical path (sptrace.reduce.critical) as one line through the lanes: along a lane
    while its rank is on the path, across lanes where it moves to the rank that arrived last.
    Each point's hover names its segment."""
    path = a.critical_path
    if path is None or path.segments.empty:
        return
    xs: list[float | None] = []
    ys: list[float | None] = []
    text: list[str | None] = []
    for s in path.segments.itertuples(index=False):
        y = lane.get(int(s.rank))
        if y is None:  # a rank not shown: the line breaks
            if xs and xs[-1] is not None:
                xs.append(None)
                ys.append(None)
                text.append(None)
            continue
        what = f"{s.kind} on rank {int(s.rank)}: " + " ".join(
            str(v) for v in (s.module, s.phase, s.collective) if isinstance(v, str) and v
        )
        label = f"{what}<br>{s.dur_us / 1e3:.3f} ms" + (f", {int(s.waiting)} ranks waited" if s.waiting else "")
        for x in (s.start_us, s.start_us + s.dur_us):
            xs.append((x - t0) / 1e3)
            ys.append(y + 0.36)
            text.append(label)
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="lines", name="critical path", text=text, hovertemplate="%{text}<extra>critical path</extra>",
        line={"color": COLORS["red"], "width": 3}, opacity=0.8, connectgaps=False,
    ))  # fmt: skip


# ---- arrival skew and point-to-point -----------------------------------------------------------


def skew_heatmap(a: RunAnalysis, max_rows: int = 400, max_columns: int = 256) -> go.Figure:
    """Arrival skew as collectives x ranks (sptrace.lanes.arrival_skew): how long after
    the first rank of its group each rank arrived at its i-th collective. Past ``max_columns``
    ranks, neighbouring ranks share a column (its largest skew), so that a thousand ranks stay
    one readable, light figure."""
    skew = arrival_skew(a, max_rows=max_rows)
    if skew is None:
        return empty("arrival skew: no collective matched across ranks")
    grid = skew.grid
    ranks = [int(r) for r in grid.columns]
    per = -(-len(ranks) // max_columns)  # ceil: ranks per column
    if per > 1:
        blocks = [ranks[i : i + per] for i in range(0, len(ranks), per)]
        grid = pd.concat({rank_text(b): grid[b].max(axis=1) for b in blocks}, axis=1)
        x = list(grid.columns)
        x_title = f"ranks ({per} to a column: its largest skew)"
    else:
        x = [str(r) for r in ranks]
        x_title = "rank"
    labels = skew.labels
    z = grid.to_numpy(dtype=float) / 1e3
    fig = figure(
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


def p2p_matrix(a: RunAnalysis, max_ranks: int = 256) -> go.Figure:
    """Bytes each rank sent each other rank point to point in the step (src rows, dst columns):
    a ring is one off-diagonal band (two: forward to r+1, backward to r-1). Past ``max_ranks``
    neighbouring ranks share a row and a column (their sum)."""
    report = a.p2p
    if report is None or report.pairs.empty:
        return empty("point-to-point: no send paired with a receive")
    pairs = report.pairs
    ranks = sorted(set(pairs["src"]) | set(pairs["dst"]))
    per = -(-(max(ranks) + 1) // max_ranks)
    src, dst = pairs["src"] // per, pairs["dst"] // per
    n = max(ranks) // per + 1
    z = np.zeros((n, n))
    np.add.at(z, (src.to_numpy(), dst.to_numpy()), pairs["bytes"].fillna(0).to_numpy(dtype=float))
    labels = [str(i) if per == 1 else f"{i * per}-{i * per + per - 1}" for i in range(n)]
    fig = figure(f"point-to-point bytes sent in the step: {len(pairs)} sends, {len(ranks)} ranks",
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


def p2p_steps(a: RunAnalysis) -> go.Figure:
    """Per ring step, in execution order: the slowest and the mean hop's transfer time, and the
    share of the transfer the ranks spent computing (overlap)."""
    report = a.p2p
    steps = report.steps if report is not None else pd.DataFrame()
    if steps.empty:
        return empty("ring steps: no send paired with a receive")
    labels = [
        f"{'L' + str(int(r.layer)) if r.layer is not None and r.layer is not pd.NA else '-'} "
        f"{str(r.phase)[:3]} {int(r.step)}"
        for r in steps.itertuples()
    ]
    fig = figure("per-hop transfer time by ring step (bars) and the share hidden behind compute (line)",
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
