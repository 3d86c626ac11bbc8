"""A sweep over runs across sequence lengths, computed here once and only drawn by the
dashboard (sptrace.report.compare): what ``sptrace sweep`` measured (sptrace.cli.sweep profiles
the runs with the reference models and analyses them), a table of step time, peak memory and
communication per run, and the first article's regression fitted over it, time_ms = c0 +
c1 * peak_GiB + c2 * comm_GiB + c3 * S_K + c4 * S_K^2 (S_K = S / 1024), with its prediction per run.
(The cost model swept over S at one run's model is sptrace.costmodel.sweep's.)

Nothing here launches or analyses a run: a sweep's rows are read off finished analyses.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np
import pandas as pd

from sptrace.analysis import RunAnalysis
from sptrace.fileio import write_atomic

TABLE = "comparison.csv"
FIT = "regression.json"
TERMS = ("intercept", "peak_GiB", "comm_GiB", "S_K", "S_K^2")
UNDERDETERMINED = f"fewer runs than the {len(TERMS)} coefficients; the fit is not determined"
"""What the CLI, the Compare page and the sweep figure say of a fit over too few runs."""


# ---- sptrace sweep: measured runs and the regression -------------------------------------------


class MeasuredRun(TypedDict):
    """One row of the sweep's table (``measure_run``): a TypedDict, as the table's row as is."""

    run: str
    scheme: str
    seq: int | None
    step_ms: float
    comm_ms: float
    exposed_ms: float | None
    peak_GiB: float
    retained_KiB_per_layer: float | None
    comm_GiB: float
    model_comm_GiB: float | None


class Fit(TypedDict):
    """The regression over a sweep's runs, as ``fit_regression`` computes it and regression.json
    holds it (a TypedDict: written and read back as JSON as is)."""

    form: str
    coefficients: dict[str, float]
    """TERMS -> coefficient"""
    r2: float | None
    mae_ms: float
    runs: int
    underdetermined: bool
    """fewer runs than coefficients"""
    article: dict[str, float]
    """the article's coefficients and R^2, for comparison"""


@dataclass(frozen=True)
class Sweep:
    """A sweep folder: its table (a row per run, as ``summarize`` wrote it), the regression fitted
    over it (None without runs) and the fit's step time per row (None without a fit)."""

    root: Path
    table: pd.DataFrame
    fit: Fit | None
    predicted_ms: pd.Series | None


def run_name(scheme: str, seq: int) -> str:
    return f"{scheme}-S{seq}"


def load_sweep(root: Path) -> Sweep | None:
    """A sweep folder's table and fit, as ``summarize`` wrote them, with the fit's predictions;
    None elsewhere."""
    if not (root / TABLE).is_file():
        return None
    written = json.loads((root / FIT).read_text()) if (root / FIT).is_file() else {}
    fit = Fit(**written) if written else None  # ({} is the fit of a sweep without runs)
    table = pd.read_csv(root / TABLE)
    return Sweep(root, table, fit, predict(table, fit) if fit else None)


def sweep_runs(root: Path) -> list[Path]:
    """The run folders of a sweep directory (those with a run.json), in name order."""
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "run.json").is_file())


def measure_run(a: RunAnalysis) -> MeasuredRun:
    """One row of the comparison, from the run's facts (RunAnalysis.facts, what every view
    shows): its scheme and S, its slowest rank's step time, communication (transfer) time and
    exposed communication, the largest peak of allocated memory over ranks, retained bytes per
    layer (the sharding check's mean), and wire bytes per rank (measured and modelled)."""
    f = a.facts
    return MeasuredRun(
        run=a.name, scheme=a.model.label, seq=a.model.seq,
        step_ms=f.step_ms or 0.0, comm_ms=f.comm_ms or 0.0, exposed_ms=f.exposed_ms,
        peak_GiB=f.peak_allocated / 2**30,
        retained_KiB_per_layer=None if f.retained_per_layer is None else f.retained_per_layer / 2**10,
        comm_GiB=f.wire_bytes / 2**30,
        model_comm_GiB=f.model_wire_bytes / 2**30 if f.model_wire_bytes is not None else None,
    )  # fmt: skip


def fit_regression(table: pd.DataFrame) -> Fit:
    """Least squares of the article's form over the runs; R^2 and mean absolute error too."""
    s_k = table["seq"].to_numpy(dtype=float) / 1024
    x = np.column_stack([np.ones(len(table)), table["peak_GiB"], table["comm_GiB"], s_k, s_k**2])
    y = table["step_ms"].to_numpy(dtype=float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    pred = x @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return Fit(
        form="time_ms = c0 + c1*peak_GiB + c2*comm_GiB + c3*S_K + c4*S_K^2, S_K = S/1024",
        coefficients=dict(zip(TERMS, (float(c) for c in coef))),
        r2=1 - ss_res / ss_tot if ss_tot > 0 else None,
        mae_ms=float(np.mean(np.abs(y - pred))),
        runs=len(table),
        underdetermined=len(table) < len(TERMS),
        article={"intercept": 5.40, "peak_GiB": 2.80, "comm_GiB": 1.49, "S_K": 4.94, "S_K^2": 0.14157, "r2": 0.9998},
    )  # fmt: skip


def predict(table: pd.DataFrame, fit: Fit) -> pd.Series:
    """The fitted step time (ms) of each row of ``table``: the regression at its S, peak and wire GiB."""
    c = fit["coefficients"]
    s_k = table["seq"] / 1024
    return (
        c["intercept"] + c["peak_GiB"] * table["peak_GiB"] + c["comm_GiB"] * table["comm_GiB"] + c["S_K"] * s_k
        + c["S_K^2"] * s_k**2
    )  # fmt: skip


def summarize(root: Path, analyses: Iterable[RunAnalysis]) -> tuple[pd.DataFrame, Fit | None]:
    """The table of the sweep's runs (their analyses, taken one at a time) and the fit over it,
    written into ``root``."""
    table = pd.DataFrame([measure_run(a) for a in analyses])
    if len(table):
        table = table.sort_values(["scheme", "seq"], kind="stable").reset_index(drop=True)
    fit = fit_regression(table) if len(table) else None
    write_atomic(root / TABLE, table.to_csv(index=False).encode())
    write_atomic(root / FIT, (json.dumps(fit or {}, indent=2) + "\n").encode())
    return table, fit
