"""``sptrace collectives``: every collective of every rank, one record each."""

from __future__ import annotations

import argparse
import sys

from sptrace.cli.common import add_load_flags, by_rank_set, fixed_width, map_quietly, missing, size_text, spread
from sptrace.vocab.units import count, human_bytes, rank_ranges


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collectives", help="every collective of every rank: kind, group, bytes, phase, layer")
    p.add_argument("path", help="a run directory or one trace file")
    p.add_argument(
        "--format",
        choices=("table", "json", "csv"),
        default="table",
        help="a table per rank, or JSON or CSV with one row per collective",
    )
    add_load_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sptrace.detect import COLUMNS
    from sptrace.jsonable import write_records
    from sptrace.reduce.peers import merge_collectives

    _, ranks = map_quietly(args, ("collectives",))
    timing = list(ranks.ranked_timing())
    frame = merge_collectives([ranks.frame("collectives")])
    if args.format in ("csv", "json"):
        out = export_frame(frame[COLUMNS], timing)
        if args.format == "csv":
            out.to_csv(sys.stdout, index=False)
            return 0
        write_records(out, sys.stdout)  # (a chunk of rows at a time: a large run's are hundreds of MB as dicts)
        return 0
    if frame.empty:
        print("no collectives in this run")
        return 0
    print(render_table(frame, timing))
    ranks = frame["rank"].nunique()
    print(f"\n{count(len(frame), 'collective')} on {count(ranks, 'rank')}; per rank and kind:")
    counts = frame.groupby(["kind"]).agg(n=("rank", "size"), wire=("wire_bytes", "sum"), unknown=("wire_bytes", _nulls))
    for kind, row in counts.iterrows():
        # an unknown is never printed as a number: "?" when no size is known, "+?" when some are
        known = row.n - row.unknown
        wire = "?" if not known else human_bytes(row.wire / ranks) + ("+?" if row.unknown else "")
        unknown = f"  ({row.unknown / ranks:.1f} per rank of unknown size or group)" if row.unknown else ""
        print(f"  {kind:<15}{row.n / ranks:>7.1f} per rank  {wire:>14} wire per rank{unknown}")
    from sptrace.detect.timing import step_sources

    sources = step_sources(timing) or "nothing"
    print(f"\nstep (measured by {sources}), communication (transfer time) and exposed communication, ms; ranks "
          "alike in what they issued share a row, with the range of their times")  # fmt: skip
    cells = {t.rank: (str(t.issue_only),) for t in timing}
    rows = []
    for ranks, (issue_only,) in by_rank_set(cells):
        mine = [t for t in timing if t.rank in ranks]
        exposed = spread([t.exposed_ms for t in mine], 2) or "n/a"
        rows.append([rank_ranges(ranks), spread([t.step_ms for t in mine], 2) or "?",
                     spread([t.comm_ms for t in mine], 2), exposed, issue_only])  # fmt: skip
    for line in fixed_width(["ranks", "step ms", "comm ms", "exposed ms", "no transfer record"], rows, left={0}):
        print("  " + line)
    if any(t.exposed_ms is None for t in timing):
        print("  (exposed n/a: no GPU streams; no transfer record: collectives timed by their CPU span)")
    return 0


# counts that are whole numbers: written as integers (pandas makes a column float around its nulls)
_INTEGERS = ("rank", "group_size", "peer", "in_elems", "out_elems", "in_bytes", "out_bytes", "wire_bytes", "step",
             "layer", "seq", "tid")  # fmt: skip


def export_frame(frame, timing=()):
    """The collectives as CSV and JSON write them: every column of the table (absolute times in
    us, on each rank's clock), whole counts as integers (null where unknown; a fractional value
    keeps the column float), and ``start_ms_from_step``: ms from the rank's step start."""
    import pandas as pd

    from sptrace.detect.timing import step_starts_us

    out = frame.copy()
    for col in _INTEGERS:
        values = pd.to_numeric(out[col], errors="coerce")
        known = values.dropna()
        whole = (known == known.round()).all() and (known.abs() < 2**62).all()
        if len(known) == len(out[col].dropna()) and whole:
            out[col] = values.round().astype("Int64")
    steps = out["rank"].map(step_starts_us(timing)).astype(float)
    out["start_ms_from_step"] = ((out["start_us"].astype(float) - steps) / 1e3).round(4)
    return out


def _nulls(values) -> int:
    return int(values.isna().sum())


def render_table(frame, timing=()) -> str:
    """One line per collective; times in ms from the rank's step start (``timing``: the ranks'
    RankTiming, whose step_start_us is that zero), else from the rank's first collective."""
    from sptrace.detect.timing import step_sources, step_starts_us

    zero = step_starts_us(timing)
    first = frame.groupby("rank")["start_us"].min().to_dict()
    header = ["rank", "kind", "group", "P", "peer", "dtype", "in", "out", "wire", "start ms", "xfer ms", "phase",
              "layer", "module"]  # fmt: skip
    rows = []
    for r in frame.itertuples():
        t0 = zero.get(r.rank, first[r.rank])
        rows.append([
            str(r.rank), r.kind, "?" if missing(r.group) else str(r.group),
            "?" if missing(r.group_size) else str(int(r.group_size)),
            "" if missing(r.peer) else str(int(r.peer)), r.dtype or "?",
            size_text(r.in_bytes), size_text(r.out_bytes), size_text(r.wire_bytes),
            f"{(r.start_us - t0) / 1e3:.2f}", "?" if missing(r.transfer_dur_us) else f"{r.transfer_dur_us / 1e3:.2f}",
            r.phase, "" if missing(r.layer) else str(int(r.layer)), r.module or "",
        ])  # fmt: skip
    sources = step_sources(timing)
    origin = f"the rank's step start ({sources})" if sources else "the rank's first collective"
    lines = fixed_width(header, rows, left={1, 2, 5, 11, 13})
    return "\n".join([f"start ms: from {origin}; xfer ms: transfer time", *lines])
