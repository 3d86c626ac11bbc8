"""``sptrace check``: are the activations kept across forward -> backward sharded? Exit 0 PASS,
1 FAIL (a full-size tensor), 2 CANNOT DECIDE (the trace does not show enough, or flags missing)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from sptrace.cli.common import (
    add_at_flag,
    add_load_flags,
    add_shape_flags,
    analyse,
    analysis_imports,
    by_rank_set,
    emit,
    fixed_width,
    registered,
    registered_json,
    registered_text,
)
from sptrace.cli.diff import add_baseline_flag, run_baseline
from sptrace.vocab.errors import UsageError
from sptrace.vocab.units import count, human_bytes, rank_ranges

if TYPE_CHECKING:  # the analysis (pandas) is imported when a command runs, not to parse flags
    import pandas as pd

    from sptrace.analysis import RunAnalysis
    from sptrace.checks.projection import Projection
    from sptrace.checks.sharding_verdict import ShardingReport


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="activations kept for backward are sharded (exit 1 on a full-size save)")
    p.add_argument("path", help="a run directory or one trace file")
    add_shape_flags(p, scheme=False, names=("batch", "seq", "hidden", "heads", "kv_heads", "ffn"))
    p.add_argument(
        "--allow", action="append", default=[], metavar="MODULE_GLOB", help="modules allowed to keep full tensors"
    )
    p.add_argument("--strict", action="store_true", help="ambiguous and unknown tensors fail too")
    p.add_argument("--format", choices=("text", "json", "junit", "github"), default="text",
                   help="text, JSON (every retained tensor), JUnit XML (a case per module, for CI) or GitHub "
                   "Actions workflow commands (an ::error on the line that made each stray)")  # fmt: skip
    p.add_argument("--output", help="write the report here (atomically) instead of stdout")
    add_at_flag(p)
    add_baseline_flag(p)
    add_load_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time
    from datetime import datetime, timezone

    if args.baseline:
        if args.format == "github":
            raise UsageError("--format github annotates the gate's own FAILs; with --baseline use text, json or junit")
        return run_baseline(args, args.format)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    clock = time.perf_counter()
    # a bad --config, then any of B, S and H declared nowhere, are named before a trace is parsed
    with analysis_imports():
        from sptrace.checks.registry import needed_parts, worst

    parts = ("sharding", *sorted(needed_parts(gate_only=True) - {"sharding"}))  # and what gating checks read
    analysis = analyse(args, allow=tuple(args.allow), strict=args.strict, parts=parts, fail_fast=True)
    report = analysis.sharding
    if report is None:
        raise UsageError(f"{args.path}: {analysis.sharding_unavailable}")
    others = registered(analysis, gate_only=True)
    if args.format == "json":
        projected = {"projection": analysis.projection.to_dict()} if analysis.projection is not None else {}
        out = report.to_dict() | projected | registered_json(analysis, gate_only=True)
        text = json.dumps(out, indent=1, default=str) + "\n"
    elif args.format == "github":
        from sptrace.report.github import render_github

        text = render_github(report, others)
    elif args.format == "junit":
        from sptrace.report.junit import render_junit

        text = render_junit(report, run=str(args.path), seconds=time.perf_counter() - clock, started=started,
                            others=others)  # fmt: skip
    else:
        text = render_text(analysis, report) + registered_text(analysis, gate_only=True)
    emit(args, text, report.verdict.line())
    return worst([report.verdict, *(r.verdict for r in others)])


def most_kept(kept: pd.DataFrame) -> tuple[float, str]:
    """The most bytes one boundary kept of ``kept`` (one rank's rows), and that boundary's label:
    what a rank holds at once, never a sum over boundaries."""
    return _most(kept["boundary"].tolist(), kept["storage_bytes"].tolist())


def _most(boundaries: list[object], sizes: list[object]) -> tuple[float, str]:
    """most_kept over one rank's rows as lists (a rank's few hundred rows: a Python pass costs a
    tenth of a grouping): bytes summed per boundary label (a missing one ''), missing sizes
    skipped; of equal sums, the boundary seen first."""
    import pandas as pd

    per: dict[object, object] = {}
    for label, size in zip(boundaries, sizes):
        label = "" if pd.isna(label) else label
        per[label] = per.get(label, 0) + (0 if pd.isna(size) else size)
    if not per:
        return 0.0, ""
    where = max(per, key=per.__getitem__)
    return float(per[where]), str(where)


def _rank_cells(
    saved: pd.DataFrame, ranks: list[int], classes: tuple[str, ...], several: bool
) -> dict[int, tuple[str, ...]]:
    """Each rank's row of the text table: alive, the kept tensors by class, backend or parameter,
    no holder, the most one boundary kept (and where, with ``several`` boundaries); one pass over
    the rows, not a dozen pandas operations per rank."""
    from collections import Counter

    rows: dict[object, list[tuple[object, ...]]] = {}
    for rank, *rest in zip(*(saved[c].tolist() for c in ("rank", "holder", "class", "boundary", "storage_bytes"))):
        rows.setdefault(rank, []).append(tuple(rest))
    cells = {}
    for rank in ranks:
        mine = rows.get(rank, [])
        kept = [r for r in mine if isinstance(r[0], str) and r[0] in ("autograd", "model")]  # what the step keeps
        tally, held = Counter(r[1] for r in kept), Counter(r[0] for r in mine)
        most, where = _most([r[2] for r in kept], [r[3] for r in kept])
        cells[rank] = (str(len(mine)), *(str(tally.get(c, 0)) for c in classes),
                       str(held.get("backend", 0) + held.get("parameter", 0)), str(held.get("undecided", 0)),
                       human_bytes(most), *((where,) if several else ()))  # fmt: skip
    return cells


def render_text(analysis: RunAnalysis, report: ShardingReport) -> str:
    m = report.model
    sources = sorted(set(m.provenance.values()))
    lines = [
        f"{analysis.path}: {m.describe()} ({', '.join(sources) or 'flags'}); "
        f"{len(analysis.run)} of {count(analysis.run.world_size, 'rank')}",
        "",
    ]
    classes = ("seq-sharded", "head-sharded", "full", "ambiguous", "other", "unknown")
    several = report.saved["boundary"].notna().any()  # several boundaries: say where each rank kept the most
    # the ranks that have a trace; missing ones are a verdict
    cells = _rank_cells(report.saved, sorted(analysis.run.ranks), classes, several)
    rows = [[rank_ranges(ranks), *row] for ranks, row in by_rank_set(cells)]
    if len(report.saved):  # a table of zeros says nothing the verdict does not
        head = ["ranks", "alive", *classes, "backend", "no holder", "kept", *(("at",) if several else ())]
        lines += fixed_width(head, rows, left={0, len(head) - 1} if several else {0})
    if not report.layers.empty:
        layer = report.layers.groupby("layer").agg(
            most=("measured_bytes", "max"), least=("measured_bytes", "min"), expected=("expected_bytes", "first"),
            rank=("measured_bytes", lambda v: int(report.layers.loc[v.idxmax(), "rank"])),
        )  # fmt: skip
        lines.append("")
        for i, row in layer.iterrows():
            expected = row.expected
            exp = "" if expected is None or expected != expected else f" (Korthikanti: {human_bytes(expected)})"
            spread = f" (rank {int(row['rank'])}; the least, {human_bytes(row.least)})" if row.least != row.most else ""
            lines.append(f"layer {i}: at most {human_bytes(row.most)} kept per rank{spread}{exp}")
    if analysis.projection is not None:
        lines += ["", *projection_lines(analysis.projection)]
    lines.append("")
    for f in report.findings:
        lines.append(f"FAIL {f.text()}")
    for n in report.notes:
        lines.append(f"note: {n}")
    verdict = report.verdict
    lines.append(verdict.line())
    for reason in verdict.reasons[1:] if verdict.status == "undecided" else ():
        lines.append(f"  also: {reason}")
    return "\n".join(lines) + "\n"


def projection_lines(p: Projection) -> list[str]:
    """The kept bytes at the production shape (sptrace.checks.projection), ranks that agree on one
    line, then each FAIL's extra bytes at production."""
    korthikanti = (f"Korthikanti: {human_bytes(p.korthikanti_per_layer)} per layer" if p.korthikanti_per_layer
                   else f"Korthikanti: unknown, {p.korthikanti_why}")  # fmt: skip
    cells: dict[int, tuple[str, ...]] = {}
    for r in p.ranks:
        total = r.total_bytes
        kept = (f"{human_bytes(total)} per boundary (measured {human_bytes(r.measured_bytes)})" if total is not None
                else f"? per boundary (measured {human_bytes(r.measured_bytes)}; the production layers are unknown: "
                "--at layers=N)")  # fmt: skip
        layer = f", {human_bytes(r.per_layer_bytes)} per layer ({korthikanti})" if r.per_layer_bytes is not None else ""
        missed = r.unprojected
        whys = list(dict.fromkeys(f"{t.place()}: {t.why}" for t in missed))
        more = f"; {len(whys) - 1} more in --format json" if len(whys) > 1 else ""
        left = (f"; {count(len(missed), 'tensor')} unprojected, {human_bytes(r.unprojected_bytes)} carried as "
                f"measured ({whys[0]}{more})" if missed else "")  # fmt: skip
        cells[r.rank] = (f"keep {kept}{layer}{left}",)
    lines = [f"at {p.headline()}:"]
    for ranks, (text,) in by_rank_set(cells):
        lines.append(f"  {'rank' if len(ranks) == 1 else 'ranks'} {rank_ranges(ranks)} {text}")
    if not p.ranks:
        lines.append(f"  nothing is kept at any boundary ({korthikanti})")
    for f in p.fails:
        where = f"{f.module or '<unknown module>'} ({'rank' if len(f.ranks) == 1 else 'ranks'} {rank_ranges(f.ranks)})"
        measured = f"measured {human_bytes(f.measured_extra_bytes)}"
        if f.projected_extra_bytes is not None:
            lines.append(f"  FAIL {where}: {human_bytes(f.projected_extra_bytes)} more than a shard at production "
                         f"size ({measured})")  # fmt: skip
        else:
            lines.append(f"  FAIL {where}: not projected, {f.why} ({measured} more than a shard)")
    lines += [f"  note: {n}" for n in p.notes]
    return lines
