"""HolisticTraceAnalysis (HTA) over a run's GPU kernels: each rank's temporal breakdown (idle,
compute and non-compute share of its GPU time), communication / computation overlap, and GPU
time by kernel type, as HTA computes them. The dashboard's GPU page draws the result. HTA is
imported only when asked, and reads the rank traces through links in a private folder: it would
read run.json and the logs as traces, and must not write next to read-only traces.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sptrace.analysis import RunAnalysis


@dataclass(frozen=True)
class GpuBreakdown:
    """HTA's analyses of one run, a row per rank (kernel types: a row per type), as HTA names
    their columns."""

    temporal: pd.DataFrame
    """Per rank: idle_time_pctg, compute_time_pctg, non_compute_time_pctg and their times."""
    overlap: pd.DataFrame
    """Per rank: the share of communication time that computation overlaps."""
    kernel_types: pd.DataFrame
    """GPU time by kernel type (communication, computation, memory), over the run."""


def has_gpu_kernels(a: RunAnalysis) -> bool:
    """Whether any rank of the run recorded a GPU kernel (HTA's analyses need them)."""
    return any(t.category_counts().get("kernel", 0) for t in a.run)


def hta_breakdown(a: RunAnalysis) -> GpuBreakdown:
    """HTA's temporal breakdown, overlap and kernel types over the run's rank traces. HTA is a third
    party: whatever it raises is left to the caller to show."""
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="sptrace-hta-") as tmp:
        for trace in a.run:
            suffix = ".json.gz" if trace.path.name.endswith(".gz") else ".json"
            (Path(tmp) / f"rank{trace.rank}{suffix}").symlink_to(trace.path.resolve())
        analysis = TraceAnalysis(trace_dir=tmp)
        temporal = analysis.get_temporal_breakdown(visualize=False)
        overlap = analysis.get_comm_comp_overlap(visualize=False)
        kernel_types = analysis.get_gpu_kernel_breakdown(visualize=False)[0]
    return GpuBreakdown(temporal, overlap, kernel_types)
