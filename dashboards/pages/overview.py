"""Overview: every run with its verdicts, ranks, step time and wire bytes against the model."""

from __future__ import annotations

from typing import Any

import pandas as pd
from dash import html
from sptrace.dashboards.pages.common import error_box, grid
from sptrace.dashboards.store import RunStore

from sptrace.errors import SptraceError
from sptrace.units import human_bytes


def summary(store: RunStore) -> pd.DataFrame:
    rows = []
    for i, path in enumerate(store.paths):
        a = store.get(i)
        if isinstance(a, SptraceError):
            rows.append({"run": str(path), "error": str(a)})
            continue
        run, model = a.run, a.model
        row: dict[str, Any] = {"run": str(path), "ranks": f"{len(run)} / {run.world_size}", "backend": run.backend}
        row["scheme"] = model.label
        row["S"] = model.seq
        times = a.time_summary()
        if times["step_ms"] is not None:
            row["step ms (max rank)"] = round(times["step_ms"], 1)
        if times["comm_ms"] is not None:
            row["comm ms (transfer, mean)"] = round(times["comm_ms"], 1)
        if times["comm_share"] is not None:
            row["comm %"] = round(100 * times["comm_share"], 1)
        row["exposed comm ms"] = "n/a" if times["exposed_ms"] is None else round(times["exposed_ms"], 1)
        frame = a.collectives
        ranks = max(frame["rank"].nunique(), 1) if not frame.empty else 1
        row["collectives / rank"] = round(len(frame) / ranks, 1)
        row["wire / rank"] = human_bytes(float(frame["wire_bytes"].dropna().sum()) / ranks)
        if a.comm is not None:
            row["model wire / rank"] = human_bytes(a.comm.ranks["expected_wire_bytes"].iloc[0])
            row["collectives"] = a.comm.verdict.label
        else:
            row["collectives"] = "not checked"
        row["sharding"] = a.sharding.verdict.label if a.sharding is not None else "not checked"
        rows.append(row)
    return pd.DataFrame(rows)


def layout(store: RunStore) -> Any:
    table = summary(store)
    errors = [
        error_box(f"{r['run']}: {r['error']}")
        for r in table.to_dict(orient="records")
        if isinstance(r.get("error"), str)
    ]
    return html.Div([html.H2("Runs"), *errors, grid(table, "overview-grid")])
