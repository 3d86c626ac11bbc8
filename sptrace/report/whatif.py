"""The what-if's figure (sptrace.whatif): the measured critical path beside the predicted one, as
two stacked bars on one axis, each the path's time by kind (compute, transfer, wait, idle). It
draws what the two paths say (CriticalPath.by_kind, .step_us) and computes nothing."""

from __future__ import annotations

from typing import Protocol

import plotly.graph_objects as go

from sptrace.report.theme import COLORS, empty, figure


class CriticalPath(Protocol):
    """What the figure reads of a critical path (sptrace.reduce.critical.CriticalPath, which views
    do not import): its length and its time by kind, in us."""

    @property
    def step_us(self) -> float: ...

    def by_kind(self) -> dict[str, float]: ...


KIND_COLORS = {"compute": COLORS["blue"], "transfer": COLORS["orange"], "wait": COLORS["red"], "idle": "#ced4da"}
"""A critical path's kinds of segment (sptrace.reduce.critical.KINDS); a kind not named here is dark."""


def whatif_paths(measured: CriticalPath | None, predicted: CriticalPath | None, *,
                 labels: tuple[str, str] = ("measured", "predicted")) -> go.Figure:  # fmt: skip
    """Two horizontal stacked bars, ``measured`` on top: each path's ms in each kind, its whole
    length written at its end. A path that is None has no bar (both None: nothing to show)."""
    paths = [(label, p) for label, p in zip(labels, (measured, predicted)) if p is not None]
    if not paths:
        return empty("critical path, measured and predicted: no path to draw")
    fig = figure("critical path by kind, measured and predicted (ms)", barmode="stack", height=230,
                 xaxis_title="ms on the critical path")  # fmt: skip
    names = [label for label, _ in paths]
    kinds = list(dict.fromkeys(k for _, p in paths for k in p.by_kind()))
    for kind in kinds:
        ms = [p.by_kind().get(kind, 0.0) / 1e3 for _, p in paths]
        share = [m * 1e3 / p.step_us if p.step_us > 0 else 0.0 for m, (_, p) in zip(ms, paths)]
        fig.add_trace(go.Bar(
            x=ms, y=names, orientation="h", name=kind, marker={"color": KIND_COLORS.get(kind, COLORS["dark"])},
            customdata=share,
            hovertemplate=f"{kind} %{{x:.2f}} ms (%{{customdata:.0%}} of the path)<extra>%{{y}}</extra>",
        ))  # fmt: skip
    for label, p in paths:
        fig.add_annotation(x=p.step_us / 1e3, y=label, text=f" {p.step_us / 1e3:.2f} ms", showarrow=False,
                           xanchor="left", font={"size": 12})  # fmt: skip
    longest = max(p.step_us for _, p in paths) / 1e3
    fig.update_xaxes(range=[0, longest * 1.15 if longest > 0 else 1])
    fig.update_yaxes(categoryorder="array", categoryarray=names[::-1])  # measured on top
    fig.update_layout(margin={"l": 80, "r": 20, "t": 70, "b": 45}, legend_traceorder="normal")
    return fig
