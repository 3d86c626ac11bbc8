"""Figures across runs, the dashboard's Compare page's (the HTML report draws the model sweep of
each run too): runs side by side, the cost model across sequence lengths (a run's model sweep), and a
sweep's measured step times against its fitted regression (a Sweep). The numbers come finished
from sptrace.analysis (RunAnalysis.facts, RunAnalysis.model_sweep) and sptrace.sweep (the fit
and its predictions): these functions only draw them, on the sptrace template.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sptrace.analysis import RunAnalysis
from sptrace.report.theme import CLASS_COLORS, COLORS, TEMPLATE, empty, figure
from sptrace.sweep import UNDERDETERMINED, Sweep


def compare_runs(analyses: Sequence[RunAnalysis]) -> go.Figure:
    """Runs side by side: each run's slowest step split into communication (mean transfer per
    rank) and the rest, wire bytes per rank against the model, and retained bytes per layer and
    rank against Korthikanti's figure."""
    names = [a.name for a in analyses]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07,
                        subplot_titles=("step time (ms)", "wire bytes per rank (MiB)",
                                        "retained per layer and rank (KiB)"))  # fmt: skip
    facts = [a.facts for a in analyses]
    comm = [f.comm_ms or 0.0 for f in facts]
    rest = [max((f.step_ms or 0.0) - c, 0.0) for f, c in zip(facts, comm)]
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
    wire = [f.wire_bytes / 2**20 for f in facts]
    model = [f.model_wire_bytes / 2**20 if f.model_wire_bytes is not None else None for f in facts]
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
    kept = [None if f.retained_per_layer is None else f.retained_per_layer / 2**10 for f in facts]
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


def model_sweep(a: RunAnalysis) -> go.Figure:
    """The cost model's wire GiB per rank and step against sequence length at the run's model
    (RunAnalysis.model_sweep: the first article's table), a line per scheme; a length a scheme
    cannot split is a gap."""
    sweep = a.model_sweep
    if sweep is None:
        return empty("model: wire bytes per rank and step (the run leaves a size of the cost model undeclared)")
    fig = figure("model: wire bytes per rank and step", xaxis_title="sequence length", yaxis_title="GiB",
                 xaxis_type="log")  # fmt: skip
    seqs = list(sweep.seqs)
    for name, wire in sweep.wire_bytes.items():
        ys = [None if b is None else b / 2**30 for b in wire]
        fig.add_trace(go.Scatter(x=seqs, y=ys, mode="lines+markers", name=name))
    fig.update_xaxes(tickvals=seqs, ticktext=[_seq_text(s) for s in seqs])
    return fig


def _seq_text(s: int) -> str:
    return f"{s // 1024}K" if s >= 1024 and s % 1024 == 0 else str(s)


def sweep_fit(sweep: Sweep) -> go.Figure:
    """Measured step time per run against the fitted regression's prediction; an underdetermined
    fit (fewer runs than coefficients) says so in the title, as the CLI does."""
    title = "step time: measured and fitted"
    if sweep.fit is not None and sweep.fit.get("underdetermined"):  # (a hand-written file may leave it out)
        title += f" (underdetermined: {UNDERDETERMINED})"
    fig = figure(title, xaxis_title="sequence length", yaxis_title="ms")
    for scheme, g in sweep.table.assign(pred=sweep.predicted_ms).groupby("scheme"):
        fig.add_trace(go.Scatter(x=g["seq"], y=g["step_ms"], mode="markers", name=f"{scheme} measured"))
        fig.add_trace(go.Scatter(x=g["seq"], y=g["pred"], mode="lines", name=f"{scheme} fit"))
    return fig
