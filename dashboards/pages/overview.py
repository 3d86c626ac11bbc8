"""Overview: every run with its verdicts, ranks, step time and wire bytes against the model."""

from __future__ import annotations

from typing import Any

import pandas as pd
from dash import html

from dashboards.pages.common import error_box, grid
from dashboards.store import RunStore
from sptrace.units import human_bytes


def summary(store: RunStore) -> pd.DataFrame:
    rows = []
    for i, path in enumerate(store.paths):
        a = store.get(i)
        if "error" in a:
            rows.append({"run": str(path), "error": a["error"]})
            continue
        run, cfg = a["run"], a["config"]
        row: dict[str, Any] = {"run": str(path), "ranks": f"{len(run)} / {run.world_size}", "backend": run.backend}
        if cfg is not None:
            row["scheme"] = cfg.scheme + (" ZeRO-3" if cfg.zero3 else "")
            row["S"] = cfg.seq
        times = a["time_ms"]
        if times:
            row["step ms (max rank)"] = round(max(t["step"] for t in times.values()), 1)
            row["comm ms (mean)"] = round(sum(t["comm"] for t in times.values()) / len(times), 1)
            row["compute ms (mean)"] = round(sum(t["compute"] for t in times.values()) / len(times), 1)
        frame = a["collectives"]
        ranks = max(frame["rank"].nunique(), 1) if not frame.empty else 1
        row["collectives / rank"] = round(len(frame) / ranks, 1)
        row["wire / rank"] = human_bytes(float(frame["wire_bytes"].fillna(0).sum()) / ranks)
        if "comm" in a:
            row["model wire / rank"] = human_bytes(a["comm"].ranks["expected_wire_bytes"].iloc[0])
            row["collectives"] = "MATCH" if a["comm"].ok else f"MISMATCH ({len(a['comm'].findings)})"
        if "sharding" in a:
            row["sharding"] = "PASS" if a["sharding"].ok else f"FAIL ({len(a['sharding'].findings)})"
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
