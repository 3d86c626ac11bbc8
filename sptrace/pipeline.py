"""Every analysis of one run, through sptrace's public API, for the report and the dashboard:
load -> collectives -> matching -> checks against the cost model -> saved activations."""

from __future__ import annotations

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
    cfg = None
    if "scheme" in declared:
        cfg = StepConfig.from_run_config(declared)
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
    # per rank: time in collectives (CPU issue to completion) and the rest of the step
    comm_ms = (frame.groupby("rank")["dur_us"].sum() / 1e3).to_dict() if not frame.empty else {}
    out["time_ms"] = {
        r: {"step": s, "comm": comm_ms.get(r, 0.0), "compute": max(s - comm_ms.get(r, 0.0), 0.0)}
        for r, s in step_ms.items()
    }
    out["phases"] = _phases(run)
    out["memory"] = _memory_series(run)
    return out


def _phases(run: Any) -> pd.DataFrame:
    """Each rank's phase ranges (sptrace.phase markers, else its ProfilerStep), in us."""
    from sptrace import markers

    rows = []
    for trace in run:
        ev = trace.events
        names = ev["name"].astype(str)
        marked = ev[names.str.startswith(markers.PHASE)]
        if marked.empty:
            marked = ev[names.str.startswith("ProfilerStep#")]
        for name, ts, dur in zip(marked["name"].astype(str), marked["ts_ns"], marked["dur_ns"]):
            phase = name[len(markers.PHASE) :] if name.startswith(markers.PHASE) else "step"
            rows.append({"rank": trace.rank, "phase": phase, "start_us": ts / 1e3, "dur_us": (dur or 0) / 1e3})
    return pd.DataFrame(rows, columns=["rank", "phase", "start_us", "dur_us"])


def _memory_series(run: Any, max_points: int = 1500) -> pd.DataFrame:
    """Allocated bytes over the step per rank, from [memory] events' Total Allocated (at most
    ``max_points`` per rank: the page needs the shape, not every event)."""
    frames = []
    for trace in run:
        ev = trace.events
        mem = ev[(ev["name"].astype(str) == "[memory]") & ev["mem_total_allocated"].notna()]
        if mem.empty:
            continue
        mem = mem.sort_values("ts_ns", kind="stable")
        step = max(len(mem) // max_points, 1)
        part = mem.iloc[::step]
        frames.append(pd.DataFrame({
            "rank": trace.rank, "ts_us": part["ts_ns"].astype("int64") / 1e3,
            "allocated_bytes": part["mem_total_allocated"].astype("int64"),
        }))  # fmt: skip
    return (
        pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["rank", "ts_us", "allocated_bytes"])
    )
