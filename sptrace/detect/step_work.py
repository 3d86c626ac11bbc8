"""One rank's work lane summed per profiled step, module and phase: what the cross-rank compute
balance (sptrace.reduce.balance) compares, reduced where the rank is parsed so that the reduce
holds a few dozen rows a rank, never the lanes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sptrace.detect.columns import empty_frame, sums_by, values_of
from sptrace.detect.timing import RankTiming

STEP_WORK_COLUMNS = ["rank", "step", "module", "phase", "time_us"]
ONE_STEP = "step"
"""The step's name where the rank recorded no profiler steps (its measured step window)."""


def work_by_step(work: pd.DataFrame | None, timing: RankTiming | None) -> pd.DataFrame:
    """The lane's time per (step, module, phase): each stretch in the profiler step it starts in
    (every step the rank recorded; else its measured step window, named ONE_STEP); stretches with
    no module or outside every step are left out."""
    if work is None or work.empty or timing is None:
        return empty_frame(STEP_WORK_COLUMNS)
    windows = list(timing.steps)
    if not windows and timing.step_start_us is not None and timing.step_ms is not None:
        windows = [(ONE_STEP, timing.step_start_us, timing.step_start_us + timing.step_ms * 1e3)]
    start = work["start_us"].to_numpy(dtype=float)
    step = np.full(len(work), None, dtype=object)
    for name, lo, hi in windows:
        step[(start >= lo) & (start < hi)] = name
    keys = {"rank": [timing.rank] * len(work), "step": step.tolist(), "module": values_of(work["module"]),
            "phase": values_of(work["phase"])}  # fmt: skip
    return sums_by(keys, work["dur_us"].to_numpy(dtype=float).tolist(), "time_us")
