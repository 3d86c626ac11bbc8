"""``sptrace export RUN -o merged.json.gz``: every rank of a run in one Chrome / Perfetto trace, on
clocks aligned across ranks, with sptrace's own tracks (sptrace.export). Exit 0 when written, 2 on
bad input (one line naming it)."""

from __future__ import annotations

import argparse

from sptrace.cli.common import add_load_flags, add_shape_flags, analyse, log


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="one Perfetto / chrome://tracing trace of the ranks on aligned clocks")
    p.add_argument("path", help="a run directory or one trace file")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="the trace to write (gzip when it ends in .gz: merged.json.gz)")  # fmt: skip
    which = p.add_mutually_exclusive_group()
    which.add_argument("--ranks", metavar="LIST", help="the ranks to export, such as 0-7,63 (default: every rank, "
                       "at most 64: past that the straggler's process group)")  # fmt: skip
    which.add_argument("--group", metavar="NAME", help="the ranks of this process group (as `sptrace collectives` "
                       "names it)")  # fmt: skip
    p.add_argument("--window", metavar="START:END", help="keep what overlaps this range, in ms from the step start "
                   "(as the dashboard's timeline counts)")  # fmt: skip
    p.add_argument("--no-events", action="store_true", help="sptrace's tracks only (phases, layers, modules, "
                   "collectives, memory, critical path)")  # fmt: skip
    add_shape_flags(p)
    add_load_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sptrace.export import ExportOptions, check_output, choose_ranks, export_run, parse_window
    from sptrace.vocab.units import parse_ranks

    out = check_output(args.output)  # bad flags are said before any trace is read
    window = parse_window(args.window) if args.window is not None else None
    ranks = parse_ranks(args.ranks) if args.ranks is not None else None
    analysis = analyse(args, parts=("collectives", "path"))
    chosen, note = choose_ranks(analysis, ranks, args.group)
    if note:
        log(note)
    options = ExportOptions(ranks=chosen, window_ms=window, events=not args.no_events)
    summary = export_run(analysis, out, options)
    log(summary.line(args.output))
    return 0
