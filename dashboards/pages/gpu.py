"""GPU: for runs with GPU kernels, HolisticTraceAnalysis's temporal breakdown, communication /
computation overlap and kernel-type breakdown (sptrace.gpu computes them, once per run, when the
page asks)."""

from __future__ import annotations

from dash.development.base_component import Component
from sptrace.dashboards.pages.common import View, error_box, graph, grid, note_box, page_title
from sptrace.dashboards.store import RunStore

from sptrace.gpu import has_gpu_kernels, hta_breakdown
from sptrace.report import figures
from sptrace.vocab.errors import SptraceError


def render(store: RunStore, view: View) -> list[Component]:
    a = store.get(view.run)
    head = page_title("GPU (HTA)", "HolisticTraceAnalysis over the run's GPU kernels: where each rank's GPU time "
                      "goes, and how much communication compute hides.")  # fmt: skip
    if isinstance(a, SptraceError):
        return [head, error_box(str(a))]
    if not has_gpu_kernels(a):
        return [head, note_box("no GPU kernels in this run (a CPU / gloo trace): HTA's analyses need them",
                               color="gray", class_name="no-gpu")]  # fmt: skip
    try:
        hta = store.cached(view.run, "hta", lambda: hta_breakdown(a))
    except Exception as exc:  # HTA is a third party: its failure is shown, not raised
        return [head, error_box(f"HTA failed on this run: {type(exc).__name__}: {exc}")]
    return [
        head,
        graph("gpu-temporal", figures.temporal_breakdown(hta.temporal)),
        grid(hta.overlap, "gpu-overlap", "communication / computation overlap (HTA)", height=300),
        grid(hta.kernel_types, "gpu-kernels", "GPU time by kernel type (HTA)", height=300),
    ]
