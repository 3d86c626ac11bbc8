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
from sptrace.lane_window import MAX_POINTS, RESOLUTION, LaneView, lane_view
from sptrace.lanes import arrival_skew, matched_peers
from sptrace.report.theme import COLORS, PHASE_COLORS, empty, figure, kind_color
from sptrace.vocab.units import human_bytes, rank_text


def timeline(
    a: RunAnalysis,
    *,
    layer: int | None = None,
    phase: str | None = None,
    max_lanes: int = 64,
    ranks: list[int] | None = None,
    window: tuple[float, float] | None = None,
    max_points: int = MAX_POINTS,
    resolution: int = RESOLUTION,
) -> go.Figure:
    """One lane per rank on clocks aligned across ranks: the step's phases as background bands,
    compute as a thin grey band, each collective as a bar over its transfer (kernels or gloo
    worker), at least 1/400 of the view wide so that every one is visible; the same collective
    linked across ranks, and its straggler (the last rank to arrive) marked. ``layer`` or
    ``phase`` zooms to the collectives of a layer or to a phase, ``window`` (ms from the step
    start) to a range; ``ranks`` picks the lanes (at most ``max_lanes``: past that a lane per
    rank is neither readable nor fast). What is drawn of the window, at most about
    ``max_points`` points, is sptrace.lane_window's."""
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
    view = lane_view(a, ranks, window=window, layer=layer, phase=phase, max_points=max_points, resolution=resolution)
    return draw(a, view, title)


def draw(a: RunAnalysis, view: LaneView, title: str = "") -> go.Figure:
    """The lanes of ``view`` (sptrace.lane_window.lane_view), every row it holds and nothing else."""
    lane = {r: i for i, r in enumerate(view.ranks)}
    t0 = view.t0
    span = max(view.shown[1] - view.shown[0], 1.0)
    if view.decimated:
        c = view.totals.get("collectives", 0)
        note = (f"{len(view.collectives)} of {c} collectives drawn (the longest in each {view.bucket_us / 1e3:.3g} ms "
                "of a lane); zoom in for each")  # fmt: skip
        title = f"{title}: {note}" if title else note
    fig = figure(title, barmode="overlay", height=110 + 46 * len(view.ranks), showlegend=True)
    _phases(fig, view, lane, span)
    if len(view.compute):  # compute: a thin band at the bottom of each lane
        c = view.compute
        merged = c["count"].to_numpy() > 1
        text = np.where(merged, [f"{n} compute spans, {b / 1e3:.2f} ms busy" for n, b in zip(c["count"], c["busy_us"])],
                        "compute")  # fmt: skip
        fig.add_trace(go.Bar(
            y=c["rank"].map(lane).to_numpy(dtype=float) - 0.28, base=(c["s"].to_numpy(dtype=float) - t0) / 1e3,
            x=np.maximum(c["dur_us"].to_numpy(dtype=float), span / 2000) / 1e3, orientation="h", width=0.12,
            name="compute", marker={"color": "#adb5bd"}, hovertext=text,
            hovertemplate="%{hovertext} %{x:.2f} ms<extra></extra>",
        ))  # fmt: skip
    f = view.collectives
    if len(f):  # collectives, with what hover needs: bytes, bandwidth, layer, module and the matched peers
        info = matched_peers(a, f)
        for kind, g in f.groupby("kind", sort=False):
            m = info.loc[g.index]
            custom = np.column_stack([
                g["rank"].astype(int), g["op"].astype(str), g["in_bytes"].map(_bytes_text),
                g["wire_bytes"].map(_bytes_text), m["algbw"], m["peers"], g["layer"].map(_layer_text),
                g["module"].fillna("").astype(str), g["phase"].astype(str), (g["bar_dur"] / 1e3).round(4),
                g["issue_ms"].round(4), m["straggler"], g["raw_start"].round(2),
                (g["raw_start"] + g["bar_dur"]).round(2),
                g["hidden"].map(lambda n: f"<br>and {n} more in this {view.bucket_us / 1e3:.3g} ms: zoom in" if n
                                else ""),
            ])  # fmt: skip
            fig.add_trace(go.Bar(
                y=g["rank"].map(lane).to_numpy(dtype=float) + 0.08, base=(g["bar_start"] - t0) / 1e3,
                x=np.maximum(g["bar_dur"], span / 400) / 1e3, orientation="h", width=0.5, name=kind,
                marker={"color": kind_color(kind), "line": {"width": 0}}, customdata=custom,
                hovertemplate=(
                    f"<b>{kind}</b> on rank %{{customdata[0]}} (%{{customdata[1]}})<br>"
                    "in %{customdata[2]}, wire %{customdata[3]}, %{customdata[4]}<br>"
                    "layer %{customdata[6]} %{customdata[7]}, %{customdata[8]}<br>"
                    "transfer %{customdata[9]:.2f} ms, issued at %{customdata[10]:.2f} ms<br>"
                    "matched with %{customdata[5]}; straggler %{customdata[11]}%{customdata[14]}<extra></extra>"
                ),
            ))  # fmt: skip
        _links_and_stragglers(fig, view, lane)
    _critical_path(fig, view, lane)
    lo, hi = view.shown
    pad = 0.0 if view.asked else span * 0.01  # a range the user zoomed to is shown as asked
    fig.update_layout(
        xaxis={"title": "ms from the step start (clocks aligned across ranks)",
               "range": [(lo - pad - t0) / 1e3, (hi + pad - t0) / 1e3]},
        yaxis={"tickvals": list(lane.values()), "ticktext": [f"rank {r}" for r in lane], "autorange": "reversed",
               "range": [len(view.ranks) - 0.5, -0.85], "showgrid": False, "zeroline": False},
        legend={"traceorder": "normal"}, hovermode="closest",
        meta={"points": view.points, "decimated": view.decimated, "bucket_ms": view.bucket_us / 1e3,
              "window_ms": [(view.lo_us - t0) / 1e3, (view.hi_us - t0) / 1e3],
              "extent_ms": [(view.extent[0] - t0) / 1e3, (view.extent[1] - t0) / 1e3]},
    )  # fmt: skip
    return fig


def _phases(fig: go.Figure, view: LaneView, lane: dict[int, int], span: float) -> None:
    """Phases: background bands behind each rank's lane (a bar trace per phase, beneath the rest),
    each named once above the top lane where it is wide enough to read."""
    p = view.phases
    if p.empty:
        return
    t0 = view.t0
    for name, g in p.groupby("phase", sort=False):
        fill = PHASE_COLORS.get(name, PHASE_COLORS["step"])
        fig.add_trace(go.Bar(
            y=g["rank"].map(lane).to_numpy(dtype=float), base=(g["s"].to_numpy(dtype=float) - t0) / 1e3,
            x=g["dur_us"].to_numpy(dtype=float) / 1e3, orientation="h", width=0.96, name=str(name),
            marker={"color": fill, "line": {"width": 0}}, hoverinfo="skip", showlegend=False,
        ))  # fmt: skip
    top = p[(p["rank"] == view.ranks[0]) & (p["phase"] != "step") & (p["dur_us"] >= span / 40)]
    fig.update_layout(annotations=[
        {"x": (s - t0) / 1e3, "y": -0.5, "text": name, "showarrow": False, "xanchor": "left", "yanchor": "bottom",
         "font": {"size": 11, "color": COLORS["gray"]}}
        for s, name in zip(top["s"].to_numpy(dtype=float), top["phase"])
    ][:200])  # fmt: skip


def _bytes_text(v: float | None) -> str:
    return "?" if v is None or (isinstance(v, float) and np.isnan(v)) else human_bytes(float(v))


def _layer_text(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else str(int(v))


def _links_and_stragglers(fig: go.Figure, view: LaneView, lane: dict[int, int]) -> None:
    """A grey line through the ranks of each linked collective, a purple one from a send's start to
    its receive's end, and a red marker under each straggler (sptrace.lane_window chose them).
    Each line is one trace, its collectives apart by gaps (NaN)."""
    t0 = view.t0
    links = view.links
    if len(links):
        p2p = links["p2p"].to_numpy(dtype=bool)
        x = (links["bar_start"].to_numpy(dtype=float) - t0) / 1e3
        y = links["rank"].map(lane).to_numpy(dtype=float) + 0.08
        same = links[~p2p]
        if len(same):  # each collective's members in rank order, then a gap
            gid = same.groupby(["group", "key"], sort=False).ngroup().to_numpy()
            last = np.r_[gid[1:] != gid[:-1], True]
            at = np.arange(len(same)) + np.r_[0, np.cumsum(last)[:-1]]
            xs, ys = np.full(len(same) + int(last.sum()), np.nan), np.full(len(same) + int(last.sum()), np.nan)
            xs[at], ys[at] = x[~p2p], y[~p2p]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="same collective", hoverinfo="skip",
                                     line={"color": "rgba(73,80,87,0.25)", "width": 1}))  # fmt: skip
        if p2p.any():  # the sender is listed first: from its start to the receive's end, then a gap
            end = (links["bar_end"].to_numpy(dtype=float) - t0) / 1e3
            send, recv = np.flatnonzero(p2p)[0::2], np.flatnonzero(p2p)[1::2]
            gap = np.full(len(send), np.nan)
            fig.add_trace(go.Scatter(
                x=np.column_stack([x[send], end[recv], gap]).ravel(),
                y=np.column_stack([y[send], y[recv], gap]).ravel(), mode="lines", name="send -> receive",
                hoverinfo="skip", line={"color": "rgba(190,75,219,0.45)", "width": 1},
            ))  # fmt: skip
    strag = view.stragglers
    if len(strag):
        fig.add_trace(go.Scatter(
            x=(strag["bar_start"].to_numpy(dtype=float) - t0) / 1e3,
            y=strag["rank"].map(lane).to_numpy(dtype=float) - 0.22, mode="markers", name="straggler (arrived last)",
            marker={"symbol": "triangle-down", "size": 8, "color": COLORS["red"]},
            hovertemplate="rank %{y} arrived last<extra></extra>",
        ))  # fmt: skip


def _critical_path(fig: go.Figure, view: LaneView, lane: dict[int, int]) -> None:
    """The critical path (sptrace.reduce.critical) as one line through the lanes: along a lane
    while its rank is on the path, across lanes where it moves to the rank that arrived last.
    Each point's hover names its segment (or, where several merged, the longest of them)."""
    seg = view.critical
    if seg.empty:
        return
    t0 = view.t0
    xs: list[float | None] = []
    ys: list[float | None] = []
    text: list[str | None] = []
    for s in seg.itertuples(index=False):
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
        if s.merged > 1:
            label += f"<br>({int(s.merged)} segments of rank {int(s.rank)} here: zoom in)"
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
