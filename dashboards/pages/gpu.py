"""GPU: for runs with GPU kernels, HolisticTraceAnalysis's temporal breakdown, communication /
computation overlap and kernel-type breakdown. HTA is imported here only, when the page asks."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from sptrace.dashboards.pages.common import View, error_box, graph, grid, note_box, page_title
from sptrace.dashboards.store import RunStore

from sptrace.report import figures
from sptrace.vocab.errors import SptraceError


def hta_analyses(run: Any) -> dict[str, Any]:
    """HTA over the run's rank traces (linked into a private folder: HTA would read run.json and
    the logs as traces, and must not write next to read-only traces)."""
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="sptrace-hta-") as tmp:
        for trace in run:
            suffix = ".json.gz" if trace.path.name.endswith(".gz") else ".json"
            (Path(tmp) / f"rank{trace.rank}{suffix}").symlink_to(trace.path.resolve())
        analysis = TraceAnalysis(trace_dir=tmp)
        temporal = analysis.get_temporal_breakdown(visualize=False)
        overlap = analysis.get_comm_comp_overlap(visualize=False)
        kernel_types = analysis.get_gpu_kernel_breakdown(visualize=False)[0]
    return {"temporal": temporal, "overlap": overlap, "kernel_types": kernel_types}


def render(store: RunStore, view: View) -> Any:
    a = store.get(view.run)
    head = page_title("GPU (HTA)", "HolisticTraceAnalysis over the run's GPU kernels: where each rank's GPU time "
                      "goes, and how much communication compute hides.")  # fmt: skip
    if isinstance(a, SptraceError):
        return [head, error_box(str(a))]
    run = a.run
    if not any(t.category_counts().get("kernel", 0) for t in run):
        return [head, note_box("no GPU kernels in this run (a CPU / gloo trace): HTA's analyses need them",
                               color="gray", class_name="no-gpu")]  # fmt: skip
    try:
        hta = store.cached(view.run, "hta", lambda: hta_analyses(run))
    except Exception as exc:  # HTA is a third party: its failure is shown, not raised
        return [head, error_box(f"HTA failed on this run: {type(exc).__name__}: {exc}")]
    return [
        head,
        graph("gpu-temporal", figures.temporal_breakdown(hta["temporal"])),
        grid(hta["overlap"], "gpu-overlap", "communication / computation overlap (HTA)", height=300),
        grid(hta["kernel_types"], "gpu-kernels", "GPU time by kernel type (HTA)", height=300),
    ]
