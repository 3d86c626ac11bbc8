"""``sptrace info``: ranks, world size, groups, events, and which analyses the traces allow."""

from __future__ import annotations

import argparse
import json
import warnings

from sptrace.cli.common import add_load_flags, load_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="what a run's traces hold and which analyses they allow")
    p.add_argument("path", help="a run directory (per-rank *.json / *.json.gz traces) or one trace file")
    p.add_argument("--format", choices=("text", "json"), default="text")
    add_load_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sptrace.load import describe, load_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # shown in the report instead
        run_ = load_run(args.path, **load_options(args))
    info = describe.describe_run(run_)
    print(json.dumps(info, indent=2) if args.format == "json" else describe.render_text(info))
    return 0
