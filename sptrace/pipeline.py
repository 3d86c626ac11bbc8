"""Every analysis of one run, through sptrace's public API, for the report and the dashboard:
load -> collectives -> matching -> checks against the cost model -> saved activations."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from sptrace.config import StepConfig


def analyse_run(path: Path) -> dict[str, Any]:
    """Everything the report shows about one run, through sptrace's public API."""
    from sptrace.checks import check_collectives
    from sptrace.checks.sharding import ShardingShape, check_sharding
    from sptrace.config import DTYPES
    from sptrace.costmodel import estimate_comm
    from sptrace.detect import detect_run_collectives
    from sptrace.detect.allocations import detect_saved_activations
    from sptrace.detect.matching import match_collectives
    from sptrace.load import load_run

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = load_run(path)
    out: dict[str, Any] = {"path": path, "run": run, "warnings": [str(w.message) for w in seen]}
    frame = detect_run_collectives(run)
    out["collectives"] = frame
    out["matching"] = match_collectives(frame)
    declared = (run.run_info or {}).get("config") or {}
    names = {f.name for f in dataclasses.fields(StepConfig)}
    cfg = None
    if "scheme" in declared:
        cfg = StepConfig.from_dict({k: v for k, v in declared.items() if k in names})
        out["comm"] = check_collectives(frame, estimate_comm(cfg), sorted(run.ranks), out["matching"])
        step = ShardingShape(batch=cfg.batch, seq=cfg.seq, hidden=cfg.hidden, sp_size=cfg.sp_size,
                             element_size=DTYPES[cfg.dtype])  # fmt: skip
        saved = [detect_saved_activations(t, element_size=step.element_size)[0] for t in run]
        out["sharding"] = check_sharding(pd.concat(saved, ignore_index=True), step)
    out["config"] = cfg
    # each rank's profiled step, in ms (ProfilerStep#N)
    step_ms = {}
    for trace in run:
        names = trace.table["name"].cast("string").to_pandas()
        steps = trace.events[names.str.startswith("ProfilerStep#").to_numpy()]
        if len(steps):
            step_ms[trace.rank] = float(steps["dur_ns"].max()) / 1e6
    out["step_ms"] = step_ms
    return out
