"""``sptrace sweep``: profile every scheme x sequence length with the reference models, then
tabulate step time, peak memory and communication per run and fit the first article's
regression, time_ms = c0 + c1 * peak_GiB + c2 * comm_GiB + c3 * S_K + c4 * S_K^2 (S_K = S / 1024)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sptrace.fileio import write_atomic
from sptrace.reference_models.config import StepConfig

TABLE = "comparison.csv"
FIT = "regression.json"
TERMS = ("intercept", "peak_GiB", "comm_GiB", "S_K", "S_K^2")
UNDERDETERMINED = f"fewer runs than the {len(TERMS)} coefficients; the fit is not determined"
"""What the CLI, the Compare page and the sweep figure say of a fit over too few runs."""


def run_name(scheme: str, seq: int) -> str:
    return f"{scheme}-S{seq}"


def load_sweep(root: Path) -> tuple[pd.DataFrame, dict[str, Any]] | None:
    """A sweep folder's table and fit, as ``summarize`` wrote them; None elsewhere."""
    if not (root / TABLE).is_file():
        return None
    fit = json.loads((root / FIT).read_text()) if (root / FIT).is_file() else {}
    return pd.read_csv(root / TABLE), fit


def sweep_runs(root: Path) -> list[Path]:
    """The run folders of a sweep directory (those with a run.json), in name order."""
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "run.json").is_file())


def measure_run(path: Path) -> dict[str, Any]:
    """One row of the comparison, from the run's analysis (sptrace.analysis): its scheme and S,
    its slowest rank's step time, communication (transfer) time and exposed communication, the
    largest peak of allocated memory over ranks, retained bytes per layer (the sharding check's
    mean), and wire bytes per rank (measured and modelled)."""
    from sptrace.analysis import analyse_run

    a = analyse_run(path)
    peak = max(a.peak_allocated.values(), default=0)
    t = a.time_summary()
    retained = a.retained_per_layer()
    return {
        "run": path.name, "scheme": a.model.label, "seq": a.model.seq,
        "step_ms": t["step_ms"] or 0.0, "comm_ms": t["comm_ms"] or 0.0, "exposed_ms": t["exposed_ms"],
        "peak_GiB": peak / 2**30, "retained_KiB_per_layer": None if retained is None else retained / 2**10,
        "comm_GiB": a.wire_bytes_per_rank() / 2**30,
        "model_comm_GiB": a.estimate.wire_per_step() / 2**30 if a.estimate is not None else None,
    }  # fmt: skip


def fit_regression(table: pd.DataFrame) -> dict[str, Any]:
    """Least squares of the article's form over the runs; R^2 and mean absolute error too."""
    s_k = table["seq"].to_numpy(dtype=float) / 1024
    x = np.column_stack([np.ones(len(table)), table["peak_GiB"], table["comm_GiB"], s_k, s_k**2])
    y = table["step_ms"].to_numpy(dtype=float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    pred = x @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return {
        "form": "time_ms = c0 + c1*peak_GiB + c2*comm_GiB + c3*S_K + c4*S_K^2, S_K = S/1024",
        "coefficients": dict(zip(TERMS, (float(c) for c in coef))),
        "r2": 1 - ss_res / ss_tot if ss_tot > 0 else None,
        "mae_ms": float(np.mean(np.abs(y - pred))),
        "runs": len(table),
        "underdetermined": len(table) < len(TERMS),
        "article": {"intercept": 5.40, "peak_GiB": 2.80, "comm_GiB": 1.49, "S_K": 4.94, "S_K^2": 0.14157, "r2": 0.9998},
    }  # fmt: skip


def summarize(root: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    table = pd.DataFrame([measure_run(p) for p in sweep_runs(root)])
    if len(table):
        table = table.sort_values(["scheme", "seq"], kind="stable").reset_index(drop=True)
    fit = fit_regression(table) if len(table) else {}
    write_atomic(root / TABLE, table.to_csv(index=False).encode())
    write_atomic(root / FIT, (json.dumps(fit, indent=2) + "\n").encode())
    return table, fit


def sweep_config(base: StepConfig, scheme: str, seq: int) -> StepConfig:
    """The run of ``scheme`` (``-zero3`` for FSDP2) at length ``seq``: ``base`` carries USP's
    Ulysses degree, which every other scheme records as 1, as ``sptrace profile`` does."""
    name = scheme.removesuffix("-zero3")
    degree = base.ulysses_degree if name == "usp" else 1
    return base.replace(scheme=name, zero3=scheme.endswith("-zero3"), seq=seq, ulysses_degree=degree)


def run_sweep(
    base: StepConfig, schemes: list[str], seqs: list[int], out: Path, *, warmup: int, device: str, force: bool, log: Any
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Profile each combination (skipping runs already complete unless ``force``) in one launch,
    then summarize."""
    from sptrace.launch import RunRequest, holds_run, profile_references

    combos = [sweep_config(base, s, n) for s in schemes for n in seqs]
    out.mkdir(parents=True, exist_ok=True)
    todo = []
    for cfg in combos:
        target = out / run_name(cfg.scheme + ("-zero3" if cfg.zero3 else ""), cfg.seq)
        if force or not (target.is_dir() and holds_run(target) and (target / "run.json").is_file()):
            todo.append(RunRequest(cfg, target))
        else:
            log(f"{target.name}: already profiled")
    if todo:
        log(f"sweep: profiling {len(todo)} of {len(combos)} runs in one launch")
        for run in profile_references(todo, warmup=warmup, device=device, force=True, log=None):
            log(f"{run.out_dir.name}: done")
    return summarize(out)
