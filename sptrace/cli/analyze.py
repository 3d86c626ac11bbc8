"""``sptrace analyze``: observed collectives against the scheme's cost model. Exit 0 MATCH,
1 MISMATCH, 2 CANNOT DECIDE (sizes the trace does not record).

A run that declares no model of the job (no scheme, or not all of its sizes) still gets the part
that needs none: the ranks compared with each other (matching, skew, stragglers, bandwidth, and
collectives that disagree across the ranks of a group). Exit 0 CONSISTENT, 1 INCONSISTENT, 2 when
the trace holds no collective; the output says why the cost model was skipped."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from sptrace.cli.common import (
    add_load_flags,
    add_shape_flags,
    analyse,
    analysis_imports,
    by_rank_set,
    fixed_width,
    missing,
    registered_json,
    registered_text,
    registered_verdicts,
    spread,
)
from sptrace.cli.diff import add_baseline_flag, run_baseline
from sptrace.vocab.errors import UsageError
from sptrace.vocab.units import count, human_bytes, rank_ranges, significant

if TYPE_CHECKING:  # the analysis (pandas) is imported when a command runs, not to parse flags
    from sptrace.analysis import RunAnalysis
    from sptrace.reduce.balance import Balance
    from sptrace.reduce.critical import CriticalPath


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="observed collectives versus the scheme's cost model (exit 1 on mismatch)")
    p.add_argument("path", help="a run directory or one trace file")
    add_shape_flags(p)
    p.add_argument("--k", type=int, default=2, help="ZeRO-3 parameter gathers per step (default 2)")
    p.add_argument(
        "--grad-dtype", choices=("float32", "bfloat16", "float16"),
        help="the element type of the gradient all-reduces (default: the trace's, else unknown)",
    )  # fmt: skip
    g = p.add_argument_group("what the profiled window covers (the model is scoped to it)")
    g.add_argument("--attention-only", action="store_true",
                   help="the attention block alone: no MLP, no norms (the first article's example)")  # fmt: skip
    g.add_argument("--no-grad-sync", action="store_true",
                   help="the window ends before the step-level gradient all-reduces (forward and backward "
                   "only)")  # fmt: skip
    p.add_argument("--format", choices=("text", "json"), default="text", help="text, or JSON with every finding")
    p.add_argument("--max-findings", type=int, default=30, help="findings shown in text (default 30)")
    add_baseline_flag(p)
    add_load_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.k not in (1, 2):
        raise UsageError("--k must be 1 or 2")
    if args.baseline:
        return run_baseline(args, args.format)
    with analysis_imports():
        from sptrace.checks.registry import needed_parts, worst

    parts = ("collectives", "path", *sorted(needed_parts() - {"collectives", "path"}))
    analysis = analyse(args, k=args.k, parts=parts, grad_dtype=args.grad_dtype,
                       attention_only=args.attention_only, grad_sync=not args.no_grad_sync)  # fmt: skip
    report = analysis.comm
    if report is None:  # no model of the job: what the ranks say of each other, and why no more
        cross = analysis.crossrank
        assert cross is not None
        if args.format == "json":
            out = {**cross.to_dict(), "model": analysis.model.to_dict(),
                   "timing": [t.to_dict() for t in analysis.timing]}  # fmt: skip
            if analysis.matching is not None:
                from sptrace.jsonable import records

                matched = analysis.matching.matched.drop(columns=["ranks"])
                out["matched_collectives"] = records(matched)
                out["clock_offsets_us"] = analysis.matching.offsets_us
            if analysis.p2p is not None:
                out["point_to_point"] = analysis.p2p.to_dict()
            out["critical_path"] = analysis.critical_path.to_dict() if analysis.critical_path else None
            out["balance"] = analysis.balance.to_dict() if analysis.balance else None
            print(json.dumps(out | registered_json(analysis), indent=1, default=str))
        else:
            print(render_cross_rank(analysis, args.max_findings) + registered_text(analysis))
        return worst([cross.verdict, *registered_verdicts(analysis)])
    if args.format == "json":
        out = {**report.to_dict(), "model": analysis.model.to_dict(), "timing": [t.to_dict() for t in analysis.timing]}
        if analysis.p2p is not None:
            out["point_to_point"] = analysis.p2p.to_dict()
        out["critical_path"] = analysis.critical_path.to_dict() if analysis.critical_path else None
        out["balance"] = analysis.balance.to_dict() if analysis.balance else None
        print(json.dumps(out | registered_json(analysis), indent=1, default=str))
        return worst([report.verdict, *registered_verdicts(analysis)])
    print(render_text(analysis, args.max_findings) + registered_text(analysis))
    return worst([report.verdict, *registered_verdicts(analysis)])


def render_text(analysis: RunAnalysis, max_findings: int = 30) -> str:
    report, est, m = analysis.comm, analysis.estimate, analysis.model
    assert report is not None and est is not None
    run = analysis.run
    lines = [f"{est.scheme}: {m.describe()}; {len(run)} of {count(run.world_size, 'rank')}"]
    cells = {
        int(r.rank): (str(r.observed), str(r.expected), human_bytes(r.observed_wire_bytes),
                      human_bytes(r.expected_wire_bytes), str(r.missing), str(r.extra))
        for r in report.ranks.itertuples()
    }  # fmt: skip
    header = ["ranks", "collectives", "expected", "wire/step", "model", "missing", "extra"]
    lines += ["", *_rank_table(analysis, header, cells)]
    if not report.layers.empty:
        off = report.layers[report.layers["observed"] != report.layers["expected"]]
        if not off.empty:
            lines.append("\nlayers whose counts differ from the model (rank, layer, phase: observed / expected):")
            for r in off.head(40).itertuples():
                lines.append(f"  rank {r.rank}, layer {r.layer}, {r.phase}: {r.observed} / {r.expected}")
    lines += render_point_to_point(analysis)
    lines += render_critical_path(analysis.critical_path)
    lines += render_balance(analysis.balance)
    lines += _findings_and_notes(analysis, report.findings, report.notes, max_findings)
    lines.append("\n" + report.verdict.line())
    return "\n".join(lines)


def render_point_to_point(analysis: RunAnalysis, max_rows: int = 24) -> list[str]:
    """The ring steps: hops, bytes, transfer time, bandwidth, skew and overlap per (layer, phase, step)."""
    import pandas as pd

    p2p = analysis.p2p
    if p2p is None or p2p.pairs.empty:
        return []
    lines = [
        f"\npoint-to-point: {len(p2p.pairs)} sends paired with their receives, {len(p2p.unpaired)} unpaired",
        f"{'layer':>6} {'phase':<9}{'step':>5}{'hops':>6}{'bytes':>12}{'xfer ms max':>13}{'GB/s':>8}{'skew ms':>9}"
        f"{'hidden':>8}",
    ]
    for r in p2p.steps.head(max_rows).itertuples():
        layer = "-" if r.layer is None or r.layer is pd.NA else str(r.layer)
        hidden = "" if pd.isna(r.overlap) else f"{100 * r.overlap:.0f}%"
        bw = "" if pd.isna(r.algbw_gbps_mean) else f"{r.algbw_gbps_mean:.3f}"
        lines.append(
            f"{layer:>6} {r.phase!s:<9}{r.step:>5}{r.hops:>6}{human_bytes(float(r.bytes or 0)):>12}"
            f"{r.transfer_us_max / 1e3:>13.2f}{bw:>8}{r.skew_us_max / 1e3:>9.2f}{hidden:>8}"
        )
    if len(p2p.steps) > max_rows:
        lines.append(f"  ... and {len(p2p.steps) - max_rows} more steps (--format json lists all)")
    lines.append("  (hidden: the share of the step's transfer time the rank spent computing)")
    return lines


def render_critical_path(path: CriticalPath | None, max_rows: int = 8, title: str = "critical path") -> list[str]:
    """A critical path across ranks (measured, or a what-if's): its culprit, its time by kind and
    by module."""
    if path is None:
        return []
    step = path.step_us
    ranks = sorted(int(r) for r in path.segments["rank"].unique())
    lines = [f"\n{title}: {significant(step / 1e3)} ms through {count(len(ranks), 'rank')} "
             f"({rank_ranges(ranks)}): "
             f"{path.kinds_text()}", "  " + path.headline(), "  by module (its time on the path):"]  # fmt: skip
    for module, phase, kind, ms, share in path.module_table(max_rows).itertuples(index=False):
        where = " ".join(x for x in (module, phase, kind) if x)
        lines.append(f"    {where:<48} {ms:9.3f} ms {share:5.0%}")
    if path.steps:
        lines.append(f"  each profiled step's path (the one above is {path.step}'s, the slowest):")
        for p in path.steps:
            who = f"{p.culprit.where}, {p.culprit.dur_us / 1e3:.3f} ms" if p.culprit else "no compute on the path"
            lines.append(f"    {p.step:<20} {p.step_us / 1e3:9.3f} ms  {who}")
    lines.append("  (--format json lists every segment)")
    return lines


def render_balance(balance: Balance | None, max_rows: int = 12) -> list[str]:
    """The ranks' compute per layer and phase against the model's work, and the causes found."""
    if balance is None or balance.rows.empty:
        return []
    by = "FLOPs from the recorded shapes" if balance.work_recorded else "time (no shapes recorded)"
    lines = [f"\ncompute balance per layer and phase (attention work: {by}):"]
    rows = []
    for r in balance.rows.head(max_rows).itertuples():
        rows.append([str(r.layer), str(r.phase), f"{r.attention_ratio:.2f}x", str(r.attention_rank),
                     _ratio(r.predicted_ratio), _ratio(r.attention_time_ratio), f"{r.time_ratio:.2f}x",
                     str(r.slowest_rank)])  # fmt: skip
    header = ["layer", "phase", "attention work max/mean", "rank", "model", "its time", "time max/median", "rank"]
    lines += ["  " + line for line in fixed_width(header, rows, left={1})]
    if len(balance.rows) > max_rows:
        lines.append(f"  ... and {len(balance.rows) - max_rows} more (--format json lists all)")
    lines.append("  " + balance.line())
    return lines


def _ratio(value: float | None) -> str:
    return "" if missing(value) else f"{value:.2f}x"


def _rank_table(analysis: RunAnalysis, header: list[str], cells: dict[int, tuple[str, ...]]) -> list[str]:
    """The per-rank table: ranks whose counts and bytes are equal share one row (their rank set),
    with the range of their step, transfer and exposed times."""
    timing = {t.rank: t for t in analysis.timing}
    rows = []
    for ranks, row in by_rank_set(cells):
        mine = [timing[r] for r in ranks if r in timing]
        exposed = spread([t.exposed_ms for t in mine]) or ("n/a" if mine else "")
        times = [spread([t.step_ms for t in mine]), spread([t.comm_ms for t in mine]), exposed]
        rows.append([rank_ranges(ranks), *row, *times])
    lines = fixed_width([*header, "step ms", "comm ms", "exposed ms"], rows, left={0})
    lines.append("  (times: the range over the row's ranks; comm: transfer time, the union of NCCL kernels or gloo "
                 "worker spans; exposed: not overlapped by compute kernels, GPU traces only)")  # fmt: skip
    return lines


def _findings_and_notes(analysis: RunAnalysis, findings: list, notes: list[str], max_findings: int) -> list[str]:
    lines = []
    if findings:
        lines.append(f"\n{count(len(findings), 'finding')}:")
        lines += [f"  {f.severity}: {f.text()}" for f in findings[:max_findings]]
        if len(findings) > max_findings:
            lines.append(f"  ... and {len(findings) - max_findings} more (--format json lists all)")
    lines += [f"note: {note}" for note in notes]
    matching = analysis.matching
    if matching is not None and matching.offsets_us:
        span = max(matching.offsets_us.values()) - min(matching.offsets_us.values())
        lines.append(f"note: clock offsets across ranks span {span / 1e3:.2f} ms (aligned on matched completions)")
    return lines


def render_cross_rank(analysis: RunAnalysis, max_findings: int = 30) -> str:
    """``analyze`` without a model of the job: per rank, what it issued; the findings between
    ranks; and why the cost-model comparison was skipped."""
    cross, run = analysis.crossrank, analysis.run
    assert cross is not None
    lines = [f"{len(run)} of {count(run.world_size, 'rank')}, compared with each other; the cost-model comparison "
             f"was skipped: {cross.skipped}"]  # fmt: skip
    cells = {
        int(r.rank): (str(r.collectives), human_bytes(r.wire_bytes) + ("+?" if r.unknown_wire else ""),
                      str(r.disagree))
        for r in cross.ranks.itertuples()
    }  # fmt: skip
    lines += ["", *_rank_table(analysis, ["ranks", "collectives", "wire/step", "disagree"], cells)]
    if any(r.unknown_wire for r in cross.ranks.itertuples()):
        lines.append("  (wire +?: some collectives' size or group is not in the trace)")
    lines.append("  (disagree: collectives whose kind or size differs from the rest of their group's)")
    lines += render_point_to_point(analysis)
    lines += render_critical_path(analysis.critical_path)
    lines += render_balance(analysis.balance)
    lines += _findings_and_notes(analysis, cross.findings, cross.notes, max_findings)
    lines.append("\n" + cross.verdict.line())
    return "\n".join(lines)
