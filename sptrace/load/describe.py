"""What a loaded run holds, and which of sptrace's analyses that allows (``sptrace info``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

import numpy as np
import pyarrow as pa

from sptrace.load.arrow import codes_of, compute, rows_where, to_numpy, value_counts
from sptrace.load.trace import RankTrace, RunTrace
from sptrace.vocab import markers
from sptrace.vocab.units import rank_ranges


def _records(names: pa.ChunkedArray) -> int:
    """Saved-tensor records: each sptrace.saved event holds one, or a forward's (each record
    starts with the prefix)."""
    counts = value_counts(names)
    return sum(name.count(markers.SAVED) * n for name, n in counts.items() if name.startswith(markers.SAVED))


class RankDescription(TypedDict):
    """One rank's counts, as ``sptrace info`` prints them (a TypedDict: its per-rank JSON as is)."""

    rank: int | None
    file: str
    rank_from: str
    events: int
    categories: dict[str, int]
    span_ms: float | None
    memory_events: int
    python_stacks: int
    ops_with_shapes: int
    gpu_kernels: int
    c10d_ops: int
    collective_args: int
    profiler_steps: int
    sptrace_markers: int
    saved_tensor_records: int


def describe_rank(trace: RankTrace) -> RankDescription:
    """Counts from the table's dictionaries: each distinct name is tested once."""
    t = trace.table
    cats = trace.category_counts()
    span = trace.time_span_ns()
    names = t["name"]
    is_cpu_op = codes_of(t["cat"], ["cpu_op"])

    def named(prefix: str) -> np.ndarray:
        return rows_where(names, lambda name: name.startswith(prefix))

    return RankDescription(
        rank=trace.rank,
        file=str(trace.path),
        rank_from=trace.rank_source,
        events=trace.num_events,
        categories=dict(sorted(cats.items(), key=lambda kv: -kv[1])),
        span_ms=None if span is None else (span[1] - span[0]) / 1e6,
        memory_events=int(codes_of(names, ["[memory]"]).sum()),
        python_stacks=cats.get("python_function", 0),
        ops_with_shapes=int((is_cpu_op & to_numpy(compute("is_valid", t["input_dims"]))).sum()),
        gpu_kernels=cats.get("kernel", 0),
        c10d_ops=int((is_cpu_op & named("c10d::")).sum()),
        collective_args=len(t) - t["coll_name"].null_count,
        profiler_steps=int(named("ProfilerStep#").sum()),
        sptrace_markers=int(named(markers.PREFIX).sum()),
        saved_tensor_records=_records(names),
    )


class GroupDescription(TypedDict):
    """One process group of the run, as its first rank's distributedInfo lists it."""

    name: str | None
    desc: str | None
    size: int | None
    ranks: list[int] | None


class SpanRange(TypedDict):
    """The shortest and longest time span of a rank's events (ms)."""

    min: float
    max: float


class SkippedFile(TypedDict):
    file: str
    why: str


class RunDescription(TypedDict):
    """What ``sptrace info`` reports of a run (a TypedDict: its JSON as is)."""

    path: str | None
    ranks: str
    world_size: int
    missing_ranks: list[int]
    backend: str | None
    process_groups: list[GroupDescription]
    run_info: Mapping[str, object] | None
    """run.json's ``config``."""
    span_ms: SpanRange | None
    per_rank: list[RankDescription]
    analyses: dict[str, str]
    skipped: list[SkippedFile]
    warnings: list[str]


def analyses(ranks: list[RankDescription], n_ranks: int) -> dict[str, str]:
    """Analysis -> 'yes' or why not, from what every rank's trace carries."""

    def all_have(key: str) -> bool:
        return all(r[key] > 0 for r in ranks)

    def why(ok: bool, missing: str) -> str:
        return "yes" if ok else missing

    has_colls = all(r["c10d_ops"] + r["collective_args"] > 0 for r in ranks)
    return {
        "collective detection (sptrace collectives / analyze)": why(
            has_colls, "no collectives found (a single-process trace, or no c10d ops recorded)"
        ),
        "cross-rank matching, skew, stragglers": why(n_ranks > 1, "needs the traces of 2 or more ranks"),
        "retained-activation check (sptrace check)": why(
            all_have("memory_events"), "no [memory] events: profile with profile_memory=True"
        ),
        "exact saved-tensor shapes": why(
            all_have("saved_tensor_records"),
            "no sptrace.saved records: shapes will be inferred from op inputs (sptrace.instrument adds them)",
        ),
        "shape inference from op inputs": why(
            all_have("ops_with_shapes"), "no Input Dims: profile with record_shapes=True"
        ),
        "module attribution from python stacks": why(
            all_have("python_stacks") or all_have("sptrace_markers"), "no python stacks: profile with with_stack=True"
        ),
        "GPU kernel analyses (timeline, overlap, HTA breakdowns)": why(
            all_have("gpu_kernels"), "no GPU kernels (a CPU/gloo trace)"
        ),
    }


def describe_run(run: RunTrace, described: Mapping[int, RankDescription] | None = None) -> RunDescription:
    """``described``: describe_rank's result per rank where the map computed it already."""
    ranks = [described[t.rank] if described and t.rank in described else describe_rank(t) for t in run]
    first = next(iter(run))
    groups = [
        GroupDescription(name=g.get("pg_name"), desc=g.get("pg_desc"), size=g.get("pg_size"), ranks=g.get("ranks"))
        for g in first.process_groups
    ]
    spans = [r["span_ms"] for r in ranks if r["span_ms"] is not None]
    return RunDescription(
        path=str(run.root) if run.root else None,
        ranks=rank_ranges(run.ranks),
        world_size=run.world_size,
        missing_ranks=run.missing_ranks,
        backend=run.backend,
        process_groups=groups,
        run_info=run.run_info.get("config") if run.run_info else None,
        span_ms=SpanRange(min=min(spans), max=max(spans)) if spans else None,
        per_rank=ranks,
        analyses=analyses(ranks, len(ranks)),
        skipped=[SkippedFile(file=str(p), why=why) for p, why in run.skipped],
        warnings=run.warnings,
    )


def render_text(info: RunDescription) -> str:
    lines = [
        f"run:          {info['path'] or '(files)'}",
        f"ranks:        {info['ranks']} of world size {info['world_size']}"
        + (f" (missing: {rank_ranges(info['missing_ranks'])})" if info["missing_ranks"] else ""),
        f"backend:      {info['backend'] or 'unknown (no distributedInfo)'}",
    ]
    if info["run_info"]:
        cfg = info["run_info"]
        keys = ("scheme", "sp_size", "layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn", "dtype", "fault")
        lines.append("run.json:     " + ", ".join(f"{k}={cfg[k]}" for k in keys if cfg.get(k) is not None))
    for g in info["process_groups"]:
        shown = g["ranks"] if g["ranks"] is None or len(g["ranks"]) <= 16 else f"{len(g['ranks'])} ranks"
        lines.append(f"group:        {g['name']} ({g['desc']}), size {g['size']}: {shown}")
    if info["span_ms"]:
        lines.append(f"time span:    {info['span_ms']['min']:.1f} to {info['span_ms']['max']:.1f} ms per rank")
    lines.append("")
    lines.append(
        f"{'rank':>5} {'events':>9} {'cpu ops':>8} {'kernels':>8} {'memory':>8} {'stacks':>8} {'c10d':>6} "
        f"{'span ms':>9}  file"
    )
    for r in info["per_rank"]:
        span = f"{r['span_ms']:.1f}" if r["span_ms"] is not None else "-"
        lines.append(
            f"{r['rank']:>5} {r['events']:>9} {r['categories'].get('cpu_op', 0):>8} {r['gpu_kernels']:>8} "
            f"{r['memory_events']:>8} {r['python_stacks']:>8} {r['c10d_ops']:>6} {span:>9}  {r['file']}"
        )
    lines.append("")
    lines.append("analyses this run allows:")
    for name, verdict in info["analyses"].items():
        lines.append(
            f"  {'yes' if verdict == 'yes' else 'no ':<4} {name}" + ("" if verdict == "yes" else f": {verdict}")
        )
    for s in info["skipped"]:
        lines.append(f"skipped: {s['file']}: {s['why']}")
    for w in info["warnings"]:
        if not w.startswith("skipped "):
            lines.append(f"warning: {w}")
    return "\n".join(lines)
