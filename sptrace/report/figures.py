"""Figures over sptrace's analyses, built from its public API's outputs (pandas frames and
reports). One module for the HTML report and the Dash app alike (the app imports it; the
library never imports the app); plotly only, no Dash."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from sptrace.costmodel import CommEstimate, estimate_comm
from sptrace.costmodel.comm import as_shape

KIND_COLORS = {
    "all_gather": "#1f77b4", "reduce_scatter": "#ff7f0e", "all_to_all": "#2ca02c", "all_reduce": "#d62728",
    "broadcast": "#9467bd", "send_recv": "#8c564b", "send": "#8c564b", "recv": "#c49c94", "barrier": "#7f7f7f",
    "scatter": "#17becf", "gather": "#9edae5", "reduce": "#e377c2", "other": "#bcbd22",
}  # fmt: skip
CLASS_COLORS = {
    "seq-sharded": "#2ca02c",
    "head-sharded": "#1f77b4",
    "full": "#d62728",
    "ambiguous": "#ffbf00",
    "other": "#c7c7c7",
    "unknown": "#7f7f7f",
}
MiB = 2**20


PHASE_COLORS = {"forward": "#dbe9f6", "backward": "#fde2c8", "optimizer": "#e5e5e5", "step": "#eeeeee"}


def collective_timeline(
    frame: pd.DataFrame,
    offsets_us: dict[int, float] | None = None,
    *,
    phases: pd.DataFrame | None = None,
    links: pd.DataFrame | None = None,
    max_bars: int = 5000,
    max_links: int = 500,
) -> go.Figure:
    """Ranks as rows, each collective a bar on a clock aligned across ranks (offsets from the
    matching); the first ``max_bars`` collectives in time, so the page stays light."""
    fig = go.Figure()
    if frame.empty:
        return fig.update_layout(title="no collectives")
    f = frame.copy()
    offsets = offsets_us or {}
    # a bar spans the transfer (NCCL kernel, gloo worker) where the trace links one, else the issue
    has_transfer = f["transfer_start_us"].notna()
    f["bar_start"] = f["transfer_start_us"].astype(float).where(has_transfer, f["start_us"].astype(float))
    f["bar_dur"] = f["transfer_dur_us"].astype(float).where(has_transfer, f["dur_us"].astype(float))
    f["t0"] = f["bar_start"] - f["rank"].map(lambda r: offsets.get(int(r), 0.0))
    t_min = f["t0"].min()
    if phases is not None and not phases.empty:  # the axis starts with the first phase
        t_min = min(t_min, (phases["start_us"] - phases["rank"].map(lambda r: offsets.get(int(r), 0.0))).min())
    f = f.sort_values("t0").head(max_bars)
    for kind, g in f.groupby("kind"):
        fig.add_trace(go.Bar(
            y=[f"rank {int(r)}" for r in g["rank"]], x=g["bar_dur"].clip(lower=1) / 1e3, base=(g["t0"] - t_min) / 1e3,
            orientation="h", name=kind, marker_color=KIND_COLORS.get(kind, "#333"),
            customdata=g[["module", "phase", "in_bytes"]].astype(str).values,
            hovertemplate="%{y}<br>%{customdata[0]} (%{customdata[1]})<br>%{customdata[2]} B"
            + f"<extra>{kind}</extra>",
        ))  # fmt: skip
    if phases is not None and not phases.empty:
        # a compute lane under each rank's collectives: its phases, on the same aligned clock
        p = phases.assign(t0=phases["start_us"] - phases["rank"].map(lambda r: offsets.get(int(r), 0.0)))
        for phase, g in p.groupby("phase"):
            fig.add_trace(go.Bar(
                y=[f"rank {int(r)} phases" for r in g["rank"]], x=g["dur_us"] / 1e3, base=(g["t0"] - t_min) / 1e3,
                orientation="h", name=f"{phase} (phase)", marker_color=PHASE_COLORS.get(phase, "#eee"),
                hovertemplate="%{y}<br>" + phase + ": %{x:.1f} ms<extra></extra>",
            ))  # fmt: skip
    if links is not None and not links.empty:
        # the same collective on every rank: a thin line through its bars' starts
        lk = links[links["start_us"].isin(f["start_us"])].merge(
            f[["rank", "start_us", "t0"]], on=["rank", "start_us"], how="inner"
        )
        xs: list[float | None] = []
        ys: list[str | None] = []
        for _, m in list(lk.groupby(["group", "key"], sort=False))[:max_links]:
            m = m.sort_values("rank")
            xs += [*((m["t0"] - t_min) / 1e3), None]
            ys += [*(f"rank {int(r)}" for r in m["rank"]), None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="same collective", hoverinfo="skip",
                                 line={"color": "rgba(80,80,80,0.35)", "width": 1}))  # fmt: skip
    ranks = []
    for r in sorted(f["rank"].unique(), reverse=True):  # rank 0 on top
        if phases is not None and not phases.empty:
            ranks.append(f"rank {int(r)} phases")
        ranks.append(f"rank {int(r)}")
    return fig.update_layout(
        barmode="overlay",
        title="collectives per rank (aligned clocks)",
        xaxis_title="ms",
        height=120 + 28 * len(ranks),
        yaxis={"categoryorder": "array", "categoryarray": ranks},
    )


def wire_by_kind(frame: pd.DataFrame, est: CommEstimate | None) -> go.Figure:
    """Wire bytes per rank and step by collective kind: measured (mean over ranks; collectives of
    unknown size left out) and the model."""
    ranks = max(frame["rank"].nunique(), 1) if not frame.empty else 1
    measured = frame.groupby("kind")["wire_bytes"].sum() / ranks if not frame.empty else pd.Series(dtype=float)
    fig = go.Figure(go.Bar(x=list(measured.index), y=list(measured.values / MiB), name="measured"))
    if est is not None:
        kinds = sorted({c.kind for c in est.collectives} | set(measured.index))
        fig.add_trace(go.Bar(x=kinds, y=[est.wire_per_step(k) / MiB for k in kinds], name="model"))
    return fig.update_layout(barmode="group", title="wire bytes per rank and step", yaxis_title="MiB")


def saved_by_layer(saved: pd.DataFrame) -> go.Figure:
    """Bytes kept for backward per layer (mean over ranks), stacked by sharding class."""
    fig = go.Figure()
    if saved.empty:
        return fig.update_layout(title="no saved activations")
    s = saved.assign(layer=saved["layer"].fillna(-1).astype(int))
    ranks = max(s["rank"].nunique(), 1)
    for cls in CLASS_COLORS:
        part = s[s["class"] == cls]
        if part.empty:
            continue
        per_layer = part.groupby("layer")["storage_bytes"].sum() / ranks
        labels = ["outside layers" if i < 0 else f"layer {i}" for i in per_layer.index]
        fig.add_trace(go.Bar(x=labels, y=per_layer.values / 2**10, name=cls, marker_color=CLASS_COLORS[cls]))
    return fig.update_layout(barmode="stack", title="activations kept for backward, per rank", yaxis_title="KiB")


def model_sweep(
    base: object, seqs: list[int], schemes: tuple[str, ...] = ("megatron", "ulysses", "hybrid")
) -> go.Figure:
    """The cost model's wire GiB per rank and step against sequence length (the first article's
    table), for each scheme at ``base``'s other settings (a ModelShape with every value known)."""
    fig = go.Figure()
    shape = as_shape(base)
    for scheme in schemes:
        ys = []
        for s in seqs:
            zero = "-zero3" if shape.zero3 and scheme != "megatron" else ""
            ys.append(estimate_comm(shape.override("sweep", scheme=scheme + zero, seq=s)).wire_per_step() / 2**30)
        fig.add_trace(go.Scatter(x=seqs, y=ys, mode="lines+markers", name=scheme))
    return fig.update_layout(
        title="model: wire bytes per rank and step", xaxis_title="sequence length", yaxis_title="GiB", xaxis_type="log"
    )


def sweep_fit(table: pd.DataFrame, coefficients: dict[str, float]) -> go.Figure:
    """Measured step time per run against the fitted regression's prediction."""
    s_k = table["seq"] / 1024
    pred = (
        coefficients["intercept"] + coefficients["peak_GiB"] * table["peak_GiB"]
        + coefficients["comm_GiB"] * table["comm_GiB"] + coefficients["S_K"] * s_k + coefficients["S_K^2"] * s_k**2
    )  # fmt: skip
    fig = go.Figure()
    for scheme, g in table.assign(pred=pred).groupby("scheme"):
        fig.add_trace(go.Scatter(x=g["seq"], y=g["step_ms"], mode="markers", name=f"{scheme} measured"))
        fig.add_trace(go.Scatter(x=g["seq"], y=g["pred"], mode="lines", name=f"{scheme} fit"))
    return fig.update_layout(title="step time: measured and fitted", xaxis_title="sequence length", yaxis_title="ms")


def temporal_breakdown(frame: pd.DataFrame) -> go.Figure:
    """HTA's temporal breakdown: idle, compute and non-compute share of each rank's GPU time."""
    fig = go.Figure()
    for column, color in (
        ("idle_time_pctg", "#c7c7c7"),
        ("compute_time_pctg", "#2ca02c"),
        ("non_compute_time_pctg", "#ff7f0e"),
    ):
        if column in frame:
            ranks = [f"rank {r}" for r in frame["rank"]]
            fig.add_trace(go.Bar(x=ranks, y=frame[column], name=column.removesuffix("_pctg"), marker_color=color))
    return fig.update_layout(barmode="stack", title="GPU time per rank (HTA temporal breakdown)", yaxis_title="%")


def wire_by_layer(frame: pd.DataFrame) -> go.Figure:
    """Wire bytes per layer and phase, per rank (mean over ranks); collectives outside layers
    (gradient syncs) in their own bar."""
    fig = go.Figure()
    if frame.empty:
        return fig.update_layout(title="no collectives")
    ranks = max(frame["rank"].nunique(), 1)
    f = frame.assign(where=frame["layer"].map(lambda v: "outside layers" if pd.isna(v) else f"layer {int(v)}"))
    for phase, g in f.groupby("phase"):
        per = g.groupby("where")["wire_bytes"].sum() / ranks / 2**10
        fig.add_trace(go.Bar(x=list(per.index), y=list(per.values), name=phase))
    return fig.update_layout(barmode="stack", title="wire bytes per layer and phase, per rank", yaxis_title="KiB")


def memory_over_step(series: pd.DataFrame) -> go.Figure:
    """Allocated memory over the step, one line per rank (from [memory] events)."""
    fig = go.Figure()
    if series.empty:
        return fig.update_layout(title="no [memory] events")
    t0 = series["ts_us"].min()
    for rank, g in series.groupby("rank"):
        x, y = (g["ts_us"] - t0) / 1e3, g["allocated_bytes"] / 2**20
        fig.add_trace(go.Scattergl(x=x, y=y, mode="lines", name=f"rank {rank}"))
    return fig.update_layout(title="allocated memory over the step", xaxis_title="ms", yaxis_title="MiB")
