"""Figures of one run's bytes and memory: wire bytes by kind and by layer against the cost
model, bandwidth against size, what each layer keeps for backward against Korthikanti's figure,
allocated memory over the step, and HTA's temporal breakdown. Each takes a finished RunAnalysis
(or one of its tables) and returns a plotly figure on the sptrace template (sptrace.report.theme);
none computes a model: the estimate it draws against is the analysis's own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sptrace.analysis import RunAnalysis
from sptrace.lanes import boundary_us, on_aligned_clock
from sptrace.report.theme import COLORS, GROUP_COLORS, PHASE_COLORS, VERDICT_COLORS, empty, figure, kind_color

MiB = 2**20


# ---- collectives -------------------------------------------------------------------------------


def wire_by_kind(a: RunAnalysis) -> go.Figure:
    """Wire bytes per rank and step by collective kind: measured (mean over ranks; collectives of
    unknown size left out) and the model; a kind that differs from the model is outlined red."""
    frame, est = a.collectives, a.estimate
    ranks = max(frame["rank"].nunique(), 1) if not frame.empty else 1
    measured = frame.groupby("kind")["wire_bytes"].sum() / ranks if not frame.empty else pd.Series(dtype=float)
    kinds = sorted(set(measured.index) | ({c.kind for c in est.collectives} if est else set()))
    model = [est.wire_per_step(k) / MiB for k in kinds] if est else None
    got = [float(measured.get(k, 0.0)) / MiB for k in kinds]
    differs = [model is not None and not np.isclose(g, m, rtol=1e-9, atol=1e-9) for g, m in zip(got, model or got)]
    fig = figure("wire bytes per rank and step, by kind", barmode="group", yaxis_title="MiB")
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


def wire_by_layer(a: RunAnalysis) -> go.Figure:
    """Wire bytes per layer and phase, per rank (mean over ranks), against the model's per-layer
    figure; collectives outside layers (gradient syncs) in their own bar. A bar that differs from
    the model is outlined red."""
    frame, est = a.collectives, a.estimate
    if frame.empty:
        return empty("wire bytes per layer")
    ranks = max(frame["rank"].nunique(), 1)
    f = frame.assign(where=frame["layer"].map(lambda v: "outside layers" if pd.isna(v) else f"layer {int(v)}"))
    fig = figure("wire bytes per layer and phase, per rank", barmode="stack", yaxis_title="KiB")
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
        return empty("bandwidth against size")
    fig = figure("bandwidth against size (matched collectives)", xaxis_title="bytes", yaxis_title="GB/s",
                  xaxis_type="log")  # fmt: skip
    for kind, g in m.groupby("kind"):
        color = kind_color(kind)
        fig.add_trace(go.Scatter(x=g["in_bytes"], y=g["busbw_gbps"], mode="markers", name=f"{kind} busbw",
                                 marker={"color": color, "size": 8}))  # fmt: skip
        fig.add_trace(go.Scatter(x=g["in_bytes"], y=g["algbw_gbps"], mode="markers", name=f"{kind} algbw",
                                 marker={"color": color, "size": 7, "symbol": "circle-open"}))  # fmt: skip
    return fig


# ---- memory ------------------------------------------------------------------------------------


def retained_by_layer(saved: pd.DataFrame, expected_bytes: float | None = None) -> go.Figure:
    """Bytes kept across the boundary per layer (mean over ranks), stacked by the sharding
    check's groups (sharded / full / undecided / other / backend or parameter: the ``group`` column),
    against Korthikanti's figure for the scheme."""
    if saved.empty:
        return empty("retained across the forward/backward boundary")
    s = saved.assign(layer=saved["layer"].fillna(-1).astype(int))
    ranks = max(s["rank"].nunique(), 1)
    fig = figure("retained across the forward/backward boundary, per layer and rank", barmode="stack",
                  yaxis_title="KiB")  # fmt: skip
    for group, color in GROUP_COLORS.items():
        part = s[s["group"] == group]
        if part.empty:
            continue
        per_layer = part.groupby("layer")["storage_bytes"].sum() / ranks
        labels = ["outside layers" if i < 0 else f"layer {i}" for i in per_layer.index]
        fig.add_trace(go.Bar(x=labels, y=per_layer.values / 2**10, name=group, marker_color=color,
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


def memory_over_step(a: RunAnalysis, max_points: int = 4000) -> go.Figure:
    """Allocated memory over the step, one line per rank (Total Allocated of [memory] events),
    with the step's phases as bands and each rank's forward -> backward boundary marked."""
    series = a.memory
    if series.empty:
        return empty("allocated memory over the step (no [memory] events)")
    ranks = sorted(series["rank"].unique())
    t0 = a.step_zero_us
    fig = figure("allocated memory over the step", xaxis_title="ms from the step start", yaxis_title="MiB")
    if len(a.phases):  # the bands set at once: add_vrect per band re-validates every shape before it (O(n^2))
        first = a.phases[a.phases["rank"] == ranks[0]]
        starts = (on_aligned_clock(a, first).to_numpy(dtype=float) - t0) / 1e3
        fig.update_layout(shapes=[
            {"type": "rect", "xref": "x", "yref": "y domain", "x0": x0, "x1": x0 + dur / 1e3, "y0": 0, "y1": 1,
             "line": {"width": 0}, "layer": "below", "fillcolor": PHASE_COLORS.get(phase, PHASE_COLORS["step"])}
            for x0, dur, phase in zip(starts, first["dur_us"].to_numpy(dtype=float), first["phase"])
        ])  # fmt: skip
    for rank, g in series.groupby("rank"):
        g = _min_max_thin(g.sort_values("ts_us"), "ts_us", "allocated_bytes", max_points)
        x = (on_aligned_clock(a, g, "ts_us") - t0) / 1e3
        # SVG lines, not Scattergl: a WebGL context per figure costs more than drawing a few
        # thousand points, and headless or remote browsers often have no GPU at all
        fig.add_trace(go.Scatter(x=x, y=g["allocated_bytes"] / MiB, mode="lines", line_shape="hv",
                                 name=f"rank {rank}", hovertemplate="%{x:.2f} ms: %{y:.1f} MiB<extra>rank "
                                 f"{rank}</extra>"))  # fmt: skip
    boundary = boundary_us(a)
    if boundary is not None:
        x = (boundary - t0) / 1e3
        fig.add_vline(x=x, line_dash="dash", line_color=COLORS["dark"], annotation_text="forward → backward",
                      annotation_position="top")  # fmt: skip
    return fig


# ---- GPU (HTA) ---------------------------------------------------------------------------------


def temporal_breakdown(frame: pd.DataFrame) -> go.Figure:
    """HTA's temporal breakdown: idle, compute and non-compute share of each rank's GPU time."""
    fig = figure("GPU time per rank (HTA temporal breakdown)", barmode="stack", yaxis_title="%")
    for column, color in (
        ("idle_time_pctg", "#ced4da"),
        ("compute_time_pctg", COLORS["teal"]),
        ("non_compute_time_pctg", COLORS["orange"]),
    ):
        if column in frame:
            ranks = [f"rank {r}" for r in frame["rank"]]
            fig.add_trace(go.Bar(x=ranks, y=frame[column], name=column.removesuffix("_pctg"), marker_color=color))
    return fig
