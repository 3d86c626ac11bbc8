"""``sptrace diff BASE NEW``: what a change did to communication, retained memory and time. Exit 0
no regression, 1 a regression (a new full-size save, more wire bytes, a slower step), 2 cannot
compare."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sptrace.cli.common import add_load_flags, load_options, log
from sptrace.vocab.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="what changed from one run to another (exit 1 on a regression)")
    p.add_argument("base", help="the baseline: a run directory or one trace file")
    p.add_argument("new", help="the run to compare with it")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                   help="text (the largest changes first), JSON, or Markdown (a pull-request comment)")  # fmt: skip
    p.add_argument("--bytes-tolerance", type=float, default=0.0, metavar="FRACTION",
                   help="more wire bytes a step than this fraction over the baseline is a regression "
                   "(default 0)")  # fmt: skip
    p.add_argument("--time-tolerance", type=float, default=0.05, metavar="FRACTION",
                   help="a step slower by more than this fraction (and outside both runs' spread across ranks) is a "
                   "regression (default 0.05)")  # fmt: skip
    p.add_argument("--output", help="write the report here (atomically) instead of stdout")
    add_load_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sptrace.analysis import analyse_run
    from sptrace.diff import diff_runs
    from sptrace.fileio import write_atomic
    from sptrace.report.diff import render_markdown, render_text
    from sptrace.vocab.errors import TraceError

    for name in ("bytes_tolerance", "time_tolerance"):
        if not getattr(args, name) >= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, not {getattr(args, name)}")
    for path in (args.base, args.new):
        if not Path(path).exists():
            raise TraceError(path, "no such file or directory")
    options = load_options(args)
    analyses = []
    for path in (args.base, args.new):
        a = analyse_run(path, parts=("collectives", "sharding"), load_options=options)
        for w in a.warnings:
            log(f"warning: {path}: {w}")
        analyses.append(a)
    d = diff_runs(*analyses, bytes_tolerance=args.bytes_tolerance, time_tolerance=args.time_tolerance)
    if args.format == "json":
        text = json.dumps(d.to_dict(), indent=1, default=str) + "\n"
    elif args.format == "markdown":
        text = render_markdown(d)
    else:
        text = render_text(d)
    if args.output:
        write_atomic(Path(args.output), text.encode())
        log(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return d.exit_code
