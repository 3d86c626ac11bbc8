"""The look the dashboard and the HTML report share: the plotly template ``sptrace`` (every
figure uses it), whose type and colours match the dashboard's Mantine theme; the colours of
verdicts, severities, collective kinds, sharding classes and phases; and the column headers of
the dashboard's grids and the report's tables. System fonts only: nothing is fetched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import plotly.graph_objects as go
import plotly.io as pio

from sptrace.vocab import collective_kinds

if TYPE_CHECKING:
    from typing_extensions import Unpack

FONT = "Inter, system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
"""System fonts only: an air-gapped cluster downloads nothing."""
# Mantine's default palette (shade 6), shared by the dashboard's components and the figures
COLORS = {
    "blue": "#228be6", "orange": "#fd7e14", "teal": "#12b886", "red": "#fa5252", "violet": "#7950f2",
    "cyan": "#15aabf", "grape": "#be4bdb", "lime": "#82c91e", "yellow": "#fab005", "pink": "#e64980",
    "gray": "#868e96", "dark": "#343a40", "green": "#40c057", "indigo": "#4c6ef5",
}  # fmt: skip
VERDICT_COLORS = {"pass": "#2f9e44", "fail": "#e03131", "undecided": "#f08c00", "unavailable": "#868e96"}
"""Green MATCH/PASS, red MISMATCH/FAIL, amber CANNOT DECIDE / ambiguous, grey not checked."""
SEVERITY_COLORS = {"error": VERDICT_COLORS["fail"], "warning": VERDICT_COLORS["undecided"], "info": "#868e96"}


def kind_color(kind: object) -> str:
    """A collective kind's colour (the table of collective kinds names it); dark for one it does not know."""
    known = collective_kinds.get(str(kind))
    return COLORS.get(known.color, COLORS["dark"]) if known is not None else COLORS["dark"]


CLASS_COLORS = {
    "seq-sharded": "#37b24d", "head-sharded": "#1c7ed6", "ambiguous": VERDICT_COLORS["undecided"],
    "full": VERDICT_COLORS["fail"], "other": "#ced4da", "unknown": "#adb5bd",
}  # fmt: skip
GROUP_COLORS = {
    "sharded": CLASS_COLORS["seq-sharded"], "full": CLASS_COLORS["full"], "undecided": VERDICT_COLORS["undecided"],
    "other": CLASS_COLORS["other"], "backend or parameter": "#e9ecef",
}  # fmt: skip
"""The sharding check's groups of retained tensors (sptrace.checks.sharding_verdict.GROUPS), in
the order the memory figure stacks them."""
PHASE_COLORS = {"forward": "rgba(34,139,230,0.08)", "backward": "rgba(253,126,20,0.09)",
                "optimizer": "rgba(134,142,150,0.10)", "step": "rgba(134,142,150,0.05)"}  # fmt: skip
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


class Layout(TypedDict, total=False):
    """What a figure sets of its plotly layout beside the template and the title."""

    barmode: str
    height: int
    showlegend: bool
    xaxis_title: str
    yaxis_title: str
    xaxis_type: str


def figure(title: str, **layout: Unpack[Layout]) -> go.Figure:
    """An empty figure on the sptrace template."""
    return go.Figure().update_layout(template=TEMPLATE, title=title, **layout)


def empty(title: str) -> go.Figure:
    """A figure with nothing to plot, saying so."""
    return figure(title).add_annotation(text="nothing to show", showarrow=False, x=0.5, y=0.5, xref="paper",
                                        yref="paper", font={"color": COLORS["gray"]})  # fmt: skip
